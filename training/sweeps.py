"""Expand an experiment preset's `hydra.sweeper.params` into the job configs it will run."""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

CONF_DIR = Path(__file__).resolve().parents[1] / "conf"


def sweep_overrides(experiment: str, extra: Sequence[str] = ()) -> list[list[str]]:
    """The cartesian product of the preset's sweeper params (plus `extra` overrides), as override lists."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"experiment={experiment}", *extra], return_hydra_config=True)
    params = OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=False) or {}
    parser = OverridesParser.create()
    axes: list[list[str]] = []
    for key, value in params.items():
        ov = parser.parse_overrides([f"{key}={value}"])[0]
        values = list(ov.sweep_string_iterator()) if ov.is_sweep_override() else [ov.get_value_element_as_str()]
        axes.append([f"{key}={v}" for v in values])
    return [list(combo) for combo in itertools.product(*axes)]


def expand(experiment: str, extra: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Resolved job configs (plain dicts) of every job in the experiment's sweep."""
    jobs = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for combo in sweep_overrides(experiment, extra):
            cfg = compose("config", overrides=[f"experiment={experiment}", *extra, *combo])
            resolved = OmegaConf.to_container(cfg, resolve=True)
            assert isinstance(resolved, dict)
            jobs.append(resolved)
    return jobs
