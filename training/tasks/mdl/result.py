"""What a task=mdl result.json holds beyond the envelope (training/app/result_types.py), typed: the code length and
its block models, the final model, the erasure record and the certificate (`MdlSections`: what the job's body
returns, job.py `run`, and what the tables read, aggregate_collect.py, as `MdlResult.body`)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from training.app.result_types import Result, Sections, at, mapping, number, text


def number_or_nan(value: Any) -> float:
    """A JSON number as a float, NaN for anything else (a missing score of a report or certificate)."""
    n = number(value)
    return math.nan if n is None else n


TAIL_MIN, TAIL_SHARE, TAIL_Z = 3, 0.1, 2.0  # the last max(3, 10%) validations; a fall beyond 2 SE of its trend


def tail_fall_bits(curve: Sequence[tuple[int, float]]) -> float | None:
    """How much further the validation loss (nats per sample, one value per validation) would fall, in bits per
    sample, over as many more validations as its tail holds, if it kept its trend: the tail is the last
    T = max(TAIL_MIN, ⌈TAIL_SHARE · validations⌉) values, the trend the least-squares slope over the last 2T; 0 where
    the slope is not below −TAIL_Z standard errors (the loss no longer falls beyond its own noise), None under 3
    values."""
    losses = [float(v) for _, v in curve]
    tail = max(TAIL_MIN, math.ceil(TAIL_SHARE * len(losses)))
    v = losses[-2 * tail:]
    n = len(v)
    if n < 3:
        return None
    t_mean, v_mean = (n - 1) / 2, sum(v) / n
    sxx = sum((t - t_mean) ** 2 for t in range(n))
    slope = sum((t - t_mean) * (x - v_mean) for t, x in enumerate(v)) / sxx
    resid = sum((x - v_mean - slope * (t - t_mean)) ** 2 for t, x in enumerate(v))
    se = math.sqrt(resid / (n - 2) / sxx)
    return -slope * tail / math.log(2) if slope < -TAIL_Z * se else 0.0


@dataclass(frozen=True)
class BlockRecord:
    """One block model of the prequential code (`mdl.blocks[i]`): how long it trained and why it stopped;
    `tail_fall_bits` (`tail_fall_bits` of its validation curve; None in results written before it)."""

    epochs: float | None
    best_epoch: float | None
    stop_reason: str | None
    steps: float | None = None
    coded_size: float | None = None
    tail_fall_bits: float | None = None

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> BlockRecord:
        return cls(number(at(value, "epochs")), number(at(value, "best_epoch")), text(at(value, "stop_reason")),
                   number(at(value, "steps")), number(at(value, "coded_size")), number(at(value, "tail_fall_bits")))


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
    epochs: float | None = None
    steps: float | None = None

    @classmethod
    def of(cls, value: Mapping[str, Any]) -> FinalRecord:
        return cls(number(at(value, "val_loss_bits", default=math.nan)), tuple(at(value, "val_loss_curve") or ()),
                   number(at(value, "epochs")), number(at(value, "steps")))


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
    rank_test: Mapping[str, Any] = field(default_factory=dict)  # a fitted linear eraser's (erasure/rank_test.py)

    @classmethod
    def of(cls, value: Any) -> ErasureRecord:
        return cls(EraserFit.of(at(value, "fit")), mapping(at(value, "report")), mapping(at(value, "rank_test")))

    @property
    def rank_irregular(self) -> bool | None:
        """Whether the fit's removed directions are no more label-aligned than under shuffled labels (None: no
        test: not a fitted linear eraser, or a result written before the test)."""
        return value if isinstance(value := at(self.rank_test, "rank_irregular"), bool) else None

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
        return number_or_nan(at(self.after if side == "after" else self.before, key))

    def flag(self, key: str) -> bool | None:
        """A yes/no of the certificate after erasure (None where it lacks it)."""
        return value if isinstance(value := at(self.after, key), bool) else None

    def verdict(self, key: str) -> str | None:
        """A verdict word of the certificate after erasure (None where it lacks it)."""
        return text(at(self.after, key))


@dataclass(frozen=True)
class MdlSections(Sections):
    """A task=mdl job's sections: its code length, final model, erasure record and certificate (None: not
    written), and what it wrote besides (dataset, model, optim: `written`)."""

    mdl: MdlRecord | None = None
    final: FinalRecord | None = None
    erasure: ErasureRecord = field(default_factory=lambda: ErasureRecord.of(None))
    certificate: Certificate = field(default_factory=lambda: Certificate.of(None))

    @classmethod
    def read(cls, written: Mapping[str, Any]) -> MdlSections:
        mdl, final = at(written, "mdl"), at(written, "final")
        if final and not isinstance(final, Mapping):
            raise ValueError(f"final is a {type(final).__name__}")
        return cls(written, MdlRecord.of(mdl) if isinstance(mdl, Mapping) else None,
                   FinalRecord.of(final) if isinstance(final, Mapping) else None,
                   ErasureRecord.of(at(written, "eraser")), Certificate.of(at(written, "certificate")))


@dataclass(frozen=True)
class MdlResult(Result):
    """A task=mdl result: the envelope around an MDL job's sections (`body`)."""

    sections_type = MdlSections
    body: MdlSections = field(default_factory=MdlSections, repr=False)
