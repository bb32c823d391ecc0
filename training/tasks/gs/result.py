"""What a Gradient Starvation result.json holds beyond the envelope (training/app/result_types.py), typed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from training.app.result_types import Result, Sections, at, text


@dataclass(frozen=True)
class StarvationSections(Sections):
    """A Gradient Starvation job's sections (gs_two_moons, gs_colored_mnist, gs_erased_eval: what `run` of
    moons.py, colored_mnist.py, erased_eval.py returns): the method its config describes (ERM / SD λ=…) and its
    metric sections (`written`), read by aggregate_gs.py."""

    method: str | None = None

    @classmethod
    def read(cls, written: Mapping[str, Any]) -> StarvationSections:
        return cls(written, text(at(written, "method")))


@dataclass(frozen=True)
class StarvationResult(Result):
    """A Gradient Starvation result: the envelope around its job's sections (`body`)."""

    sections_type = StarvationSections
    body: StarvationSections = field(default_factory=StarvationSections, repr=False)
