"""A stop request that a training loop answers with a checkpoint (training/engine/checkpoint.py).

The command line's signal handlers (training/cli/preemption.py) call `request(signum)` on SIGTERM or submitit's
time-limit signal. While a training loop runs (`checkpointing()`), the request is only recorded: the loop sees it at
its next step (`requested()`), writes its state and raises `Interrupted`, which the command line turns into the usual
exit (a requeue, exit 143). Outside a loop `request` returns False and the handler stops the job at once.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager

_requested = threading.Event()
_lock = threading.Lock()
_state = {"active": 0, "signum": 0}


class Interrupted(SystemExit):
    """A training loop saved its state after a stop request and stopped (exit status 128 + the signal). Not an
    `Exception`: nothing records the attempt as a failed job."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + int(signum))
        self.signum = signum


def request(signum: int) -> bool:
    """Ask the running training loops to checkpoint and stop; False (nothing recorded) when none runs."""
    with _lock:
        if not _state["active"]:
            return False
        _state["signum"] = int(signum)
        _requested.set()
        return True


def stop_behind(err: BaseException) -> None:
    """Raise the stop (a `SystemExit`: `Preempted`, `Interrupted`) or KeyboardInterrupt that `err` stands for, if any:
    torch.save turns a signal handler's exception raised during a write into `RuntimeError("unexpected pos ...")`,
    the stop only its context. Code that catches RuntimeError (a full disk) calls this first."""
    seen: set[int] = set()
    cause: BaseException | None = err
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, SystemExit | KeyboardInterrupt):
            raise cause
        cause = cause.__cause__ or cause.__context__


def requested() -> bool:
    """Whether a loop should checkpoint and stop now (its one check per step: no RNG, no sync)."""
    return _requested.is_set()


def signum() -> int:
    return int(_state["signum"])


def clear() -> None:
    _requested.clear()
    _state["signum"] = 0


@contextmanager
def checkpointing() -> Iterator[None]:
    """A training loop that answers `requested()` runs inside: a request then waits for it instead of stopping
    the job at once. Re-entrant and thread-safe (the worker threads of one group each enter it)."""
    with _lock:
        _state["active"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["active"] -= 1
