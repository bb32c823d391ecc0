"""Gradient Starvation tasks (Pezeshki et al. 2021), declared in training/tasks/gs/gs_*.py; what their implementations
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

from torch import nn

from training.app.schema import JobConfig
from training.engine.regularizers import SdOptions, method_label

log = logging.getLogger(__name__)


def method_name(cfg: JobConfig) -> str:
    """The method a job's config describes (see `method_label`)."""
    sd: SdOptions | None = cfg.regularizer.options if cfg.regularizer.name == "sd" else None
    return method_label(sd, getattr(cfg.task_options, "weight_decay", 0.0))


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
