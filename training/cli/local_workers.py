"""Ctrl-C to a `hydra/launcher=submitit_local` sweep: the terminal sends SIGINT to every process of the foreground
group, so each of submitit's controller processes (`python -m submitit.local._local`, one per job) died with a
KeyboardInterrupt traceback on the terminal. The sweep's launching process stops its workers itself (SIGTERM, then
SIGKILL: training/cli/preemption.py `stop_workers_on_signal`), so the controllers are started with SIGINT ignored
(inherited across exec; Python keeps an ignored SIGINT ignored). A job below a controller takes SIGINT back
(`sigint_back_in_local_job`): submitit's own timeout path interrupts its jobs with SIGINT.
"""

from __future__ import annotations

import functools
import signal
import threading
from collections.abc import Callable
from typing import Any

from training.common import env


def controllers_ignore_sigint() -> Callable[[], None]:
    """Start submitit's local controllers with SIGINT ignored while a sweep runs; returns the undo."""
    try:
        from submitit.local import local as submitit_local
    except ImportError:
        return lambda: None
    original = submitit_local.start_controller

    @functools.wraps(original)
    def start_controller(*args: Any, **kwargs: Any) -> Any:
        if threading.current_thread() is not threading.main_thread():
            return original(*args, **kwargs)
        previous = signal.signal(signal.SIGINT, signal.SIG_IGN)  # the child inherits SIG_IGN
        try:
            return original(*args, **kwargs)
        finally:
            signal.signal(signal.SIGINT, previous)

    submitit_local.start_controller = start_controller

    def restore() -> None:
        submitit_local.start_controller = original

    return restore


def sigint_back_in_local_job() -> None:
    """In a job of a submitit_local sweep (its controller ignores SIGINT, and so did this process from birth):
    Ctrl-C and submitit's timeout interrupt it again."""
    if (env.submitit_executor() == "local" and threading.current_thread() is threading.main_thread()
            and signal.getsignal(signal.SIGINT) == signal.SIG_IGN):
        signal.signal(signal.SIGINT, signal.default_int_handler)
