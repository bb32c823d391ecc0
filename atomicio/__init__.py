"""Atomic file writes, the one implementation under both the eraser library (erasure/) and the harness
(training/common/files.py): a temp file in the same directory, filled, then one rename, so a reader never sees half a
file. Standard library only. A written file has the mode `open(path, "w")` would give it (0o666 less the umask), not
mkstemp's 0o600: with `umask 002` on a group-shared output directory, colleagues can read each other's results.
"""

from __future__ import annotations

import contextlib
import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def atomic_write(path: str | os.PathLike[str], write: Callable[[str], None]) -> None:
    """`write(tmp_path)` fills a temp file next to `path`, which then replaces `path` in one rename (the parent
    directory is made if missing). A full disk (ENOSPC, EDQUOT) is raised as an OSError naming `path`, so that it
    reports as one line."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            os.fchmod(fd, default_mode())  # mkstemp creates 0o600 whatever the umask
        finally:
            os.close(fd)
        write(tmp)
        os.replace(tmp, path)
    except OSError as err:
        if err.errno in (errno.ENOSPC, errno.EDQUOT) and err.filename != str(path):
            # f.write/fsync name no file, mkstemp the temp file: the user needs the file this was for
            raise OSError(err.errno, os.strerror(err.errno), str(path)) from err
        raise
    finally:
        if tmp is not None and os.path.exists(tmp):
            os.unlink(tmp)


def default_mode() -> int:
    """The mode a new file gets from `open(path, "w")`: 0o666 less the process's umask."""
    return 0o666 & ~umask()


def umask() -> int:
    """The process's umask, read without changing it where Linux shows it (/proc/self/status); elsewhere by setting
    it and straight back (a moment in which another thread's new file would get 0o022)."""
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/self/status") as f:
        for line in f:
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
