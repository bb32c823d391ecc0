"""Loss regularizers added to the training loss (never to early stopping, evaluation or MDL coding).

`regularizer=sd` is Spectral Decoupling (Pezeshki et al. 2021): penalty = mean over all logit entries of
λ_{y_i} · (z_ij − γ_{y_i})², with λ, γ scalars or per-class lists indexed by the example's label (the CelebA variant;
with one binary logit exactly its per-class form). The paper writes λ/2‖ŷ‖²; the official code, like us, uses
coefficient · mean(ŷ²). Optional `start_step`: no penalty before that step. Optional `loss_scale` reproduces a quirk
of the official Colored-MNIST code: from `start_step` the *whole* loss (CE + penalty) is multiplied by that factor
(2e-5); with Adam this mostly cuts the step size, so it is exposed to be tested.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor

from erasure.registry import Registry
from training.engine.fit import Regularizer

BaseLoss = Callable[[Tensor, Tensor], Tensor]


def task_loss(logits: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy: softmax over K logits, or the logistic loss for a single binary logit."""
    if logits.ndim == 2 and logits.shape[1] == 1:
        return F.binary_cross_entropy_with_logits(logits[:, 0], y.to(logits.dtype))
    return F.cross_entropy(logits, y)


def _per_example(value: Tensor, y: Tensor, like: Tensor) -> Tensor:
    """A scalar as is, or a per-class vector indexed by label and shaped to broadcast over `like`."""
    return value.to(like) if value.ndim == 0 else value.to(like)[y].reshape(-1, *([1] * (like.ndim - 1)))


def sd_penalty(logits: Tensor, y: Tensor, lam: Tensor | float, gamma: Tensor | float = 0.0) -> Tensor:
    """mean(λ_y · (logits − γ_y)²) over every logit entry. Gradient: 2λ_y(z − γ_y) / logits.numel()."""
    lam_t, gamma_t = torch.as_tensor(lam), torch.as_tensor(gamma)
    diff = logits - _per_example(gamma_t, y, logits)
    return (_per_example(lam_t, y, logits) * diff.square()).mean()


@dataclass(frozen=True)
class SpectralDecoupling:
    lam: Tensor  # () or (K,)
    gamma: Tensor  # () or (K,)
    start_step: int = 0
    loss_scale: float | None = None  # official Colored-MNIST quirk, see the module docstring
    base_loss: BaseLoss = task_loss  # the loss the fit loop adds us to (needed for loss_scale only)

    def __call__(self, logits: Tensor, y: Tensor, step: int) -> Tensor:
        if step < self.start_step:
            return logits.new_zeros(())
        penalty = sd_penalty(logits, y, self.lam, self.gamma)
        if self.loss_scale is None:
            return penalty
        # base + this = scale · (base + penalty)
        s = float(self.loss_scale)
        return s * penalty + (s - 1.0) * self.base_loss(logits, y)


def _coef(value: float | Sequence[float], num_classes: int, name: str) -> Tensor:
    t = torch.as_tensor(value, dtype=torch.float64)
    if t.ndim == 1 and len(t) != num_classes:
        raise ValueError(f"regularizer.{name}: per-class list needs {num_classes} values, got {len(t)}")
    return t


class RegularizerCfg(Protocol):
    """The typed `regularizer` config group (training/app/schema.py RegularizerConfig)."""

    @property
    def name(self) -> str: ...
    @property
    def options(self) -> Any: ...  # the regularizer's own options dataclass, or None


@dataclass(frozen=True, kw_only=True)
class SdOptions:
    """`regularizer=sd`'s own keys (conf/regularizer/sd.yaml has their defaults)."""

    lam: float | list[float] = field(metadata={
        "check": lambda v: all(x >= 0 for x in (v if isinstance(v, list) else [v])),
        "allowed": "a finite number ≥ 0 or a list of them (one per class)"})
    gamma: float | list[float]  # the logit target γ, or one per class
    start_step: int = field(metadata={"check": lambda v: v >= 0, "allowed": "an integer ≥ 0"})
    loss_scale: float | None = field(metadata={"check": lambda v: v > 0, "allowed": "a number > 0 or null"})


Builder = Callable[[Any, int, BaseLoss], "Regularizer | None"]


@dataclass(frozen=True)
class RegularizerTraits:
    """What a regularizer declares where it registers."""

    options: type[Any] | None = None  # the dataclass of its own keys (`regularizer.lam`, ...); None: it has none

# `regularizer=<name>`: a builder (its options, num_classes, base_loss) -> the penalty, or None for no regularizer.
# Its entries are the builders below (a new regularizer is one more here).
REGULARIZERS: Registry[Builder] = Registry("regularizer", declares=RegularizerTraits)


def regularizer_traits(name: str) -> RegularizerTraits:
    return REGULARIZERS.declared(name)


@REGULARIZERS.register("none")
def _no_regularizer(options: None, num_classes: int, base_loss: BaseLoss) -> Regularizer | None:
    return None


@REGULARIZERS.register("sd", options=SdOptions)
def spectral_decoupling(o: SdOptions, num_classes: int, base_loss: BaseLoss) -> Regularizer | None:
    return SpectralDecoupling(lam=_coef(o.lam, num_classes, "lam"), gamma=_coef(o.gamma, num_classes, "gamma"),
                              start_step=o.start_step, loss_scale=o.loss_scale, base_loss=base_loss)


def build_regularizer(cfg: RegularizerCfg | None, num_classes: int,
                      base_loss: BaseLoss = task_loss) -> Regularizer | None:
    return None if cfg is None else REGULARIZERS.get(cfg.name)(cfg.options, num_classes, base_loss)


def method_label(sd: SdOptions | None, weight_decay: float) -> str:
    """"ERM" / "SD λ=…", ", loss×s" for the official whole-loss rescale, "(from step t)", "+ WD w"."""
    lam = sd.lam if sd is not None else 0.0
    lam_on = any(v > 0 for v in lam) if isinstance(lam, list) else lam > 0
    scale = sd.loss_scale if sd is not None else None
    name = ", ".join([f"SD λ={lam}" if lam_on else "ERM"] + ([f"loss×{scale}"] if scale is not None else []))
    if sd is not None and (lam_on or scale is not None) and sd.start_step:
        name += f" (from step {sd.start_step})"
    return name + (f" + WD {weight_decay:g}" if weight_decay > 0 else "")
