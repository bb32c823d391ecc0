"""Atomic file writes (temp file in the same directory, fsync, rename: readers never see half a file) and a
tolerant JSON reader. The one helper every writer of the harness uses (training/, scripts/)."""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)


def atomic_write(path: Path, write: Callable[[str], None]) -> None:
    """`write(tmp_path)` fills a temp file next to `path`, which then replaces `path` in one rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


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
    """The parsed file, or None when it is absent or unreadable (a corrupt file counts as absent)."""
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        log.warning("ignoring unreadable %s (%s)", path, e)
        return None
