"""What a job's result.json holds, as frozen dataclasses: one envelope every task shares (`Result`) and one class
per task with the sections it writes typed (`MdlResult`, `StarvationResult`).

Reading and writing go through training/app/result_codec.py (`decode`, `encode`, `upgrade` for older schema
versions); nothing else walks a result's dict. A section's open-ended parts stay mappings where their keys are
data, not schema: an eraser's report (per eraser), the certificate's scores (per probe), the stored config (the
job hash is recomputed from it exactly as it was recorded).

Every class keeps the section it was read from (`raw`, the task's sections in `Result.sections`), so `encode`
writes back exactly what the job wrote: result.json's numbers and layout do not depend on this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

# 1: results written before the field existed (schema_version absent). 2: schema_version recorded.
RESULT_SCHEMA = 2
# Keys of every result, written by the job lifecycle (training/app/lifecycle.py) around the task's sections.
HEAD_KEYS = ("config_hash", "hash_version", "numerics_version", "schema_version", "job_dir", "task", "config")
TAIL_KEYS = ("device", "timings", "provenance")
ENVELOPE_KEYS = (*HEAD_KEYS, *TAIL_KEYS)


def number(value: Any) -> float | None:
    """A JSON number as a float (None for anything else, booleans included)."""
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def number_or_nan(value: Any) -> float:
    n = number(value)
    return math.nan if n is None else n


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


# ---- shared sections ----------------------------------------------------------------------------------------
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
        """What identifies the data: the content hash of the decoded arrays where recorded (the same data in
        another encoding, e.g. a re-gzipped file, is the same data), else the files' sha256 and sizes (not their
        names or folder: the same files elsewhere are the same data)."""
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
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, value: Any) -> DatasetInfo:
        counts = at(value, "class_counts")
        parsed = tuple(number(c) for c in counts) if isinstance(counts, list) and counts else None
        valid = parsed is not None and all(c is not None and c >= 0 for c in parsed)
        n, k = number(at(value, "n")), number(at(value, "num_classes"))
        return cls(None if n is None else int(n), None if k is None else int(k),
                   tuple(c for c in parsed if c is not None) if valid and parsed else None,
                   at(value, "permuted_labels") is True, Fingerprint.of(at(value, "fingerprint")), mapping(value))


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
class Result:
    """The envelope of every result: identity, the config as recorded, the task's sections, and where and how it
    ran. A task with typed sections subclasses it, reads them in `typed_sections`, and names the class as its
    `Task.result_type` (training/app/tasks.py); the codec builds a result of its task's class."""

    config_hash: str
    hash_version: int
    numerics_version: int
    schema_version: int
    task: str
    config: Mapping[str, Any]  # as recorded: the job hash is recomputed from it (results.stored_hash)
    job_dir: str | None = None
    sections: Mapping[str, Any] = field(default_factory=dict, repr=False)  # the task's own, in written order
    device: str | None = None
    timings: Mapping[str, Any] = field(default_factory=dict, repr=False)
    provenance: Provenance | None = None
    dataset: DatasetInfo = field(default_factory=lambda: DatasetInfo.of(None))
    tail: tuple[str, ...] = field(default=TAIL_KEYS, repr=False)  # the envelope keys written after the sections

    @classmethod
    def typed_sections(cls, sections: Mapping[str, Any]) -> dict[str, Any]:
        """The fields this class adds to the envelope, read from the task's sections (none here)."""
        return {}

    def section(self, name: str) -> Mapping[str, Any] | None:
        """A task section that is an object (None where absent or of another type)."""
        value = at(self.sections, name)
        return value if isinstance(value, Mapping) else None


# ---- MDL ------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class BlockRecord:
    """One block model of the prequential code (`mdl.blocks[i]`): how long it trained and why it stopped."""

    epochs: float | None
    best_epoch: float | None
    stop_reason: str | None
    steps: float | None = None

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> BlockRecord:
        return cls(number(at(value, "epochs")), number(at(value, "best_epoch")), text(at(value, "stop_reason")),
                   number(at(value, "steps")))


@dataclass(frozen=True)
class MdlRecord:
    """result.json `mdl`: the code length (bits per sample; `legacy`: the paper's normalisation, absent in some
    protocols) and its block models."""

    protocol: str | None
    bits_per_sample: Any  # a number in a well-formed result (checked where it is read: the aggregate)
    legacy: Any  # idem; math.nan where the protocol does not give it (`has_legacy` false)
    has_legacy: bool
    num_classes: float | None
    n_coded: float | None
    blocks: tuple[BlockRecord, ...]
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> MdlRecord:
        blocks = at(value, "blocks")
        listed = tuple(BlockRecord.of(b) for b in blocks if isinstance(b, Mapping)) if isinstance(blocks, list) \
            else ()
        return cls(text(at(value, "protocol")), at(value, "bits_per_sample"), at(value, "legacy", default=math.nan),
                   "legacy" in value, number(at(value, "num_classes")), number(at(value, "n_coded")), listed, value)


@dataclass(frozen=True)
class FinalRecord:
    """result.json `final`: the model trained on all coded data (its validation loss and curve)."""

    val_loss_bits: float | None
    val_loss_curve: tuple[Any, ...]
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)
    epochs: float | None = None
    steps: float | None = None

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> FinalRecord:
        return cls(number(at(value, "val_loss_bits", default=math.nan)), tuple(at(value, "val_loss_curve") or ()),
                   value, number(at(value, "epochs")), number(at(value, "steps")))


@dataclass(frozen=True)
class EraserFit:
    """result.json `eraser.fit`: what the eraser was fitted on and what was coded."""

    fit_source: str | None
    n_fit: float | None
    n_coded: float | None
    folds: float | None

    @classmethod
    def of(cls, value: Any) -> EraserFit:
        return cls(text(at(value, "fit_source")), number(at(value, "n_fit")), number(at(value, "n_coded")),
                   number(at(value, "folds")))


@dataclass(frozen=True)
class ErasureRecord:
    """result.json `eraser`: what the erasure did (a record, not config); `report` is the eraser's own (its keys
    depend on the eraser)."""

    fit: EraserFit
    report: Mapping[str, Any]
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False, compare=False)

    @classmethod
    def of(cls, value: Any) -> ErasureRecord:
        return cls(EraserFit.of(at(value, "fit")), mapping(at(value, "report")), mapping(value))

    def report_number(self, key: str) -> float:
        return number_or_nan(at(self.report, key))


@dataclass(frozen=True)
class Certificate:
    """result.json `certificate`: the probe scores on the data before and after erasure (score name -> value)."""

    before: Mapping[str, Any]
    after: Mapping[str, Any]

    @classmethod
    def of(cls, value: Any) -> Certificate:
        return cls(mapping(at(value, "before")), mapping(at(value, "after")))

    def score(self, key: str, side: str = "after") -> float:
        """A number of the certificate (NaN where it lacks it: an older certificate, or none)."""
        return number_or_nan(at(self._side(side), key))

    def flag(self, key: str) -> bool | None:
        """A yes/no of the certificate after erasure (None where it lacks it)."""
        value = at(self.after, key)
        return value if isinstance(value, bool) else None

    def verdict(self, key: str) -> str | None:
        """A verdict word of the certificate after erasure (None where it lacks it)."""
        return text(at(self.after, key))

    def _side(self, side: str) -> Mapping[str, Any]:
        return self.after if side == "after" else self.before


@dataclass(frozen=True)
class MdlResult(Result):
    """A task=mdl result: its code length, final model, erasure record and certificate (None: not written)."""

    mdl: MdlRecord | None = None
    final: FinalRecord | None = None
    erasure: ErasureRecord = field(default_factory=lambda: ErasureRecord.of(None))
    certificate: Certificate = field(default_factory=lambda: Certificate.of(None))

    @classmethod
    def typed_sections(cls, sections: Mapping[str, Any]) -> dict[str, Any]:
        mdl, final = at(sections, "mdl"), at(sections, "final")
        if final and not isinstance(final, Mapping):
            raise ValueError(f"final is a {type(final).__name__}")
        return {"mdl": MdlRecord.of(mdl) if isinstance(mdl, Mapping) else None,
                "final": FinalRecord.of(final) if isinstance(final, Mapping) else None,
                "erasure": ErasureRecord.of(at(sections, "eraser")),
                "certificate": Certificate.of(at(sections, "certificate"))}


# ---- Gradient Starvation --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class StarvationResult(Result):
    """A Gradient Starvation result (training/starvation/*.py: gs_two_moons, gs_colored_mnist, gs_erased_eval):
    the method its config describes (ERM / SD λ=…) and its metric sections, read by
    training/analysis/aggregate_gs.py."""

    method: str | None = None

    @classmethod
    def typed_sections(cls, sections: Mapping[str, Any]) -> dict[str, Any]:
        return {"method": text(at(sections, "method"))}
