"""What a job's result.json holds, as frozen dataclasses: one envelope every task shares (`Result`) around the task's
sections (`Result.body`), typed by the task's own `Sections` class (`MdlSections` in training/tasks/mdl/result.py,
`StarvationSections` in training/tasks/gs/result.py): what its body returns and what its tables read.

Reading and writing go through training/app/result_codec.py; nothing else walks a result's dict. Open-ended parts
stay mappings where their keys are data, not schema (an eraser's report, the certificate's scores, the stored
config). The task's sections are kept as written (`Sections.written`), so `encode` writes back exactly what the job
wrote: result.json does not depend on this module.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

# 1: results written before the field existed (schema_version absent). 2: schema_version recorded.
RESULT_SCHEMA = 2
# Keys of every result, written by the job lifecycle (training/app/lifecycle.py) around the task's sections.
HEAD_KEYS = ("config_hash", "hash_version", "numerics_version", "schema_version", "job_dir", "task", "config")
TAIL_KEYS = ("device", "timings", "provenance")
ENVELOPE_KEYS = (*HEAD_KEYS, *TAIL_KEYS)


def number(value: Any) -> float | None:
    """A JSON number as a float (None for anything else, booleans included)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def mapping(value: Any) -> Mapping[str, Any]:
    """A section that should be an object: itself, or {} where it is absent or of another type."""
    return value if isinstance(value, Mapping) else {}


def at(value: Any, *path: str, default: Any = None) -> Any:
    """The value at a key path of parsed JSON (`at(result, "provenance", "code", "commit")`), or `default` where a
    step is absent or not an object: how this module and the codec read result.json's optional keys."""
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return default
        value = value[key]
    return value


def text(value: Any) -> str | None:
    return value if isinstance(value, str) else None


@dataclass(frozen=True)
class Fingerprint:
    """The identity of the data a job read (`dataset.fingerprint`): the loaded arrays' content hash and the files
    read (each a mapping with name, size, sha256)."""

    content: str | None
    files: tuple[Mapping[str, Any], ...] | None
    raw: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, value: Any) -> Fingerprint | None:
        if value is None:
            return None
        if not isinstance(value, Mapping):
            return cls(None, None, value)
        files = at(value, "files")
        listed = tuple(f for f in files if isinstance(f, Mapping)) if isinstance(files, list) else None
        return cls(text(at(value, "content")), listed, value)

    def identity(self) -> Any:
        """What identifies the data: the content hash of the decoded arrays where recorded (a re-gzipped file is the
        same data), else the files' sha256 and sizes (not their names or folder)."""
        if self.raw is not None and not isinstance(self.raw, Mapping):
            return self.raw
        if self.content is not None:
            return self.content
        records = sorted((str(at(f, "sha256")), at(f, "size")) for f in self.files) if self.files is not None \
            else at(self.raw, "files")
        return self.content, records

    def short(self) -> str:
        return f"content {self.content}" if self.content is not None else str(self.raw)[:40]


@dataclass(frozen=True)
class DatasetInfo:
    """result.json `dataset`: what the job read."""

    n: int | None
    num_classes: int | None
    class_counts: tuple[float, ...] | None  # None: not recorded (or not a list of non-negative numbers)
    permuted_labels: bool
    fingerprint: Fingerprint | None  # None: written before fingerprints

    @classmethod
    def of(cls, value: Any) -> DatasetInfo:
        counts = at(value, "class_counts")
        parsed = tuple(number(c) for c in counts) if isinstance(counts, list) and counts else None
        valid = parsed is not None and all(c is not None and c >= 0 for c in parsed)
        n, k = number(at(value, "n")), number(at(value, "num_classes"))
        return cls(None if n is None else int(n), None if k is None else int(k),
                   tuple(c for c in parsed if c is not None) if valid and parsed else None,
                   at(value, "permuted_labels") is True, Fingerprint.of(at(value, "fingerprint")))


@dataclass(frozen=True)
class Provenance:
    """result.json `provenance.code`: the commit (None outside a git checkout, or written before provenance) and
    whether the checkout had uncommitted changes (None: unknown, e.g. git refused a checkout another user owns)."""

    commit: str | None
    dirty: bool | None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, value: Any) -> Provenance | None:
        if not isinstance(value, Mapping):
            return None
        commit = text(at(value, "code", "commit"))
        dirty = at(value, "code", "dirty")
        return cls(commit or None, dirty if isinstance(dirty, bool) else None, value)


@dataclass(frozen=True)
class Sections:
    """A task's part of result.json, typed: what its body returns and its tables read (`Result.body`). `written`: the
    sections in the order written (`encode` writes exactly these); a subclass adds typed fields, read in `read`."""

    written: Mapping[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def read(cls, written: Mapping[str, Any]) -> Sections:
        """The sections typed (ValueError for sections that cannot be): a subclass returns its own class."""
        return cls(written)


@dataclass(frozen=True)
class Result:
    """The envelope of every result: identity, the config as recorded, the task's sections (`body`, of the class's
    `sections_type`), and where and how it ran. A task's subclass (`Task.result_type`) names its Sections class."""

    sections_type: ClassVar[type[Sections]] = Sections

    config_hash: str
    hash_version: int
    numerics_version: int
    schema_version: int
    task: str
    config: Mapping[str, Any]  # as recorded: the job hash is recomputed from it (results.stored_hash)
    job_dir: str | None = None
    body: Sections = field(default_factory=Sections, repr=False)  # the task's own sections, typed
    device: str | None = None
    timings: Mapping[str, Any] = field(default_factory=dict, repr=False)
    provenance: Provenance | None = None
    dataset: DatasetInfo = field(default_factory=lambda: DatasetInfo.of(None))
    tail: tuple[str, ...] = field(default=TAIL_KEYS, repr=False)  # the envelope keys written after the sections

    def section(self, name: str) -> Mapping[str, Any] | None:
        """A task section that is an object (None where absent or of another type)."""
        value = at(self.body.written, name)
        return value if isinstance(value, Mapping) else None
