"""Every option of every config group composes and resolves (Hydra compose API)."""

from __future__ import annotations

from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

CONF = Path(__file__).resolve().parents[1] / "conf"
GROUPS = ["dataset", "eraser", "arch", "optim", "mdl", "logger", "paths", "regularizer", "experiment"]


def _options(group: str) -> list[str]:
    return sorted(p.stem for p in (CONF / group).glob("*.yaml"))


@pytest.mark.parametrize("group,option", [(g, o) for g in GROUPS for o in _options(g)])
def test_option_composes_and_resolves(group: str, option: str) -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"{group}={option}"])
        resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    assert resolved["paths"]["job_dir"].startswith(resolved["paths"]["out_dir"])
    for key in ("seed", "dataset", "eraser", "arch", "optim", "mdl"):
        assert key in resolved
    assert "width" in resolved["arch"] and "depth" in resolved["arch"]


def test_job_dir_is_a_function_of_the_config() -> None:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=["dataset=mnist5k", "arch.width=256", "arch.depth=3", "seed=4"])
    assert cfg.paths.job_dir == f"outputs/runs/mnist5k/control/{cfg.arch.tag}-w256-d3/{cfg.paths.cell}/seed4"
    assert cfg.paths.legacy_job_dir == f"outputs/runs/mnist5k/control/{cfg.arch.tag}-w256-d3/seed4"
    from hydra.errors import MissingConfigException

    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):  # an unknown choice: a clear error
        with pytest.raises(MissingConfigException, match="dataset"):
            compose("config", overrides=["dataset=imagenet"])
