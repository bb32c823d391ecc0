"""A sweep's resolved job configs without one Hydra composition per job: what `make plan` reads.

Hydra composes a job in two stages: group choices (`eraser=leace`, `+experiment/net=lenet`, `hydra/...`) pick the
defaults list, composed into one config; then the value overrides (`seed=3`, `arch.width=256`) are applied to it.
`fast_expand` composes once per distinct tuple of group choices and applies the value overrides itself, with Hydra's
function (hydra_private.apply_value_overrides) on a copy of that (unresolved) config, so interpolations over swept
keys resolve per job exactly as in a full compose (tests/test_plan.py checks every preset).
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from hydra import compose
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.core.override_parser.types import Override
from omegaconf import DictConfig
from omegaconf import base as omegaconf_base

from training.common.cells import seed_configs
from training.common.hydra_private import apply_value_overrides, is_config_group
from training.common.sweeps import composing, sweep_overrides


class _Parsed:
    """Each distinct override string parsed once, and classified as Hydra classifies it: a value override is applied
    to the composed config; anything else (a config group choice, a `hydra...` key) decides the composition."""

    def __init__(self) -> None:
        self.parser = OverridesParser.create()
        self.seen: dict[str, tuple[Override, bool]] = {}
        self.is_group = is_config_group()

    def __call__(self, line: str) -> tuple[Override, bool]:
        if line not in self.seen:
            (ov,) = self.parser.parse_overrides([line])
            key = ov.key_or_group
            value = ov.value()
            is_value = (isinstance(value, dict) or not self.is_group(key)) and not (
                key == "hydra" or key.startswith(("hydra.", "hydra/")) or ov.package is not None)
            self.seen[line] = (ov, is_value)
        return self.seen[line]


@contextmanager
def _parse_once() -> Iterator[None]:
    """While the sweep expands, each interpolation string is parsed once: OmegaConf parses one with its ANTLR grammar
    every time it resolves it (half the cost of resolving a job), and a sweep's jobs share a few dozen."""
    original = omegaconf_base.parse
    omegaconf_base.parse = functools.lru_cache(maxsize=4096)(original)
    try:
        yield
    finally:
        omegaconf_base.parse = original


def fast_expand(experiment: str, extra: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Resolved job configs of every seed of every cell of `python -m training.run -m experiment=<experiment> <extra>`,
    in launch order: == `sweeps.expand(experiment, extra)`, at one composition per distinct tuple of group choices."""
    return expand_overrides(sweep_overrides(experiment, extra))


def expand_overrides(combos: Sequence[Sequence[str]]) -> list[dict[str, Any]]:
    """The resolved job config of every seed of each override list's cell (one Hydra job's overrides, as
    `sweeps.sweep_overrides` gives them), in order: a cell's seeds next to each other."""
    return [cfg for cell in expand_cells(combos) for cfg in cell]


def expand_cells(combos: Sequence[Sequence[str]]) -> list[list[dict[str, Any]]]:
    """Per override list (one Hydra job: a cell), the resolved job config of each of its seeds."""
    with _parse_once(), composing():
        return _expand(combos)


def _expand(combos: Sequence[Sequence[str]]) -> list[list[dict[str, Any]]]:
    parsed = _Parsed()
    composed: dict[tuple[str, ...], DictConfig] = {}
    jobs = []
    for combo in combos:
        kinds = [(line, *parsed(line)) for line in combo]
        choices = tuple(line for line, _, is_value in kinds if not is_value)
        if choices not in composed:
            composed[choices] = compose("config", overrides=list(choices))
        cfg = copy.deepcopy(composed[choices])  # the composed config is shared: each job changes a copy
        apply_value_overrides([ov for _, ov, is_value in kinds if is_value], cfg)
        jobs.append(seed_configs(cfg))  # each seed of the job's cell
    return jobs
