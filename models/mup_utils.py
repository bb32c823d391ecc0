"""μP plumbing shared by every architecture: base shapes, μP re-initialisation, parameter counts."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from mup import MuReadout, set_base_shapes
from mup import init as mup_init
from torch import nn
from torch.nn.modules.conv import _ConvNd

# A weight initialiser that respects p.infshape (called only on >= 2-D weights).
Initializer = Callable[[torch.Tensor], None]


def kaiming_uniform_init(w: torch.Tensor) -> None:
    """PyTorch's default Linear/Conv init at base width, μP-scaled away from it."""
    mup_init.kaiming_uniform_(w, a=math.sqrt(5))


def normal_init(std: float) -> Initializer:
    """timm's fixed-std init (trunc_normal std=0.02 never truncates) at base width, μP-scaled elsewhere."""

    def init(w: torch.Tensor) -> None:
        mup_init.normal_(w, std=std)

    return init


def param_count(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def apply_mup(model: nn.Module, base: nn.Module, delta: nn.Module, init: Initializer) -> nn.Module:
    """Attach infshapes (width dims = those that differ between base and delta) and re-init μP-style.

    `base`/`delta` may live on the meta device: only their shapes are read. Only Linear/Conv weights are
    re-initialised (other >= 2-D parameters, e.g. SwinV2's logit_scale, keep their values); the readout keeps
    its zero init.
    """
    set_base_shapes(model, base, delta=delta)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, _ConvNd)) and not isinstance(module, MuReadout):
                init(module.weight)
    return model


def apply_sp(model: nn.Module) -> nn.Module:
    """Standard parametrisation control: framework init, plain readout init, every dim finite.

    With all dims finite, MuReadout is an ordinary Linear and MuAdam is ordinary Adam.
    """
    set_base_shapes(model, None)
    for head in [m for m in model.modules() if isinstance(m, MuReadout)]:
        head.readout_zero_init = False
        nn.Linear.reset_parameters(head)
    return model


def on_meta(build: Callable[[], nn.Module]) -> nn.Module:
    """Build a shape-only model (no memory, no draws from the global RNG)."""
    with torch.device("meta"):
        return build()
