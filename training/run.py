"""Hydra entrypoint: `python -m training.run [overrides]` runs one job; add `-m` for a multirun."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from training.app.results import ConfigMismatchError
from training.app.schema import ConfigError, load_config
from training.app.tasks import get_task

log = logging.getLogger("training.run")


def _remove_fresh_run_dir(run_dir: Path) -> None:
    """Hydra made the run directory (and its log) before the config was checked: remove it and the empty parents
    it made, unless it holds anything but logs (then it is an existing job's directory)."""
    try:
        if not run_dir.is_dir() or not all(p.is_file() and p.suffix == ".log" for p in run_dir.iterdir()):
            return
        for p in run_dir.iterdir():
            p.unlink()
        while run_dir.name != "runs" and not any(run_dir.iterdir()):
            run_dir.rmdir()
            run_dir = run_dir.parent
    except OSError:
        pass


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    try:
        job = load_config(resolved)
        result = get_task(job.task)(job)
    except (ConfigError, ConfigMismatchError) as e:
        if multirun:
            raise  # one failed job: the multirun callback records it and the sweep goes on
        if isinstance(e, ConfigError):
            _remove_fresh_run_dir(Path(HydraConfig.get().runtime.output_dir))
        log.error("%s", e)
        sys.exit(2)
    mdl = result.get("mdl") or {}
    return mdl.get("bits_per_sample") if isinstance(mdl, dict) else None


if __name__ == "__main__":
    main()
