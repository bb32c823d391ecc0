"""One entry point: `build_model(cfg.arch, input_shape, num_classes)` -> μP-ready nn.Module; `build_with_facts`
returns the model's facts beside it (what result.json records: parameters, widths, parametrization)."""

from __future__ import annotations

import dataclasses
from dataclasses import Field
from typing import Any, ClassVar, Protocol

import schedulefree
import torch
from mup import MuAdam
from torch import nn

from models.mup_utils import apply_mup, apply_sp, on_meta, param_count
from models.registry import ARCHS, Arch, arch_traits


class Spec(Protocol):
    """An architecture's frozen dataclass of what its model is built from (a variant: `dataclasses.replace`)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]
    width: int

    def build(self) -> nn.Module: ...
    def info(self) -> dict[str, Any]: ...


def make_spec(arch: Arch, input_shape: tuple[int, ...], num_classes: int) -> Spec:
    return ARCHS.get(arch.name).from_arch(arch, tuple(int(s) for s in input_shape), int(num_classes))


def build_model(arch: Arch, input_shape: tuple[int, ...], num_classes: int, *,
                parametrization: str | None = None) -> nn.Module:
    """The model of `build_with_facts`, without its facts."""
    return build_with_facts(arch, input_shape, num_classes, parametrization=parametrization)[0]


def build_with_facts(arch: Arch, input_shape: tuple[int, ...], num_classes: int, *,
                     parametrization: str | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Build the model described by `arch` (the resolved `cfg.arch`) for C×H×W inputs ((d,) features for the MLP)
    and K classes.

    Draws only from torch's global RNG (the caller seeds it). `parametrization` (default
    `arch.parametrization`, else "mup"): "mup" sets base shapes against base/delta models of the same depth
    and re-initialises μP-style; "sp" is the standard-parametrisation control used by the coord check. Returns the
    model and its facts (JSON-serialisable: arch, params, parametrization, widths, shapes, the architecture's own).
    """
    name = arch.name
    spec = make_spec(arch, input_shape, num_classes)
    model = spec.build()
    mode = parametrization or arch.parametrization
    declared = arch_traits(name)
    base_width = arch.base_width or declared.base_width
    if mode == "mup":
        base = on_meta(dataclasses.replace(spec, width=base_width).build)
        delta = on_meta(dataclasses.replace(spec, width=2 * base_width).build)
        apply_mup(model, base, delta, declared.init)
        _check_width_dims(model, getattr(spec, "fixed_modules", ()))
    elif mode == "sp":
        apply_sp(model)
    else:
        raise ValueError(f"parametrization must be 'mup' or 'sp', got {mode!r}")
    return model, {"arch": name, "params": param_count(model), "parametrization": mode, "width": spec.width,
                   "base_width": base_width, "input_shape": list(input_shape), "num_classes": int(num_classes),
                   "depth_lr_multiplier": depth_lr_multiplier(arch), **spec.info()}


def _check_width_dims(model: nn.Module, fixed_modules: tuple[str, ...]) -> None:
    """Every Linear/Conv must have a width dimension (else base and delta models failed to differ in it)."""
    for name, module in model.named_modules():
        if isinstance(module, (nn.Linear, nn.Conv2d)) and not any(f in name for f in fixed_modules):
            if module.weight.infshape.ninf() == 0:  # type: ignore[attr-defined]  # set by mup (untyped)
                raise RuntimeError(f"μP: {name} has no width dimension; base and delta models share its shape")


def _depth_blocks(arch: Arch, depth: int | None = None) -> int:
    """Blocks (hidden layers for MLP/LeNet) that the depth rule counts."""
    return int(sum(ARCHS.get(arch.name).stage_depths(arch, depth)))


def depth_lr_multiplier(arch: Arch) -> float:
    """(L_base / L)^exponent (the architecture's `depth_exponent`: 3/2 for MLPs, 1/2 otherwise); L counts
    blocks, L_base at `arch.base_depth` (2)."""
    ratio = _depth_blocks(arch, arch.base_depth) / _depth_blocks(arch)
    return float(ratio ** arch_traits(arch.name).depth_exponent)


def make_optimizer(model: nn.Module, *, lr: float, beta1: float, beta2: float, weight_decay: float,
                   warmup_steps: int) -> schedulefree.AdamWScheduleFree:
    """μP schedule-free AdamW: MuAdam splits matrix-like weights into groups with lr / width_mult. Every setting is
    given (a job's come from its `optim` section, whose defaults live in training/app/schema.py).

    Remember schedule-free's modes: `optimizer.train()` before stepping, `optimizer.eval()` (and
    `model.eval()`) before evaluating or saving.
    """
    return MuAdam(model.parameters(), impl=schedulefree.AdamWScheduleFree, lr=lr, betas=(beta1, beta2),
                  weight_decay=weight_decay, warmup_steps=int(warmup_steps))


def make_adamw(model: nn.Module, *, lr: float, beta1: float, beta2: float, weight_decay: float) -> torch.optim.AdamW:
    """torch's AdamW in μP's groups (MuAdam: lr / width_mult for matrix-like weights; with `arch.parametrization=sp`
    every multiplier is 1, plain AdamW). Evaluated as trained: it has no averaged iterate, no train/eval modes."""
    return MuAdam(model.parameters(), impl=torch.optim.AdamW, lr=lr, betas=(beta1, beta2), weight_decay=weight_decay)
