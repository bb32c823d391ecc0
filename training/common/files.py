"""Atomic file writes (temp file in the same directory, fsync, rename: readers never see half a file) and a
tolerant JSON reader. The one helper every writer of the harness uses (training/, scripts/).

A written file has the mode a plain `open(path, "w")` would give it (0o666 less the umask), not mkstemp's 0o600:
with `umask 002` on a group-shared output directory, colleagues can read each other's results and cache entries.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """`write(tmp_path)` fills a temp file next to `path`, which then replaces `path` in one rename. A full disk
    (ENOSPC, EDQUOT) is raised as an OSError naming `path`, so that it reports as one line."""
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
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def atomic_write_text(path: Path, text: str) -> None:
    def write(tmp: str) -> None:
        with open(tmp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())

    atomic_write(path, write)


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=float) + "\n")


def read_json(path: Path) -> Any:
    """The parsed file, or None when it is absent or cannot be parsed (a corrupt file counts as absent). A file
    this process may not read is not corrupt: its PermissionError is raised, for the caller to name."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        log.warning("ignoring %s: it cannot be parsed (%s)", path, e)
        return None
