"""μP coordinate check: activation size vs width after a few optimiser steps.

For each width (and seed) we build the model through `build_with_facts`, train it for `nsteps` steps of
`make_optimizer` on one fixed batch, and record the mean |activation| of every submodule at the last step.
Under μP these are width-independent (log-log slope ≈ 0); under the standard parametrisation with Adam they
grow with width (slope ≈ 1 for pre-activations and logits).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from models.build import build_with_facts, make_optimizer
from models.registry import Arch, CoordSettings

LOGITS = "<logits>"


@dataclass
class CoordResult:
    arch: str
    parametrization: str
    widths: list[float]  # effective width of each model (e.g. LeNet's fc width), x-axis of the fit
    l1: dict[str, list[list[float]]] = field(default_factory=dict)  # module -> [width][step] mean |act|
    slopes: dict[str, float] = field(default_factory=dict)  # module -> slope at the last step

    @property
    def max_abs_slope(self) -> float:
        return max(abs(s) for s in self.slopes.values())

    @property
    def max_slope(self) -> float:
        return max(self.slopes.values())

    @property
    def logits_slope(self) -> float:
        return self.slopes[LOGITS]


def slope(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Least-squares slope of log(y) against log(x)."""
    lx, ly = [math.log(x) for x in xs], [math.log(y) for y in ys]
    mx, my = sum(lx) / len(lx), sum(ly) / len(ly)
    return sum((a - mx) * (b - my) for a, b in zip(lx, ly, strict=True)) / sum((a - mx) ** 2 for a in lx)


def coord_check(arch: Arch, settings: CoordSettings, batch: tuple[torch.Tensor, torch.Tensor], *,
                parametrization: str = "mup", seeds: Sequence[int] = (0,),
                num_classes: int | None = None) -> CoordResult:
    """The check of `arch` at `settings.widths`: `settings.nsteps` steps at `settings.lr` on `batch` (x, y), the
    activations averaged over `seeds`."""
    x, y = batch
    widths, lr, nsteps = settings.widths, settings.lr, settings.nsteps
    input_shape = tuple(x.shape[1:])
    k = int(num_classes or int(y.max()) + 1)
    sums: dict[str, list[list[float]]] = defaultdict(lambda: [[0.0] * nsteps for _ in widths])
    eff: list[float] = []
    current = [0]  # step being recorded, read by the hooks
    for wi, width in enumerate(widths):
        for seed in seeds:
            torch.manual_seed(seed)
            model, facts = build_with_facts(dataclasses.replace(arch, width=width), input_shape, k,
                                            parametrization=parametrization)
            if len(eff) == wi:
                # the width the architecture actually scales: LeNet's fc width, a SwiGLU's hidden size, else width
                eff.append(float(facts.get("fc_width") or facts.get("hidden") or facts["width"]))
            opt = make_optimizer(model, lr=lr, beta1=0.9, beta2=0.999, weight_decay=0.0, warmup_steps=0)  # plain
            model.train()
            opt.train()
            hooks = []
            # every submodule whose output is a width-dimensional activation (not the dropout/identity no-ops)
            tracked = [(n, m) for n, m in model.named_modules() if n and not isinstance(m, (nn.Dropout, nn.Identity))]
            for name, module in tracked:

                def hook(_m: nn.Module, _i: Any, out: Any, row: list[float] = sums[name][wi]) -> None:
                    if isinstance(out, torch.Tensor) and out.is_floating_point():
                        row[current[0]] += out.detach().abs().mean().item() / len(seeds)

                hooks.append(module.register_forward_hook(hook))
            for step in range(nsteps):
                current[0] = step
                logits = model(x)
                sums[LOGITS][wi][step] += logits.detach().abs().mean().item() / len(seeds)
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(logits, y).backward()
                opt.step()
            for h in hooks:
                h.remove()
    result = CoordResult(arch.name, parametrization, eff, dict(sums))
    for name, per_width in result.l1.items():
        last = [row[-1] for row in per_width]
        if all(v > 0 for v in last):  # zero-initialised outputs (e.g. logits at step 0) have no slope
            result.slopes[name] = slope(eff, last)
    return result
