"""A job told to stop (SIGTERM) stops at once and keeps what is finished; a requeued copy or a rerun resumes
(docs/launchers-slurm.md, time limits and pre-emption).

* SIGTERM (SLURM pre-emption, `scontrol requeue`, `scancel`, the hard time limit, a node going down; locally a kill
  or a supervisor): SIGKILL follows `KillWait` (30 s) later and SLURM has already decided the job's fate, so the job
  only gets out quickly, keeping its work. It does **not** requeue itself: after `scancel` the same SIGTERM means
  "cancelled".
* submitit's USR2 (`hydra.launcher.signal_delay_s` before the time limit): submitit re-dumps the job, requeues it
  itself (at most `max_num_timeout` times) and exits; the SIGTERM of that requeue finds the job already stopping.
* A sweep's launching process whose jobs run in worker processes (`hydra/launcher=parallel|joblib`: loky workers;
  `submitit_local`: one subprocess per job): SIGTERM or SIGINT to it alone would leave its workers running, holding
  their jobs' locks. `stop_workers_on_signal` sends SIGTERM to every process below it (a worker inside a job stops
  as above), SIGKILL a few seconds later to what is left (an idle loky worker survives a job's `Preempted`), prints
  the multirun's summary and exits 143 (SIGTERM) or 130 (SIGINT); the kernel releases the workers' locks.

While models train (training/common/interrupt.py `checkpointing`) the signal is a request: at their next step they
write their whole state to a checkpoint in the job directory (training/engine/checkpoint.py) and raise
`Interrupted`, then the job exits as below, and the next attempt goes on from that step (a block longer than one
attempt still finishes, with the numbers of an uninterrupted run). Elsewhere (loading, erasing) the SIGTERM handler
raises `Preempted` (a `SystemExit`, status 143 = 128 + SIGTERM) in the main thread at once, and submitit's handler
runs at once; progress.json holds every finished MDL block. `Preempted` is not an `Exception`: Hydra does not record
the attempt as a failed job and submitit writes no result, so the submitting command waits for the requeued copy.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from types import FrameType
from typing import Any

from training.common import env, interrupt

log = logging.getLogger(__name__)
EXIT_STATUS = 128 + int(signal.SIGTERM)

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

_stopping = threading.Event()


class Preempted(SystemExit):
    """The job (or sweep) was told to stop (SIGTERM, or SIGINT to a sweep's launching process); what it finished
    is saved. Exit status 128 + the signal: 143 for SIGTERM, 130 for SIGINT."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + int(signum))
        self.signum = signum


def _submitit_signal() -> signal.Signals | None:
    """The signal submitit uses for time limits (USR2 unless SUBMITIT_PREEMPT_SIGNAL), when in a submitit job."""
    return None if env.submitit_executor() is None else getattr(signal, "SIG" + env.submitit_preempt_signal(), None)


def ignore_time_limit_signal() -> None:
    """Once a submitit job's work is done, its time-limit signal is ignored from here on. Arriving while the process
    exits (after Python has put back the default handlers) it would kill the process by that signal (USR2: exit 12)
    and SLURM would record the finished job as FAILED. No-op outside a submitit job or the main thread."""
    if (usr := _submitit_signal()) is not None and threading.current_thread() is threading.main_thread():
        signal.signal(usr, signal.SIG_IGN)


@contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Inside: SIGTERM raises `Preempted`; submitit's time-limit signal marks the job as stopping before
    submitit's own handler requeues it. The previous handlers are back on exit. No-op outside the main thread
    (signal handlers can only be set there)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Handler] = {signal.SIGTERM: signal.getsignal(signal.SIGTERM)}
    deferred: dict[int, Callable[[int, FrameType | None], Any]] = {}
    if (usr := _submitit_signal()) is not None and callable(submitit_handler := signal.getsignal(usr)):
        previous[usr] = submitit_handler

        def on_time_limit(signum: int, frame: FrameType | None) -> None:
            _stopping.set()  # the SIGTERM of submitit's `scontrol requeue` must not interrupt its handler
            if interrupt.request(signum):
                deferred[signum] = submitit_handler  # run once the models in training have saved a checkpoint
                log.warning("%s: near the time limit; the models in training save a checkpoint at their next step, "
                            "then submitit requeues the job, which goes on from it", signal.Signals(signum).name)
                return
            log.warning("%s: near the time limit; submitit requeues the job, which resumes after its last finished "
                        "block", signal.Signals(signum).name)
            submitit_handler(signum, frame)

        signal.signal(usr, on_time_limit)

    def on_sigterm(signum: int, frame: FrameType | None) -> None:
        if _stopping.is_set():
            log.info("SIGTERM: already stopping")
            return
        _stopping.set()
        if interrupt.request(signum):
            log.warning("SIGTERM (pre-emption, requeue, scancel or time limit): stopping now, after a checkpoint of "
                        "the models in training at their next step; a requeued job or a rerun goes on from it")
            return
        log.warning("SIGTERM (pre-emption, requeue, scancel or time limit): stopping now; finished MDL blocks are "
                    "in progress.json and a requeued job or a rerun resumes after them")
        raise Preempted(signum)

    _stopping.clear()
    interrupt.clear()
    signal.signal(signal.SIGTERM, on_sigterm)
    try:
        yield
    except interrupt.Interrupted as stop:  # the models in training saved a checkpoint on a request made here
        if (handler := deferred.pop(stop.signum, None)) is not None:
            handler(stop.signum, None)  # submitit's: requeue and exit
        raise Preempted(stop.signum) from None
    finally:
        interrupt.clear()
        for signum, old in previous.items():
            signal.signal(signum, old)


WORKER_LAUNCHERS = ("JoblibLauncher", "submitit_launcher.LocalLauncher")  # run jobs in processes below this one
TERM_GRACE_S = 3.0  # between SIGTERM and SIGKILL to the workers
KILL_WAIT_S = 5.0


def runs_jobs_in_workers(launcher_target: str) -> bool:
    return any(name in launcher_target for name in WORKER_LAUNCHERS)


def stop_workers_on_signal() -> Callable[[], None]:
    """In a sweep's launching process: SIGTERM or SIGINT stops every process below it, then raises `Preempted`
    (module docstring). Returns the function that puts the previous handlers back; a no-op outside the main
    thread."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    signums = (signal.SIGTERM, signal.SIGINT)
    previous: dict[int, Handler] = {s: signal.getsignal(s) for s in signums}

    def on_signal(signum: int, frame: FrameType | None) -> None:
        if _stopping.is_set():
            return  # already stopping the workers (a second Ctrl-C, the supervisor's repeat)
        _stopping.set()
        pids = workers(os.getpid())
        log.warning("%s: stopping this sweep and its %d worker processes; finished MDL blocks are in progress.json: "
                    "rerun the command to resume", signal.Signals(signum).name, len(pids))
        stop_processes(pids)
        raise Preempted(signum)

    _stopping.clear()
    for s in signums:
        signal.signal(s, on_signal)

    def restore() -> None:
        for s, handler in previous.items():
            signal.signal(s, handler)

    return restore


def stop_processes(pids: list[int], grace: float = TERM_GRACE_S, wait: float = KILL_WAIT_S) -> list[int]:
    """SIGTERM to `pids`, SIGKILL after `grace` seconds to those left and to whatever runs below this process by
    then (a worker started meanwhile); returns the pids still alive after `wait` more seconds (none, normally)."""
    _send(pids, signal.SIGTERM)
    left = _wait_gone(pids, grace)
    deadline = time.monotonic() + wait
    while True:
        left = sorted(set(_alive(left)) | set(workers(os.getpid())))
        if not left or time.monotonic() > deadline:
            return left
        _send(left, signal.SIGKILL)
        left = _wait_gone(left, 0.5)


def _send(pids: list[int], signum: int) -> None:
    for pid in pids:
        with suppress(ProcessLookupError, PermissionError):
            os.kill(pid, signum)


def _alive(pids: list[int]) -> list[int]:
    """The pids that still run (a zombie, waiting for its parent to reap it, no longer does)."""
    out = []
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()[0]
        except (OSError, IndexError):
            try:
                os.kill(pid, 0)  # no /proc (not Linux): the pid exists
            except (ProcessLookupError, PermissionError):
                continue
            state = "R"
        if state not in ("Z", "X"):
            out.append(pid)
    return out


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    left = _alive(pids)
    while left and time.monotonic() < deadline:
        time.sleep(0.05)
        left = _alive(left)
    return left


def workers(root: int) -> list[int]:
    """The processes below `root` that run jobs: all but loky's resource tracker, which cleans up after the workers
    and exits with `root` (stopped first, it reports the workers' shared memory as unknown, in tracebacks)."""
    out = []
    for pid in descendants(root):
        with suppress(OSError):
            if b"resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes():
                continue
        out.append(pid)
    return out


def descendants(root: int) -> list[int]:
    """Every live process below `root` (children, their children, ...), from /proc; [] where there is none."""
    children: defaultdict[int, list[int]] = defaultdict(list)  # pid -> its children (none: [])
    try:
        entries = os.listdir("/proc")
    except OSError:
        return []
    for name in entries:
        if not name.isdigit():
            continue
        try:
            fields = Path(f"/proc/{name}/stat").read_text().rpartition(")")[2].split()
            children[int(fields[1])].append(int(name))
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [root]
    while todo:
        for child in children[todo.pop()]:
            out.append(child)
            todo.append(child)
    return _alive(out)
