"""Gradient Starvation tasks (Pezeshki et al. 2021), registered with `training.app.tasks` on import.

    task=gs_two_moons      2-layer ReLU net, full-batch SGD on two moons: accuracy, margin, boundary shape
    task=gs_colored_mnist  2×300 MLP, full-batch Adam on Colored MNIST: accuracy and the Fig. 3 probes
    task=gs_erased_eval    μP model trained on original data, evaluated on held-out data erased by `eraser`

Each job writes result.json in `paths.job_dir` like an MDL job (skip when done, refuse another config).
The hash covers only the config groups the task reads, so unrelated defaults (arch, optim, …) changing
elsewhere do not invalidate finished two-moons / Colored-MNIST runs.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from training.app.results import JobDir, to_plain
from training.app.schema import HASH_VERSION, config_hash, load_config
from training.engine.devices import resolve_device

log = logging.getLogger(__name__)
Body = Callable[[dict[str, Any], Path, torch.device], dict[str, Any]]


def run_task(config: Mapping[str, Any], body: Body) -> dict[str, Any]:
    """Skip/refuse logic, timing and the atomic result.json around a task body (the hash covers the config groups
    the task's registry entry `uses`)."""
    cfg = load_config(config)  # bad values fail here, with one line, before any directory or data
    job = JobDir(Path(cfg["paths"]["job_dir"]), config_hash(cfg), bool(cfg.get("force", False)))
    with job.locked():
        if (done := job.finished()) is not None:
            return done
        t0 = time.perf_counter()
        device = resolve_device(str(cfg.get("device", "auto")))
        out = body(cfg, job.path, device)
        result = {"config_hash": job.cfg_hash, "hash_version": HASH_VERSION, "job_dir": str(job.path),
                  "task": cfg["task"], "method": method_name(cfg), "config": to_plain(cfg), **out,
                  "device": str(device),
                  "timings": {"total_s": time.perf_counter() - t0}}
        job.write_result(result)
    log.info("done %s (%s, %.1fs)", job.path, result["method"], result["timings"]["total_s"])
    return result


def method_name(cfg: Mapping[str, Any]) -> str:
    """"ERM" / "SD λ=…", ", loss×s" for the official whole-loss rescale, "(from step t)", "+ WD w"."""
    reg = cfg.get("regularizer") or {}
    sd = reg.get("name") == "sd"
    lam = reg.get("lam", 0.0) if sd else 0.0
    lam_on = any(float(v) > 0 for v in lam) if isinstance(lam, list) else float(lam) > 0
    scale = reg.get("loss_scale") if sd else None
    name = ", ".join([f"SD λ={lam}" if lam_on else "ERM"] + ([f"loss×{scale}"] if scale is not None else []))
    if sd and (lam_on or scale is not None) and reg.get("start_step"):
        name += f" (from step {reg['start_step']})"
    wd = float((cfg.get("gs") or {}).get("weight_decay", 0.0) or 0.0)
    return name + (f" + WD {wd:g}" if wd > 0 else "")


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
