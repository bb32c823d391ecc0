"""task=gs_colored_mnist: the paper's Table 2 / Fig. 3, a 2×300 ReLU MLP trained full batch with Adam on Colored
MNIST (training/tasks/gs/colored_mnist.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from types import ModuleType
from typing import Literal

from training.app.typed import NONNEG, POSITIVE, POSITIVE_NUMBER
from training.tasks.gs.base import NOT_AN_IMAGE_PIPELINE, StarvationTask


@dataclass(frozen=True, kw_only=True)
class ColoredMnistOptions:
    """`gs.*` of task=gs_colored_mnist (conf/experiment/gs_colored_mnist.yaml)."""

    hidden: int = field(metadata=POSITIVE)
    depth: int = field(metadata=POSITIVE)
    init: Literal["default", "xavier"] = "xavier"  # xavier weights, zero biases (the official code)
    lr: float = field(metadata=POSITIVE_NUMBER)
    weight_decay: float = field(default=0.0, metadata=NONNEG)
    steps: int = field(metadata=POSITIVE)
    eval_every: int = field(default=50, metadata=POSITIVE)


class ColoredMnist(StarvationTask):
    name = "gs_colored_mnist"
    uses = ("dataset", "regularizer", "gs")
    fixed = {"dataset.name": "colored_mnist", **NOT_AN_IMAGE_PIPELINE}
    numerics = 3  # unchanged by 4 (gs_erased_eval's erase path)
    options = ColoredMnistOptions

    def implementation(self) -> ModuleType:
        import training.tasks.gs.colored_mnist as colored_mnist

        return colored_mnist


TASK = ColoredMnist()
