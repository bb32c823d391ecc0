"""task=gs_two_moons: the paper's Fig. 1, a 2-layer ReLU net trained full batch with SGD + momentum
(training/tasks/gs/moons.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Literal

from training.app.typed import NONNEG, POSITIVE, POSITIVE_NUMBER
from training.tasks.gs.base import NOT_AN_IMAGE_PIPELINE, StarvationTask


@dataclass(frozen=True, kw_only=True)
class GridOptions:
    lo: float = -2.5
    hi: float = 2.5
    n: int = field(default=301, metadata=POSITIVE)


@dataclass(frozen=True, kw_only=True)
class TwoMoonsOptions:
    """`gs.*` of task=gs_two_moons (conf/experiment/gs_two_moons.yaml)."""

    hidden: int = field(metadata=POSITIVE)
    depth: int = field(default=1, metadata=POSITIVE)
    init: Literal["default", "xavier"] = "default"
    lr: float = field(metadata=POSITIVE_NUMBER)
    momentum: float = field(metadata=NONNEG)
    weight_decay: float = field(default=0.0, metadata=NONNEG)
    steps: int = field(metadata=POSITIVE)
    grid: GridOptions = field(default_factory=GridOptions)  # where the boundary is drawn


class TwoMoons(StarvationTask):
    name = "gs_two_moons"
    uses = ("dataset", "regularizer", "gs")
    fixed = {"dataset.name": "two_moons", **NOT_AN_IMAGE_PIPELINE}
    numerics = 3  # unchanged by 4 (gs_erased_eval's erase path)
    options = TwoMoonsOptions

    def implementation(self) -> ModuleType:
        import training.tasks.gs.moons as moons

        return moons


TASK = TwoMoons()
