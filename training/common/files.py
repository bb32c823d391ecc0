"""Atomic text and JSON writes (fsynced, on `atomicio.atomic_write`: readers never see half a file) and a tolerant
JSON reader: the helpers every writer of the harness uses (the eraser library writes with the same `atomic_write`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from atomicio import atomic_write, default_mode, umask

__all__ = ["atomic_write", "atomic_write_json", "atomic_write_text", "default_mode", "read_json", "umask"]

log = logging.getLogger(__name__)


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
