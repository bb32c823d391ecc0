"""What a Gradient Starvation result.json holds beyond the envelope (training/app/result_types.py), typed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from training.app.result_types import Result, at, text


@dataclass(frozen=True)
class StarvationResult(Result):
    """A Gradient Starvation result (training/tasks/gs/*.py: gs_two_moons, gs_colored_mnist, gs_erased_eval):
    the method its config describes (ERM / SD λ=…) and its metric sections, read by
    training/tasks/gs/aggregate_gs.py."""

    method: str | None = None

    @classmethod
    def typed_sections(cls, sections: Mapping[str, Any]) -> dict[str, Any]:
        return {"method": text(at(sections, "method"))}
