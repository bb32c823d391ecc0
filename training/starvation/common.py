"""Gradient Starvation tasks (Pezeshki et al. 2021), declared in training/tasks/gs_*.py; what their implementations
share.

    task=gs_two_moons      2-layer ReLU net, full-batch SGD on two moons: accuracy, margin, boundary shape
    task=gs_colored_mnist  2×300 MLP, full-batch Adam on Colored MNIST: accuracy and the Fig. 3 probes
    task=gs_erased_eval    μP model trained on original data, evaluated on held-out data erased by `eraser`

Each job writes result.json in `paths.job_dir` like an MDL job (skip when done, refuse another config).
The hash covers only the config groups the task reads, so unrelated defaults (arch, optim, …) changing
elsewhere do not invalidate finished two-moons / Colored-MNIST runs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from torch import nn

from training.app.schema import JobConfig
from training.engine.regularizers import SdOptions

log = logging.getLogger(__name__)


def method_name(cfg: JobConfig) -> str:
    """The method a job's config describes (see `method_label`)."""
    sd: SdOptions | None = cfg.regularizer.options if cfg.regularizer.name == "sd" else None
    return method_label(sd, getattr(cfg.task_options, "weight_decay", 0.0))


def method_of_stored(config: Mapping[str, Any]) -> str:
    """The method of a result's stored config (so renaming methods needs no re-run)."""
    from training.app.result_codec import config_view

    c = config_view(config)
    sd = None
    if "regularizer.name" in c and c["regularizer.name"] == "sd":
        given = {k.split(".", 1)[1]: v for k, v in c.items()
                 if k.startswith("regularizer.") and k != "regularizer.name"}
        sd = SdOptions(**{"lam": 0.0, "gamma": 0.0, "start_step": 0, "loss_scale": None, **given})
    return method_label(sd, c["gs.weight_decay"] if "gs.weight_decay" in c else 0.0)


def method_label(sd: SdOptions | None, weight_decay: float) -> str:
    """"ERM" / "SD λ=…", ", loss×s" for the official whole-loss rescale, "(from step t)", "+ WD w"."""
    lam = sd.lam if sd is not None else 0.0
    lam_on = any(v > 0 for v in lam) if isinstance(lam, list) else lam > 0
    scale = sd.loss_scale if sd is not None else None
    name = ", ".join([f"SD λ={lam}" if lam_on else "ERM"] + ([f"loss×{scale}"] if scale is not None else []))
    if sd is not None and (lam_on or scale is not None) and sd.start_step:
        name += f" (from step {sd.start_step})"
    return name + (f" + WD {weight_decay:g}" if weight_decay > 0 else "")


def paper_mlp(in_features: int, hidden: int, depth: int, out: int, init: str = "default") -> nn.Sequential:
    """Plain ReLU MLP as in the official code: `default` PyTorch init (two moons) or `xavier` weights
    with zero biases (Colored MNIST, from the IRM code). Draws from torch's global RNG."""
    dims = [in_features] + [hidden] * depth
    layers: list[nn.Module] = []
    for a, b in zip(dims[:-1], dims[1:], strict=True):
        layers += [nn.Linear(a, b), nn.ReLU()]
    layers.append(nn.Linear(dims[-1], out))
    if init == "xavier":
        for m in layers:
            if isinstance(m, nn.Linear):
                nn.init.xavier_uniform_(m.weight)
                nn.init.zeros_(m.bias)
    elif init != "default":
        raise ValueError(f"gs.init must be default or xavier, got {init!r}")
    return nn.Sequential(nn.Flatten(), *layers)
