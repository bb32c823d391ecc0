"""Hydra entrypoint: `python -m training.run [overrides]` runs one job; add `-m` for a multirun."""

from __future__ import annotations

import logging
import sys

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf

from training.preemption import stop_on_sigterm
from training.results import ConfigMismatchError
from training.tasks import get_task

log = logging.getLogger("training.run")


@hydra.main(config_path="../conf", config_name="config", version_base="1.3")
def main(cfg: DictConfig) -> float | None:
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    try:
        with stop_on_sigterm():  # SIGTERM (pre-emption, requeue): stop now, keep finished blocks (preemption.py)
            result = get_task(str(resolved.get("task", "mdl")))(resolved)
    except ConfigMismatchError as e:
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            raise  # one failed job: the multirun callback records it and the sweep goes on
        log.error("%s", e)
        sys.exit(2)
    mdl = result.get("mdl") or {}
    return mdl.get("bits_per_sample") if isinstance(mdl, dict) else None


if __name__ == "__main__":
    main()
