"""task=gs_colored_mnist (declared in gs_colored_mnist.py): the paper's Table 2 / Fig. 3 — a 2×300 ReLU
MLP trained full batch with Adam on the pooled training environments of Colored MNIST; one logit (logistic loss), as the
official code.

Reports final train/test accuracy, per-environment accuracy, a learning curve, and the four probes of
Fig. 3 (accuracy and mean predictive entropy in nats on grayscale/coloured × digit/blank test images).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from training.app.lifecycle import JobRun
from training.data.colored_mnist import Environment, colored_mnist, fig3_variants, pooled
from training.engine.regularizers import build_regularizer, task_loss
from training.engine.seeding import seeded_global_rng
from training.tasks.gs.common import method_name, paper_mlp
from training.tasks.gs.result import StarvationSections

log = logging.getLogger(__name__)


@torch.no_grad()
def evaluate(net: nn.Module, x: Tensor, y: Tensor) -> dict[str, float]:
    logits = net(x)
    p = torch.sigmoid(logits[:, 0].double())
    entropy = -(p * p.clamp_min(1e-12).log() + (1 - p) * (1 - p).clamp_min(1e-12).log())
    return {"acc": float(((logits[:, 0] > 0).long() == y).double().mean()), "loss": float(task_loss(logits, y)),
            "entropy": float(entropy.mean())}


@dataclass(frozen=True)
class Environments:
    """The job and its data: the Colored MNIST environments (`dataset.*`), training ones and test."""

    job: JobRun
    envs: dict[str, Environment]


def prepare(job: JobRun) -> Environments:
    return Environments(job, colored_mnist(job.cfg.dataset))


def run(prepared: Environments) -> StarvationSections:
    job, envs = prepared.job, prepared.envs
    cfg, device, seed = job.cfg, job.device, job.cfg.seed
    gs = cfg.task_options  # training/tasks/gs/gs_colored_mnist.py ColoredMnistOptions
    x, y = (t.to(device) for t in pooled(envs))
    test = envs["test"]
    xt, yt = test.x.to(device), test.y.to(device)
    with seeded_global_rng(seed, "init"):
        net = paper_mlp(x[0].numel(), gs.hidden, gs.depth, 1, gs.init)
    net.to(device)
    opt = torch.optim.Adam(net.parameters(), lr=gs.lr, weight_decay=gs.weight_decay)
    reg = build_regularizer(cfg.regularizer, 2)
    every, steps = gs.eval_every, gs.steps
    curve: list[dict[str, float]] = []
    for step in range(steps):
        bf16 = job.numerics is not None and job.numerics.precision == "bf16"  # its forward under autocast
        logits = job.numerics.forward(net, x) if bf16 and job.numerics is not None else net(x)
        loss = task_loss(logits, y)
        if reg is not None:
            loss = loss + reg(logits, y, step)
        if step % every == 0 or step == steps - 1:
            net.eval()
            tr, te = evaluate(net, x, y), evaluate(net, xt, yt)
            net.train()
            curve.append({"step": step, "train_acc": tr["acc"], "train_loss": tr["loss"], "test_acc": te["acc"],
                          "test_loss": te["loss"], "objective": loss.item()})
        opt.zero_grad(set_to_none=True)
        torch.autograd.backward(loss)
        opt.step()
    net.eval()
    source = cfg.dataset.options.source
    out: dict[str, Any] = {"method": method_name(cfg),
           "dataset_source": "MNIST-5k: reduced, 5000 of the 60000 MNIST images" if source == "mnist5k" else source,
           "train": evaluate(net, x, y), "test": evaluate(net, xt, yt),
           "environments": {k: {**e.rates(), **evaluate(net, e.x.to(device), e.y.to(device))} for k, e in envs.items()},
           "fig3": {k: evaluate(net, v.to(device), yt) for k, v in fig3_variants(test).items()},
           "curve": curve}
    log.info("seed %d: train acc %.3f, test acc %.3f; fig3 %s", seed, out["train"]["acc"], out["test"]["acc"],
             {k: round(v["acc"], 3) for k, v in out["fig3"].items()})
    return StarvationSections.read(out)
