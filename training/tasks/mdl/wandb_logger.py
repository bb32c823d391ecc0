"""wandb logging: offline by default, one run per job with a deterministic id; `logger=none` disables.

wandb keeps more than the run: debug logs of its service (`~/.cache/wandb/logs`), an artifact cache and staging
area, settings. While a run is open they go under `paths.out_dir` (`<out_dir>/_wandb/`), so nothing lands outside
it: WANDB_CACHE_DIR and WANDB_DATA_DIR, and WANDB_CONFIG_DIR unless the run is online (an online run keeps the
user's settings, e.g. a self-hosted base_url). A variable the user set is left alone.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from training.app.schema import LoggerConfig
from training.common import env


class RunLogger:
    def __init__(self, cfg: LoggerConfig | None, run_cfg: Mapping[str, Any], job_dir: Path, run_id: str,
                 out_dir: Path | None = None):
        """`out_dir`: where wandb's own files go (`<out_dir>/_wandb/`; default `job_dir`)."""
        self._run = None
        self._restore_env: Callable[[], None] = lambda: None
        if cfg is None or cfg.name == "none" or env.wandb_mode() == "disabled":
            return
        import wandb

        mode = env.wandb_mode()
        mode = cfg.mode if mode is None else mode
        root = Path(job_dir if out_dir is None else out_dir).absolute() / "_wandb"  # not .wandb: wandb's runs go there
        names = {"WANDB_CACHE_DIR": "cache", "WANDB_DATA_DIR": "data", **({} if mode == "online" else
                                                                         {"WANDB_CONFIG_DIR": "config"})}
        dirs = env.unset({var: str(root / sub) for var, sub in names.items()})  # those the user has not set
        for path in dirs.values():
            Path(path).mkdir(parents=True, exist_ok=True)
        self._restore_env = env.setting(dirs)
        try:
            # WANDB_MODE may be a legacy name (dryrun, run): wandb checks it
            self._run = wandb.init(project=cfg.project, entity=cfg.entity, mode=mode,  # type: ignore[arg-type]
                                   id=run_id, name=str(job_dir), dir=str(job_dir), config=dict(run_cfg),
                                   resume="allow", reinit=True)
        except BaseException:
            self._put_env_back()
            raise

    def log(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        if self._run is not None:
            self._run.log(dict(metrics), step=step)

    def summary(self, metrics: Mapping[str, Any]) -> None:
        if self._run is not None:
            self._run.summary.update(dict(metrics))

    def finish(self) -> None:
        if self._run is not None:
            try:
                self._run.finish()
            finally:
                self._run = None
                self._put_env_back()

    def _put_env_back(self) -> None:
        self._restore_env()
        self._restore_env = lambda: None
