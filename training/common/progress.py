"""Progress that reads well where it ends up: a tqdm bar on a terminal; otherwise (a SLURM log, Hydra's job log, a CI
capture) a log line `desc: n/total unit (postfix)` at most every `ERASURE_MDL_PROGRESS_SECONDS` (default 60) and
once at the end. The eraser library, which draws nothing itself, gets it for a fit through
`erasure.progress.use(progress_bar)` (training/inputs/erase.py, plan.py).
"""

from __future__ import annotations

import logging
import sys
import time
from typing import Any

from tqdm.auto import tqdm

from erasure import progress as erasure_progress
from training.common import env

log = logging.getLogger("progress")


class LogProgress:
    """The tqdm calls the harness uses (update, set_postfix, close), as periodic log lines."""

    def __init__(self, total: int | None, desc: str, unit: str, interval: float) -> None:
        self.total, self.desc, self.unit, self.interval = total, desc, unit, interval
        self.n, self.postfix, self.t0 = 0, "", time.monotonic()
        self._last = self.t0

    def update(self, n: int = 1) -> None:
        self.n += n
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self._emit()

    def set_postfix(self, **kwargs: Any) -> None:
        self.postfix = ", ".join(f"{k}={v}" for k, v in kwargs.items())

    def close(self) -> None:
        if self.n and time.monotonic() - self.t0 >= self.interval:
            self._emit()

    def _emit(self) -> None:
        total = f"/{self.total}" if self.total is not None else ""
        post = f" ({self.postfix})" if self.postfix else ""
        log.info("%s: %d%s %s, %.0fs%s", self.desc, self.n, total, self.unit, time.monotonic() - self.t0, post)


def progress_bar(total: int | None = None, desc: str = "", unit: str = "it", leave: bool = False,
                 disable: bool = False) -> Any:
    """A tqdm bar on a terminal, periodic log lines otherwise, nothing when `disable`."""
    if disable:
        return erasure_progress.progress_bar(disable=True)  # the eraser library's silent bar
    if sys.stderr.isatty():
        return tqdm(total=total, desc=desc, unit=unit, leave=leave)
    return LogProgress(total, desc, unit, env.progress_seconds())
