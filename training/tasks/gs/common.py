"""What the Gradient Starvation tasks' implementations share (the tasks: training/tasks/gs/__init__.py). Each job
writes result.json in `paths.job_dir` like an MDL job (skip when done, refuse another config); its hash covers only
the config groups the task reads, so unrelated defaults (arch, optim, …) changing elsewhere do not invalidate
finished two-moons / Colored-MNIST runs."""

from __future__ import annotations

from torch import nn

from training.app.schema import JobConfig
from training.engine.regularizers import SdOptions, method_label


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
