"""Fully connected nets: depth = number of hidden layers, ReLU / GELU / SwiGLU, μP readout."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from mup import MuReadout
from torch import nn

from models.mup_utils import kaiming_uniform_init
from models.registry import ARCHS, Arch

DepthCounts = Literal["hidden", "linear"]
Activation = Literal["relu", "gelu", "swiglu"]
ACTIVATIONS: tuple[str, ...] = Activation.__args__  # type: ignore[attr-defined]


@dataclass(frozen=True, kw_only=True)
class MlpOptions:
    """`arch=mlp`'s own keys (conf/arch/mlp.yaml has their defaults)."""

    activation: Activation
    depth_counts: DepthCounts  # hidden: depth counts hidden layers (ours); linear: Linear layers (the paper code)
    swiglu_ratio: float | None = field(metadata={"check": lambda v: v > 0, "allowed": "a number > 0 or null"})


def hidden_layers(arch: Arch, depth: int | None = None) -> int:
    """Hidden layers of an MLP/LeNet `arch`: `arch.depth` itself (`depth_counts: hidden`, ours), or depth - 1
    (`depth_counts: linear`: depth counts the Linear layers including the readout, as `num_layers` in the paper's
    code, EleutherAI/mdl `mdl/mlp_probe.py`: `sizes = [num_features] + [hidden_size] * (num_layers - 1)`)."""
    counts = arch.options.depth_counts
    depth = arch.depth if depth is None else depth
    if counts == "linear" and depth < 2:
        raise ValueError(f"{arch.name} depth {depth} counted in Linear layers has no hidden layer (a linear "
                         "probe, not an MLP); the smallest is 2")
    return depth - 1 if counts == "linear" else depth


def one_stage(arch: Arch, depth: int | None = None) -> tuple[int, ...]:
    """The stages of an MLP or a LeNet: one of `depth` hidden layers (what the depth learning-rate rule counts)."""
    return (arch.depth if depth is None else depth,)


def mlp_param_count(in_features: int, width: int, depth: int, num_classes: int) -> int:
    """Parameters of the plain (ReLU/GELU) MLP with `depth` hidden layers of `width` units."""
    return in_features * width + width + (depth - 1) * (width * width + width) + width * num_classes + num_classes


def glu_param_count(in_features: int, hidden: int, depth: int, num_classes: int) -> int:
    """Parameters of the SwiGLU MLP: every hidden layer has a gate and a value projection."""
    return 2 * (in_features * hidden + hidden) + (depth - 1) * 2 * (hidden * hidden + hidden) + hidden * num_classes \
        + num_classes


def matched_glu_hidden(in_features: int, width: int, depth: int, num_classes: int) -> int:
    """SwiGLU hidden size whose parameter count is closest to the ReLU MLP of the same width and depth.

    The transformer rule "2h/3" equalises an up/down FFN pair; in a plain stack every hidden unit of a gated
    layer has two incoming weight rows, so the matched size is ~h/2 when the input layer dominates.
    """
    target = mlp_param_count(in_features, width, depth, num_classes)
    a, b, c = 2 * (depth - 1), 2 * in_features + 2 + 2 * (depth - 1) + num_classes, num_classes - target
    root = -c / b if a == 0 else (-b + math.sqrt(b * b - 4 * a * c)) / (2 * a)
    candidates = {max(1, math.floor(root)), max(1, math.ceil(root))}
    return min(candidates, key=lambda m: abs(glu_param_count(in_features, m, depth, num_classes) - target))


class GLU(nn.Module):
    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.gate = nn.Linear(in_features, out_features)
        self.value = nn.Linear(in_features, out_features)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.silu(self.gate(x)) * self.value(x)


class MLP(nn.Module):
    def __init__(self, in_features: int, hidden: int, depth: int, num_classes: int, activation: str) -> None:
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"MLP activation must be one of {ACTIVATIONS}, got {activation!r}")
        if depth < 1:
            raise ValueError(f"MLP depth (number of hidden layers) must be >= 1, got {depth}")
        self.activation = activation
        dims = [in_features] + [hidden] * depth
        layer = GLU if activation == "swiglu" else nn.Linear
        self.layers = nn.ModuleList(layer(i, o) for i, o in zip(dims[:-1], dims[1:], strict=True))
        self.readout = MuReadout(hidden, num_classes, readout_zero_init=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.flatten(1)
        for layer in self.layers:
            x = layer(x)
            if self.activation == "relu":
                x = F.relu(x)
            elif self.activation == "gelu":
                x = F.gelu(x)
        return self.readout(x)


@ARCHS.register("mlp", vectorises=True, base_width=128, depth_exponent=1.5, init=kaiming_uniform_init,
                options=MlpOptions)
@dataclass(frozen=True)
class MLPSpec:
    in_features: int
    width: int
    depth: int
    num_classes: int
    activation: str = "relu"
    swiglu_ratio: float | None = None  # None: hidden matched to the ReLU MLP's parameter count

    stage_depths = staticmethod(one_stage)

    @classmethod
    def from_arch(cls, arch: Arch, input_shape: tuple[int, ...], num_classes: int) -> MLPSpec:
        opts: MlpOptions = arch.options
        return cls(in_features=math.prod(input_shape), width=arch.width, depth=hidden_layers(arch),
                   num_classes=num_classes, activation=opts.activation, swiglu_ratio=opts.swiglu_ratio)

    @property
    def hidden(self) -> int:
        if self.activation != "swiglu":
            return self.width
        if self.swiglu_ratio is not None:
            return max(1, round(self.swiglu_ratio * self.width))
        return matched_glu_hidden(self.in_features, self.width, self.depth, self.num_classes)

    def build(self) -> MLP:
        return MLP(self.in_features, self.hidden, self.depth, self.num_classes, self.activation)

    def info(self) -> dict[str, Any]:
        relu = mlp_param_count(self.in_features, self.width, self.depth, self.num_classes)
        return {"depth": self.depth, "activation": self.activation, "hidden": self.hidden, "relu_mlp_params": relu}
