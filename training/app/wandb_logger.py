"""wandb logging: offline by default, one run per job with a deterministic id; `logger=none` disables."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.app.schema import LoggerConfig


class RunLogger:
    def __init__(self, cfg: LoggerConfig | None, run_cfg: Mapping[str, Any], job_dir: Path, run_id: str):
        self._run = None
        if cfg is None or cfg.name == "none" or os.environ.get("WANDB_MODE") == "disabled":
            return
        import wandb

        self._run = wandb.init(
            project=cfg.project,
            entity=cfg.entity,
            mode=os.environ.get("WANDB_MODE", cfg.mode),
            id=run_id,
            name=str(job_dir),
            dir=str(job_dir),
            config=dict(run_cfg),
            resume="allow",
            reinit=True,
        )

    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if self._run is not None:
            self._run.log(dict(metrics), step=step)

    def summary(self, metrics: Mapping[str, Any]) -> None:
        if self._run is not None:
            self._run.summary.update(dict(metrics))

    def finish(self) -> None:
        if self._run is not None:
            self._run.finish()
            self._run = None
