"""LeNet whose channel / fc sizes are searched so its parameter count matches the ReLU MLP's.

conv5×5 (pad 2) → ReLU → maxpool2 → conv5×5 (pad 2) → ReLU → maxpool2 → `depth` × (fc → ReLU) → μP readout.
`depth` counts the fully connected hidden layers, exactly like the MLP's depth (classic LeNet-5 has 2), so
the paper's depth grid 1…8 applies unchanged. "Same" padding keeps 8×8 inputs (sklearn digits) valid.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import torch
import torch.nn.functional as F
from mup import MuReadout
from torch import nn

from models.mlp import DepthCounts, hidden_layers, mlp_param_count, one_stage
from models.mup_utils import kaiming_uniform_init
from models.registry import ARCHS, Arch, CoordSettings

# LeNet-5's shape (6 : 16 : 120 for conv1 : conv2 : fc); all three scale together, so all are μP widths.
C1_PER_C2 = 6 / 16
FC_PER_C2 = 120 / 16
KERNEL = 5
TOLERANCE = 0.005  # searched tolerance; the guarantee checked by tests is 1%


def _pooled(size: int) -> int:
    return size // 2 // 2


def _flat(input_shape: tuple[int, int, int], c2: int) -> int:
    """Features entering the first fc layer: c2 channels of the twice-pooled image."""
    _, h, w = input_shape
    return c2 * _pooled(h) * _pooled(w)


def lenet_param_count(input_shape: tuple[int, int, int], c1: int, c2: int, fc: int, depth: int,
                      num_classes: int) -> int:
    c = input_shape[0]
    return (
        c1 * c * KERNEL**2 + c1
        + c2 * c1 * KERNEL**2 + c2
        + fc * _flat(input_shape, c2) + fc
        + (depth - 1) * (fc * fc + fc)
        + num_classes * fc + num_classes
    )  # fmt: skip


@lru_cache(maxsize=1024)
def match_lenet(input_shape: tuple[int, int, int], width: int, depth: int, num_classes: int) -> tuple[int, int, int]:
    """(c1, c2, fc): LeNet parameters within TOLERANCE of the ReLU MLP (same width and depth), closest to
    LeNet-5's proportions. Scans c2, ties c1 to it, solves the (quadratic in fc) parameter count for fc."""
    c, h, w = input_shape
    if _pooled(h) < 1 or _pooled(w) < 1:
        raise ValueError(f"LeNet needs inputs of at least 4×4, got {input_shape}")
    target = mlp_param_count(math.prod(input_shape), width, depth, num_classes)
    best: tuple[float, float, tuple[int, int, int]] | None = None
    for tol in (TOLERANCE, 0.01):
        for c2 in range(1, 100_000):
            c1 = max(1, round(C1_PER_C2 * c2))
            fixed = lenet_param_count(input_shape, c1, c2, 0, 1, num_classes)  # convs + output bias
            if fixed >= target:
                break
            a, b, rest = depth - 1, _flat(input_shape, c2) + 1 + (depth - 1) + num_classes, fixed - target
            root = -rest / b if a == 0 else (-b + math.sqrt(b * b - 4 * a * rest)) / (2 * a)
            for fc in {max(1, math.floor(root)), max(1, math.ceil(root))}:
                err = abs(lenet_param_count(input_shape, c1, c2, fc, depth, num_classes) / target - 1)
                if err <= tol:
                    key = (abs(math.log(fc / (FC_PER_C2 * c2))), err, (c1, c2, fc))
                    best = key if best is None or key < best else best
        if best is not None:
            return best[2]
    raise ValueError(f"no LeNet within 1% of the MLP (width {width}, depth {depth}) for input {input_shape}")


class LeNet(nn.Module):
    def __init__(self, input_shape: tuple[int, int, int], sizes: tuple[int, int, int], depth: int,
                 num_classes: int) -> None:
        """`sizes`: (conv1 channels, conv2 channels, fc width)."""
        super().__init__()
        if depth < 1:
            raise ValueError(f"LeNet depth (number of fc hidden layers) must be >= 1, got {depth}")
        c1, c2, fc = sizes
        self.conv1 = nn.Conv2d(input_shape[0], c1, KERNEL, padding=KERNEL // 2)
        self.conv2 = nn.Conv2d(c1, c2, KERNEL, padding=KERNEL // 2)
        dims = [_flat(input_shape, c2)] + [fc] * depth
        self.fcs = nn.ModuleList(nn.Linear(i, o) for i, o in zip(dims[:-1], dims[1:], strict=True))
        self.readout = MuReadout(fc, num_classes, readout_zero_init=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = x.flatten(1)
        for fc in self.fcs:
            x = F.relu(fc(x))
        return self.readout(x)


@dataclass(frozen=True, kw_only=True)
class LenetOptions:
    """`arch=lenet`'s own keys (conf/arch/lenet.yaml)."""

    depth_counts: DepthCounts  # hidden: depth counts hidden fc layers (ours); linear: Linear layers (paper code)


@ARCHS.register("lenet", vectorises=True, base_width=128, depth_exponent=0.5, init=kaiming_uniform_init,
                options=LenetOptions, coord=CoordSettings(widths=(64, 128, 256, 512, 1024, 2048)))
@dataclass(frozen=True)
class LeNetSpec:
    input_shape: tuple[int, int, int]
    width: int  # width of the ReLU MLP whose parameter count is matched
    depth: int
    num_classes: int

    stage_depths = staticmethod(one_stage)

    @classmethod
    def from_arch(cls, arch: Arch, input_shape: tuple[int, int, int], num_classes: int) -> LeNetSpec:
        return cls(tuple(input_shape), arch.width, hidden_layers(arch), num_classes)  # type: ignore[arg-type]

    @property
    def sizes(self) -> tuple[int, int, int]:
        return match_lenet(self.input_shape, self.width, self.depth, self.num_classes)

    def build(self) -> LeNet:
        return LeNet(self.input_shape, self.sizes, self.depth, self.num_classes)

    def info(self) -> dict[str, Any]:
        c1, c2, fc = self.sizes
        lenet = lenet_param_count(self.input_shape, c1, c2, fc, self.depth, self.num_classes)
        mlp = mlp_param_count(math.prod(self.input_shape), self.width, self.depth, self.num_classes)
        return {"depth": self.depth, "conv_channels": [c1, c2], "fc_width": fc, "lenet_params": lenet,
                "matched_mlp_params": mlp, "param_match_rel_err": lenet / mlp - 1}
