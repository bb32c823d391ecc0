"""A job told to stop (SIGTERM) stops at once and keeps what is finished; a requeued copy or a rerun resumes.

Who sends what, and what the job does:

* SLURM pre-emption, `scontrol requeue`, `scancel`, the hard time limit, a node going down: SIGTERM to every
  process of the job, SIGKILL `KillWait` (30 s by default) later. SLURM has already decided the job's fate
  (requeued, cancelled, timed out); the job only has to get out of the allocation quickly and keep its work.
  It does **not** requeue itself: the same SIGTERM means "cancelled" after `scancel`.
* The time limit, `signal_delay_s` before it: submitit's USR2 (`hydra.launcher.signal_delay_s`). submitit
  re-dumps the job, requeues it itself (`scontrol requeue`, at most `max_num_timeout` times) and exits; the
  SIGTERM of that requeue then finds the job already stopping.
* A local run or multirun: SIGTERM (kill, a supervisor) likewise stops it; rerunning the command resumes.

How it stops: the SIGTERM handler raises `Preempted` (a `SystemExit` with status 143 = 128 + SIGTERM) in the
main thread, wherever it is. CPU worker threads stop at their next step (training/engine/group.py stops its
workers when the main thread's wait is interrupted). `progress.json` already holds every finished MDL block
(written atomically after each one), so the next attempt resumes after the last of them; a half-trained block
model is retrained from its start with its own (seed, block) generators, so the numbers equal an uninterrupted
run. `Preempted` is not an `Exception`: Hydra does not record the attempt as a failed job and submitit writes no
result for it, so the submitting command keeps waiting for the requeued copy.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

log = logging.getLogger(__name__)
EXIT_STATUS = 128 + int(signal.SIGTERM)

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

_stopping = threading.Event()


class Preempted(SystemExit):
    """The job was told to stop (SIGTERM); what it finished is saved."""

    def __init__(self, signum: int) -> None:
        super().__init__(EXIT_STATUS)
        self.signum = signum


def stopping() -> bool:
    """True once a stop signal has arrived (for loops that want to check)."""
    return _stopping.is_set()


def _submitit_signal() -> signal.Signals | None:
    """The signal submitit uses for time limits (USR2 unless SUBMITIT_PREEMPT_SIGNAL), when in a submitit job."""
    if not os.environ.get("SUBMITIT_EXECUTOR"):
        return None
    return getattr(signal, "SIG" + os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2"), None)


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Inside: SIGTERM raises `Preempted`; submitit's time-limit signal marks the job as stopping before
    submitit's own handler requeues it. The previous handlers are back on exit. No-op outside the main thread
    (signal handlers can only be set there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Handler] = {signal.SIGTERM: signal.getsignal(signal.SIGTERM)}
    usr = _submitit_signal()
    if usr is not None and callable(submitit_handler := signal.getsignal(usr)):
        previous[usr] = submitit_handler

        def on_time_limit(signum: int, frame: FrameType | None) -> None:
            _stopping.set()  # the SIGTERM of submitit's `scontrol requeue` must not interrupt its handler
            log.warning("%s: near the time limit; submitit requeues the job, which resumes after its last finished "
                        "block", signal.Signals(signum).name)
            submitit_handler(signum, frame)

        signal.signal(usr, on_time_limit)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if _stopping.is_set():
            log.info("SIGTERM: already stopping")
            return
        _stopping.set()
        log.warning("SIGTERM (pre-emption, requeue, scancel or time limit): stopping now; finished MDL blocks are "
                    "in progress.json and a requeued job or a rerun resumes after them")
        raise Preempted(signum)

    _stopping.clear()
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
