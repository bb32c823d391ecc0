"""Ctrl-C to a `hydra/launcher=submitit_local` sweep: the terminal sends SIGINT to every process of the foreground
group, so each of submitit's controller processes (`python -m submitit.local._local`, one per job) died with a
KeyboardInterrupt traceback on the terminal. The sweep's launching process stops its workers itself (SIGTERM, then
SIGKILL: training/cli/preemption.py `stop_workers_on_signal`), so the controllers are started with SIGINT ignored
(inherited across exec; Python keeps an ignored SIGINT ignored). A job below a controller takes SIGINT back
(`sigint_back_in_local_job`): submitit's own timeout path interrupts its jobs with SIGINT.

A joblib (loky) worker whose sweep's launching process was killed (SIGKILL: nothing could stop its workers) stops
as on SIGTERM (a checkpoint) and exits (`exit_with_parent`), instead of finishing its jobs for nobody and idling for
minutes.
"""

from __future__ import annotations

import functools
import os
import signal
import sys
import threading
import time
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


PARENT_POLL_S = 1.0  # how often a worker checks that its sweep's launching process still runs
PARENT_GRACE_S = 60.0  # for the job's checkpoint once that process died; then the worker exits regardless
_watching = threading.Event()
_orphaned = threading.Event()


def exit_with_parent() -> None:
    """In a worker process whose parent is the sweep's launching process (env.sweep_parent, set by the ledger for
    launchers that run jobs in workers): when that parent dies, SIGTERM this process (the running job checkpoints
    and stops, training/cli/preemption.py; between jobs, the worker ends) and exit after PARENT_GRACE_S at most.
    No-op elsewhere (a lone job, the launching process itself, a SLURM job); started once per process."""
    parent = env.sweep_parent()
    if parent is None or os.getppid() != parent or os.getpid() == parent or _watching.is_set():
        return
    _watching.set()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        _orphaned.set()
        print(f"the sweep's launching process (pid {parent}) is gone: worker {os.getpid()} stops its job (its "
              "finished blocks and checkpoint are kept; rerun the sweep to go on) and exits", file=sys.stderr,
              flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(PARENT_GRACE_S)
        os._exit(128 + int(signal.SIGTERM))

    threading.Thread(target=watch, name="exit-with-parent", daemon=True).start()


def orphaned() -> bool:
    """Whether this worker's sweep's launching process died (it then exits after its job)."""
    return _orphaned.is_set()
