"""A file lock that says who holds it: waiting is logged (on what, held since when, by which process), so a job stuck
behind a hung process does not sit silently. The holder writes `<lock>.holder` (pid, host, since) beside the lock
and removes it on release. The lock is an OS lock (`flock` through `filelock`), released by the kernel when its
process dies: it is only "stale" while a hung holder still runs or on a network file system that keeps dead
clients' locks (stop that process, or delete the `.lock` file: docs/troubleshooting.md).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from training.common import env

log = logging.getLogger(__name__)


def holder_path(lock_path: Path) -> Path:
    return lock_path.with_name(lock_path.name + ".holder")


@dataclass(frozen=True)
class Holder:
    """The note the holder of a lock leaves beside it (`<lock>.holder`), so that the processes waiting name it.
    Written by another process (of any version): a key it lacks reads as unknown."""

    pid: Any = "?"
    host: Any = "?"
    since: Any = None  # time.time() when it took the lock

    @classmethod
    def mine(cls) -> Holder:
        return cls(os.getpid(), socket.gethostname(), time.time())

    @classmethod
    def read(cls, lock_path: Path) -> Holder | None:
        """The holder's note; None where there is none, or it is not a (non-empty) JSON object."""
        try:
            raw = json.loads(holder_path(lock_path).read_text())
        except (OSError, ValueError):
            return None
        if not isinstance(raw, dict) or not raw:
            return None
        return cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls) if f.name in raw})

    def describe(self) -> str:
        since = self.since
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(since)) if isinstance(since, int | float) else "?"
        return f"held since {when} by pid {self.pid} on {self.host}"


def describe_holder(lock_path: Path) -> str:
    holder = Holder.read(lock_path)
    return "holder unknown" if holder is None else holder.describe()


@contextmanager
def waiting_lock(lock_path: Path, what: str) -> Iterator[None]:
    """Hold the OS lock on `lock_path` for the block; while another process holds it, log that this one waits
    (at once, then every `env.lock_log_every()` seconds) naming `what`, the lock file and its holder."""
    lock_path, lock, t0 = Path(lock_path), FileLock(str(lock_path)), time.time()
    try:
        lock.acquire(timeout=0)
    except Timeout:
        while True:
            log.warning("waiting for %s: lock %s %s (waited %.0fs)", what, lock_path, describe_holder(lock_path),
                        time.time() - t0)
            with contextlib.suppress(Timeout):
                lock.acquire(timeout=env.lock_log_every())
                break
        log.info("got the lock on %s after %.1fs", what, time.time() - t0)
    try:
        with contextlib.suppress(OSError):  # the holder note only helps waiting processes name us
            holder_path(lock_path).write_text(json.dumps(dataclasses.asdict(Holder.mine())))
        yield
    finally:
        with contextlib.suppress(OSError):
            holder_path(lock_path).unlink(missing_ok=True)
        lock.release()
