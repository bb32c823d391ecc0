"""Schedule-free AdamW over the stacked engine's parameters, as a function the whole training step can be compiled with.

The per-group scalars (k, lr, lr_max, weight_sum, ckp1, ...) are the library's (schedulefree 1.4), computed on the
host (`next_scalars`: every row of a group steps every step, so no read back); the update is the library's foreach
step written per tensor with the same operations: on CPU bitwise the library's optimizer (tests/test_vectorized.py).
`per_row=True` (a compiled step, or rows refilled from a queue): the same scalars as device tensors of length M per
group, computed inside the step from a device step counter (float64): no changing Python float recompiles the graph,
and each row has its own k, lr_max and weight_sum (`reset_row`). Same formulas; float rounding differs (tensor ×
tensor where the library passes alpha).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

Groups = list[tuple[list[str], dict[str, Any]]]  # (parameter names, hyperparameters) per param group
SCALARS = ("k", "lr_max", "weight_sum", "train_mode")


@dataclass(frozen=True)
class StepScalars:
    """One group's scalars for one step (Python floats, as the library computes them)."""

    lr: float | Tensor  # tensors of length M with `per_row`
    ckp1: float | Tensor
    bc2: float | Tensor
    coef: float | Tensor  # lr·(β1·(1 − ckp1) − 1), the y step


def next_scalars(g: dict[str, Any]) -> StepScalars:
    """The next step's scalars of param group `g`, advancing its k, lr_max and weight_sum (the library's step, r=0)."""
    k = g["k"]
    sched = (k + 1) / g["warmup_steps"] if k < g["warmup_steps"] else 1.0
    lr = g["lr"] * sched
    g["lr_max"] = lr_max = max(lr, g["lr_max"])
    weight = lr_max ** g["weight_lr_power"]
    g["weight_sum"] = weight_sum = g["weight_sum"] + weight
    ckp1 = weight / weight_sum if weight_sum != 0 else 0.0
    beta1, beta2 = g["betas"]
    g["k"] = k + 1
    return StepScalars(lr, ckp1, 1 - beta2 ** (k + 1), lr * (beta1 * (1 - ckp1) - 1))


class StackedScheduleFree:
    """y (the stacked parameters, updated in place), z and the second moment per parameter name; per group the
    library's scalars on the host."""

    def __init__(self, groups: Groups, params: Mapping[str, Tensor], per_row: bool = False) -> None:
        for _, hp in groups:
            if hp.get("r", 0.0) != 0.0:
                raise ValueError("the stacked engine's schedule-free step supports r=0 (the library's default)")
        self.groups = [(names, {**hp, "train_mode": True}) for names, hp in groups]
        self.z = {n: p.detach().clone() for n, p in params.items()}
        self.v = {n: torch.zeros_like(p) for n, p in params.items()}
        p0 = next(iter(params.values()))
        m, g, f64, dev = len(p0), len(groups), torch.float64, p0.device
        # per_row: k (M,), and per group lr_max and weight_sum (G, M), as the library's initial values
        self.rows = None if not per_row else {
            "k": torch.zeros(m, dtype=f64, device=dev), "lr_max": torch.full((g, m), -1.0, dtype=f64, device=dev),
            "weight_sum": torch.zeros(g, m, dtype=f64, device=dev)}

    def row_scalars(self) -> list[StepScalars]:
        """`scalars` per row, on the device, inside the (compiled) step: each a tensor of length M."""
        assert self.rows is not None
        k, out = self.rows["k"], []
        for gi, (_, g) in enumerate(self.groups):
            warm = g["warmup_steps"]
            sched = torch.where(k < warm, (k + 1) / max(warm, 1), torch.ones_like(k))
            lr = g["lr"] * sched
            lr_max = torch.maximum(self.rows["lr_max"][gi], lr)
            self.rows["lr_max"][gi] = lr_max
            weight = lr_max ** g["weight_lr_power"]
            self.rows["weight_sum"][gi] += weight
            weight_sum = self.rows["weight_sum"][gi]
            ckp1 = torch.where(weight_sum != 0, weight / weight_sum, torch.zeros_like(weight))
            beta1, beta2 = g["betas"]
            out.append(StepScalars(lr, ckp1, 1 - beta2 ** (k + 1), lr * (beta1 * (1 - ckp1) - 1)))
        k += 1
        return out

    def scalars(self) -> list[StepScalars]:
        return [next_scalars(g) for _, g in self.groups]

    def update(self, params: Mapping[str, Tensor], grads: Mapping[str, Tensor], scalars: list[StepScalars]) -> None:
        """One step of every group, in place on params, z and the second moment (`grads` are overwritten)."""
        for (names, g), s in zip(self.groups, scalars, strict=True):
            beta2, eps, decay = g["betas"][1], g["eps"], g["weight_decay"]
            for n in names:
                y, grad, v, z = params[n], grads[n], self.v[n], self.z[n]
                if isinstance(s.lr, Tensor):
                    _row_update(y, grad, v, z, s, g)
                    continue
                v.mul_(beta2)
                v.addcmul_(grad, grad, value=1 - beta2)
                denom = v.div(s.bc2)
                denom.sqrt_()
                denom.add_(eps)
                grad.div_(denom)
                if decay != 0:
                    grad.add_(y, alpha=decay)
                lr, coef = s.lr, s.coef
                assert not isinstance(lr, Tensor) and not isinstance(coef, Tensor)
                y.lerp_(z, weight=s.ckp1)
                y.add_(grad, alpha=coef)
                z.sub_(grad, alpha=lr)

    def state_dict(self) -> dict[str, Any]:
        return {"z": {n: t.clone() for n, t in self.z.items()}, "v": {n: t.clone() for n, t in self.v.items()},
                "groups": [{k: g[k] for k in SCALARS} for _, g in self.groups],
                "rows": None if self.rows is None else {k: t.clone() for k, t in self.rows.items()}}

    def load_state_dict(self, saved: dict[str, Any], device: torch.device) -> None:
        for n in self.z:
            self.z[n].copy_(saved["z"][n].to(device))  # in place: a compiled step's static addresses stay valid
            self.v[n].copy_(saved["v"][n].to(device))
        for (_, g), scalars in zip(self.groups, saved["groups"], strict=True):
            g.update(scalars)
        if self.rows is not None:
            for k, t in self.rows.items():
                t.copy_(saved["rows"][k].to(device))

    def reset_row(self, r: int) -> None:
        """Row r holds a new model: its k, lr_max and weight_sum as the library starts them."""
        assert self.rows is not None
        self.rows["k"][r] = 0
        self.rows["lr_max"][:, r] = -1.0
        self.rows["weight_sum"][:, r] = 0

    def keep(self, rows: Tensor) -> None:
        self.z = {n: t[rows] for n, t in self.z.items()}
        self.v = {n: t[rows] for n, t in self.v.items()}
        if self.rows is not None:
            self.rows = {k: t[..., rows] for k, t in self.rows.items()}


def _row_update(y: Tensor, grad: Tensor, v: Tensor, z: Tensor, s: StepScalars, g: Mapping[str, Any]) -> None:
    """The update with per-row scalars (tensors of length M, broadcast over each row's parameters); `g`: the
    group's hyperparameters."""
    def row(t: float | Tensor) -> Tensor:
        assert isinstance(t, Tensor)
        return t.to(y.dtype).view(-1, *[1] * (y.dim() - 1))

    beta2, eps, decay = g["betas"][1], g["eps"], g["weight_decay"]
    v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    grad.div_((v / row(s.bc2)).sqrt_().add_(eps))
    if decay != 0:
        grad.add_(y, alpha=decay)
    y.lerp_(z, row(s.ckp1))
    y.addcmul_(grad, row(s.coef))
    z.sub_(grad * row(s.lr))
