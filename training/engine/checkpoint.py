"""Checkpoints inside a block: a training loop stopped by a signal saves its whole state here and the next attempt
goes on from it, with the numbers of an uninterrupted run.

One file per training group (`fit`: one model; a lockstep group: its members) in the job directory, named after its
member names (`checkpoint-<digest>.pt`), holding a SHA-256 of its payload and the job's config hash: an unreadable,
corrupt or other configuration's file is ignored with one log line. A group deletes its file when it finishes; the
job deletes what is left when it ends.
"""

from __future__ import annotations

import hashlib
import io
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from training.common.files import atomic_write

log = logging.getLogger(__name__)
FORMAT = 1
PATTERN = "checkpoint-*.pt"
ENVELOPE = ("format", "key", "names", "state")  # what a checkpoint file holds (after its digest line)


@dataclass(frozen=True)
class Saved:
    """A readable checkpoint of this configuration: the member names it holds, the kind of training loop that wrote
    it (`fit`: one model; `group`: a lockstep group) and that loop's state."""

    path: Path
    names: list[str]
    kind: str
    state: dict[str, Any]


@dataclass(frozen=True)
class CheckpointStore:
    """Where the groups of one job save their state (`directory`), and the config hash they must match (`key`)."""

    directory: Path
    key: str
    reported: set[str] = field(default_factory=set, compare=False)  # files already said to be ignored

    def path(self, names: Sequence[str]) -> Path:
        digest = hashlib.sha256("\n".join(names).encode()).hexdigest()[:12]
        return Path(self.directory) / f"checkpoint-{digest}.pt"

    def save(self, names: Sequence[str], state: dict[str, Any]) -> Path:
        """Write the group's `state` (a training loop's state dict: its `kind` and `step` included) atomically;
        returns its path."""
        buf = io.BytesIO()
        torch.save({"format": FORMAT, "key": self.key, "names": list(names), "state": state}, buf)
        payload = buf.getvalue()
        header = hashlib.sha256(payload).hexdigest().encode() + b"\n"
        path = self.path(names)

        def write(tmp: str) -> None:
            Path(tmp).write_bytes(header + payload)

        atomic_write(path, write)
        log.info("checkpoint of %d model(s) at step %s written to %s (%.1f MB)", len(names), state["step"], path,
                 len(payload) / 1e6)
        return path

    def saved(self) -> Iterator[Saved]:
        """Every readable checkpoint of this configuration. One log line for each other file (once per job), which
        is left alone."""
        for path in sorted(Path(self.directory).glob(PATTERN)):
            why, loaded = _read(path, self.key)
            if loaded is None:
                if str(path) not in self.reported:
                    self.reported.add(str(path))
                    log.warning("ignoring checkpoint %s: %s; its models start over", path, why)
                continue
            yield Saved(path, loaded["names"], loaded["state"]["kind"], loaded["state"])

    def in_group(self, name: str) -> bool:
        """Whether a lockstep group's checkpoint holds the model `name` (saved when it trained with others)."""
        return any(s.kind == "group" and name in s.names for s in self.saved())

    def unfit(self, names: Sequence[str]) -> None:
        """One line for each readable checkpoint of any of these models that was not restored (written by other
        code or with other `training.*` settings): they start over."""
        for s in self.saved():
            if set(s.names) & set(names) and str(s.path) not in self.reported:
                self.reported.add(str(s.path))
                log.warning("ignoring checkpoint %s: it does not fit these models (other code, engine or training "
                            "settings); they start over", s.path)

    def delete(self, *paths: Path | None) -> None:
        for path in paths:
            if path is not None:
                Path(path).unlink(missing_ok=True)

    def clear(self) -> None:
        for path in Path(self.directory).glob(PATTERN):
            path.unlink(missing_ok=True)


def fits_safely(fits: Callable[[Saved], bool], saved: Saved) -> bool:
    """`fits(saved)`: whether a saved state continues this training; False for content this code did not write (a
    missing key, another type)."""
    try:
        return bool(fits(saved))
    except (KeyError, TypeError, ValueError, AttributeError):
        return False


def _read(path: Path, key: str) -> tuple[str, dict[str, Any] | None]:
    """The file's content, or (why not, None)."""
    try:
        raw = path.read_bytes()
    except OSError as err:
        return f"unreadable ({err.strerror or err})", None
    digest, _, payload = raw.partition(b"\n")
    if hashlib.sha256(payload).hexdigest().encode() != digest:
        return "its hash does not match (a corrupt or truncated file)", None
    try:
        loaded = torch.load(io.BytesIO(payload), map_location="cpu", weights_only=True)
    except Exception as err:  # noqa: BLE001 - any unpickling error means "unusable", nothing more
        return f"unreadable ({type(err).__name__})", None
    if not isinstance(loaded, dict) or any(k not in loaded for k in ENVELOPE) or loaded["format"] != FORMAT \
            or not isinstance(loaded["state"], dict) or "kind" not in loaded["state"]:
        return "not a checkpoint of this version", None
    if loaded["key"] != key:
        return "another configuration's", None
    return "", loaded
