"""The paper's optimiser settings per (architecture, eraser, dataset) and the depth learning-rate rule."""

from __future__ import annotations

import re
from typing import Any

# Eraser families. The paper states ConvNeXt rates for control / LEACE / QLEACE / ALF only. Our choices:
# random projection (a linear, rank-matched baseline) takes LEACE's rate; gradient-based moment erasure
# (a quadratic eraser, like QLEACE and ALF) takes the quadratic rate.
_CONTROL = {"control", "none", "identity"}
_LINEAR = {"leace", "random", "randomprojection"}
_QUADRATIC = {"qleace", "alfqleace", "alf", "gradient", "gradientquadratic", "gradientmoment"}

_CONVNEXT_LR = {"control": 5e-5, "linear": 1e-4, "quadratic": 1e-3}


def eraser_family(eraser_name: str) -> str:
    key = re.sub(r"[^a-z0-9]", "", eraser_name.lower())
    for family, names in (("control", _CONTROL), ("linear", _LINEAR), ("quadratic", _QUADRATIC)):
        if key in names:
            return family
    raise ValueError(
        f"unknown eraser {eraser_name!r}; known: {sorted(_CONTROL | _LINEAR | _QUADRATIC)} (case/_/- ignored)"
    )


def paper_defaults(arch_name: str, eraser_name: str, dataset_name: str) -> dict[str, Any]:
    """lr, beta1 and warmup steps used by the paper (weight decay is always 0)."""
    arch = arch_name.lower()
    if arch == "mlp":
        lr = 1e-4 if dataset_name.lower().startswith("svhn") else 5e-4
        return {"lr": lr, "beta1": 0.95, "warmup_steps": 1000}
    if arch == "lenet":
        return {"lr": 5e-4, "beta1": 0.95, "warmup_steps": 0}
    if arch == "convnext":
        return {"lr": _CONVNEXT_LR[eraser_family(eraser_name)], "beta1": 0.9, "warmup_steps": 0}
    if arch == "swin":
        return {"lr": 1e-3, "beta1": 0.9, "warmup_steps": 0}
    raise ValueError(f"unknown architecture {arch_name!r}")


def depth_exponent(arch_name: str) -> float:
    """3/2 for MLPs (Jelassi et al. 2023), the paper's conservative 1/2 for everything else."""
    return 1.5 if arch_name.lower() == "mlp" else 0.5
