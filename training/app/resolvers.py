"""OmegaConf resolvers used by conf/ (registered when the `training` package is imported), and `resolved_dict`:
a composed config node as the plain dict the typed config is loaded from."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from training.app.schema import NON_CONFIG_KEYS
from training.app.tasks import job_cell_hash
from training.common.conf import resolved_dict as resolved_dict  # callers import it from here


def _suffix(value: object, sep: str = "_") -> str:
    """`${suffix:${.size}}` -> "_atto" for a named size, "" when unset (keeps job dirs distinct per size)."""
    return "" if value in (None, "", "None", "null") else f"{sep}{value}"


def _eraser_family(name: str) -> str:
    """`${eraser_family:${eraser.name}}`: control | linear | quadratic, from the eraser's registry entry."""
    from erasure.registry import ERASERS

    if str(name) not in ERASERS:  # composes, so that the job's config check refuses the name in one line (it would
        return "control"  # otherwise fail inside Hydra's interpolation, hundreds of lines)
    return str(ERASERS.meta(str(name))["family"])


def _cell_hash(*, _root_: DictConfig) -> str:
    """`${cell_hash:}`: 8 hex digits of the job's semantic config without the seed (training/app/schema.py)."""
    plain: dict[str, Any] = {}
    for key in _root_:
        if key in NON_CONFIG_KEYS or key == "paths":
            continue
        node = _root_[key]
        plain[str(key)] = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    return job_cell_hash(plain)  # the edge: the config's task named by its `task` key


def register() -> None:
    for name, fn in (("suffix", _suffix), ("eraser_family", _eraser_family), ("cell_hash", _cell_hash)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
