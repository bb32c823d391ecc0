"""task=gs_two_moons (declared in gs_two_moons.py): the paper's Fig. 1 — a 2-layer ReLU net trained full
batch with SGD + momentum.

The network has one logit (logistic loss, as the official code). ERM, SD (`regularizer.lam`) and
weight decay (`gs.weight_decay`, an optimizer setting) are config choices of the same job.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from training.app.lifecycle import JobRun
from training.app.schema import JobConfig
from training.data.moons import TwoMoonsOptions, two_moons
from training.engine.numerics import JobNumerics
from training.engine.regularizers import build_regularizer, task_loss
from training.engine.seeding import seeded_global_rng
from training.tasks.gs.common import method_name, paper_mlp
from training.tasks.gs.geometry import Grid, geometry
from training.tasks.gs.result import StarvationSections

log = logging.getLogger(__name__)
BOUNDARY_FILE = "boundary.npz"


def train(cfg: JobConfig, x: torch.Tensor, y: torch.Tensor, device: torch.device,
          numerics: JobNumerics | None = None) -> tuple[nn.Module, list[list[float]]]:
    gs = cfg.task_options  # training/tasks/gs/gs_two_moons.py TwoMoonsOptions
    with seeded_global_rng(cfg.seed, "init"):
        net = paper_mlp(2, gs.hidden, gs.depth, 1, gs.init)
    net.to(device)
    opt = torch.optim.SGD(net.parameters(), lr=gs.lr, momentum=gs.momentum, weight_decay=gs.weight_decay)
    reg = build_regularizer(cfg.regularizer, 2)
    x, y = x.to(device), y.to(device)
    curve, every = [], max(1, gs.steps // 20)
    for step in range(gs.steps):
        bf16 = numerics is not None and numerics.precision == "bf16"  # its forward under autocast; else as ever
        logits = numerics.forward(net, x) if bf16 and numerics is not None else net(x)
        loss = task_loss(logits, y)
        if step % every == 0:
            curve.append([step, loss.item()])
        if reg is not None:
            loss = loss + reg(logits, y, step)
        opt.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)  # loss.backward(), typed
        opt.step()
    return net.eval(), curve


@torch.no_grad()
def metrics(net: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> dict[str, float]:
    logits = net(x.to(device))
    y = y.to(device)
    return {"acc": float(((logits[:, 0] > 0).long() == y).double().mean()), "loss": float(task_loss(logits, y))}


def plot_boundary(path: Path, grid: Grid, x: np.ndarray, y: np.ndarray, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(3.4, 3.4))
    lim = float(np.abs(grid.z).max()) or 1.0
    ax.contourf(grid.xs, grid.ys, grid.z, 20, cmap="RdBu", vmin=-lim, vmax=lim, alpha=0.8)
    ax.contour(grid.xs, grid.ys, grid.z, [0.0], colors="k", linewidths=1.2)
    ax.scatter(x[:, 0], x[:, 1], c=y, cmap="bwr_r", edgecolors="k", s=12, linewidths=0.4)
    ax.set_title(title, fontsize=8)
    ax.set_xticks([])
    ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


@dataclass(frozen=True)
class Moons:
    """The job and its data: the training and test draws of two moons (`dataset.*`)."""

    job: JobRun
    train: tuple[torch.Tensor, torch.Tensor]
    test: tuple[torch.Tensor, torch.Tensor]


def prepare(job: JobRun) -> Moons:
    moons: TwoMoonsOptions = job.cfg.dataset.options
    return Moons(job, two_moons(moons, "train"), two_moons(moons, "test"))


def run(prepared: Moons) -> StarvationSections:
    job, (x, y), (xt, yt) = prepared.job, prepared.train, prepared.test
    cfg, job_dir, device = job.cfg, job.path, job.device
    moons: TwoMoonsOptions = cfg.dataset.options
    net, curve = train(cfg, x, y, device, job.numerics)
    g = cfg.task_options.grid

    @torch.no_grad()
    def logits(points: np.ndarray) -> np.ndarray:  # the net's logit at (m, 2) points
        t = torch.from_numpy(np.asarray(points, dtype=np.float32)).to(device)
        return torch.cat([net(t[i: i + 65536])[:, 0] for i in range(0, len(t), 65536)]).double().cpu().numpy()

    geo, grid = geometry(logits, x.numpy().astype(np.float64), y.numpy(), g.lo, g.hi, g.n)
    np.savez_compressed(job_dir / BOUNDARY_FILE, xs=grid.xs, ys=grid.ys, z=grid.z, x=x.numpy(), y=y.numpy())
    train_m, test_m = metrics(net, x, y, device), metrics(net, xt, yt, device)
    title = f"{method_name(cfg)}, margin {moons.margin}, seed {cfg.seed}"
    plot_boundary(job_dir / "boundary.png", grid, x.numpy(), y.numpy(), title)
    log.info("%s: train acc %.3f, test acc %.3f, min margin %.4f, turning %.3f", title, train_m["acc"],
             test_m["acc"], geo["min_margin"], geo["boundary_turning"])
    return StarvationSections.read({"method": method_name(cfg), "train": train_m, "test": test_m, "geometry": geo,
                                    "train_loss_curve": curve,
                                    "files": {"boundary": BOUNDARY_FILE, "plot": "boundary.png"}})
