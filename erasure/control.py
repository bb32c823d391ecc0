"""Identity eraser (the unerased control)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from .base import Eraser, base_info, counts_info, prepare_fit
from .moments import ClassMoments
from .registry import ERASERS


class ControlEraser(Eraser):
    name = "control"

    def _apply(self, x64: Tensor, y: Tensor | None) -> Tensor:
        return x64


def control_from_moments(mom: ClassMoments, *, input_dtype: str = "float32") -> ControlEraser:
    info: dict[str, Any] = counts_info("control", int(mom.mean.shape[0]), mom.counts, input_dtype, {})
    info["rank_removed"] = 0
    return ControlEraser({"mean": mom.mean}, info)


@ERASERS.register("control", family="control", kind="map", identity=True, from_moments=control_from_moments)
def fit_control(x: Tensor | np.ndarray, y: Tensor | np.ndarray) -> ControlEraser:
    x64, labels, flat, k = prepare_fit(x, y)
    info: dict[str, Any] = base_info("control", flat, k, torch.bincount(labels, minlength=k).cpu(), {})
    info["rank_removed"] = 0
    return ControlEraser({"mean": x64.mean(0)}, info)
