"""A short real training run per architecture on sklearn digits (8×8, 1 channel) lowers validation loss."""

from __future__ import annotations

from typing import Any

import pytest
import torch
import torch.nn.functional as F
from schedulefree import AdamWScheduleFree
from sklearn.datasets import load_digits

from models import build_model
from tests.helpers import optimizer
from tests.test_models import arch_cfg

# arch overrides and (lr, steps): small, fast models; lr above the paper's so a few steps suffice
SETUPS: dict[str, tuple[dict[str, Any], float, int]] = {
    "mlp": ({}, 3e-3, 40),
    "mlp_swiglu": ({"activation": "swiglu"}, 3e-3, 40),
    "lenet": ({}, 3e-3, 40),
    "convnext": ({"depth": 1, "width": 16}, 2e-3, 30),
    "swin": ({"depth": 1, "width": 16, "drop_path_rate": 0.0}, 1e-3, 60),
}


@pytest.fixture(scope="module")
def digits() -> tuple[torch.Tensor, ...]:
    d = load_digits()
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(d.target), generator=g)
    x = torch.tensor(d.data, dtype=torch.float32).reshape(-1, 1, 8, 8)[perm] / 16.0
    y = torch.tensor(d.target)[perm]
    return x[:1200], y[:1200], x[1200:1600], y[1200:1600]


@torch.no_grad()
def val_loss(model: torch.nn.Module, opt: AdamWScheduleFree, x: torch.Tensor, y: torch.Tensor) -> float:
    model.eval()
    opt.eval()  # schedule-free: evaluate at the averaged weights
    loss = F.cross_entropy(model(x), y).item()
    model.train()
    opt.train()
    return loss


@pytest.mark.parametrize("setup", list(SETUPS))
def test_short_training_lowers_validation_loss(setup: str, digits: tuple[torch.Tensor, ...]) -> None:
    xtr, ytr, xva, yva = digits
    overrides, lr, steps = SETUPS[setup]
    name = setup.split("_")[0]
    torch.manual_seed(0)
    model = build_model(arch_cfg(name, **overrides), (1, 8, 8), 10)
    opt = optimizer(model, lr=lr, beta1=0.9)
    model.train()
    opt.train()
    start = val_loss(model, opt, xva, yva)
    assert start == pytest.approx(2.302585, abs=1e-4)  # zero-initialised readout: uniform prediction
    g = torch.Generator().manual_seed(1)
    for _ in range(steps):
        idx = torch.randint(0, len(ytr), (64,), generator=g)
        loss = F.cross_entropy(model(xtr[idx]), ytr[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    end = val_loss(model, opt, xva, yva)
    assert end < 0.75 * start, (start, end)
