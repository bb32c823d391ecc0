"""Spectral Decoupling: the penalty's value and gradient, start step, the official loss rescale, λ=0 == ERM,
and that early stopping / coding see plain cross-entropy."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import Tensor

from models import build_model
from tests.helpers import fit_settings, job_config, optimizer, result_of
from training.app.schema import RegularizerConfig, group_config, load_section
from training.engine.batches import DeviceData
from training.engine.fit import FitResult, Member, TrainData, cross_entropy_sum, fit
from training.engine.regularizers import SpectralDecoupling, build_regularizer, sd_penalty, task_loss
from training.engine.seeding import generator, seeded_global_rng
from training.tasks.mdl.job import run_job

LOGITS = torch.tensor([[1.0, 2.0], [-1.0, 0.0]], dtype=torch.float64)
Y = torch.tensor([0, 1])


def test_penalty_hand_computed() -> None:
    # mean(z²) = (1 + 4 + 1 + 0) / 4 = 1.5
    assert float(sd_penalty(LOGITS, Y, 0.5)) == pytest.approx(0.75)
    # per class: row 0 (y=0): 0.5·((1−1)² + (2−1)²) = 0.5; row 1 (y=1): 2·((−1+1)² + (0+1)²) = 2; / 4 entries
    lam, gamma = torch.tensor([0.5, 2.0]), torch.tensor([1.0, -1.0])
    assert float(sd_penalty(LOGITS, Y, lam, gamma)) == pytest.approx(2.5 / 4)
    reg = build_regularizer(group_config("regularizer", "sd", lam=[0.5, 2.0], gamma=[1.0, -1.0]), num_classes=2)
    assert reg is not None
    assert float(reg(LOGITS, Y, 0)) == pytest.approx(2.5 / 4)


@pytest.mark.parametrize("shape", [(7, 3), (9, 1)])
def test_gradient_matches_analytic(shape: tuple[int, int]) -> None:
    g = torch.Generator().manual_seed(0)
    z = torch.randn(*shape, generator=g, dtype=torch.float64, requires_grad=True)
    y = torch.randint(0, 3 if shape[1] > 1 else 2, (shape[0],), generator=g)
    lam, gamma = torch.tensor([0.3, 1.1, 0.7]), torch.tensor([0.5, -2.0, 1.0])
    lam, gamma = (lam, gamma) if shape[1] > 1 else (lam[:2], gamma[:2])
    sd_penalty(z, y, lam, gamma).backward()
    analytic = 2 * lam[y][:, None] * (z.detach() - gamma[y][:, None]) / z.numel()
    torch.testing.assert_close(z.grad, analytic.double())
    assert torch.autograd.gradcheck(lambda t: sd_penalty(t, y, lam, gamma), (z.detach().requires_grad_(),))


def test_start_step_and_official_rescale() -> None:
    z = LOGITS.clone().requires_grad_()
    reg = build_regularizer(group_config("regularizer", "sd", lam=1.0, start_step=450, loss_scale=2e-5), 2)
    assert isinstance(reg, SpectralDecoupling)
    assert float(reg(z, Y, 449)) == 0.0
    # The fit loop adds the regularizer to CE: CE + reg == scale · (CE + λ·mean(z²)) from the start step on.
    ce = F.cross_entropy(z, Y)
    total = ce + reg(z, Y, 450)
    assert total.item() == pytest.approx(2e-5 * (ce.item() + 1.5), rel=1e-12)
    total.backward()
    z2 = LOGITS.clone().requires_grad_()
    (2e-5 * (F.cross_entropy(z2, Y) + z2.square().mean())).backward()
    torch.testing.assert_close(z.grad, z2.grad)


def test_binary_single_logit_uses_logistic_loss() -> None:
    z, y = torch.tensor([[0.3], [-1.2]]), torch.tensor([1, 0])
    expected = (math.log1p(math.exp(-0.3)) + math.log1p(math.exp(-1.2))) / 2
    assert float(task_loss(z, y)) == pytest.approx(expected, rel=1e-6)


def test_config_errors() -> None:
    assert build_regularizer(None, 3) is None and build_regularizer(group_config("regularizer", "none"), 3) is None
    with pytest.raises(ValueError, match="per-class"):
        build_regularizer(group_config("regularizer", "sd", lam=[0.1, 0.2]), 3)
    with pytest.raises(ValueError, match="regularizer.name='dropout' is not allowed"):
        load_section(RegularizerConfig, {"name": "dropout"}, "regularizer.")
    with pytest.raises(ValueError, match="loss_scale=0 is not allowed"):
        group_config("regularizer", "sd", loss_scale=0)
    for bad in (-1, float("nan"), [0.1, -0.2]):
        with pytest.raises(ValueError, match="regularizer.lam=.* is not allowed"):
            group_config("regularizer", "sd", lam=bad)


def _fit_mup_mlp(reg_cfg: dict | None,  # regularizer=sd's overrides, or None
                 epochs: int = 3) -> tuple[torch.nn.Module, FitResult, tuple[Tensor, Tensor]]:
    g = torch.Generator().manual_seed(1)
    x, y = torch.rand(96, 1, 4, 4, generator=g), torch.arange(96) % 3
    xv, yv = torch.rand(32, 1, 4, 4, generator=g), torch.arange(32) % 3
    arch = group_config("arch", "mlp", width=16, depth=2, base_width=8)
    with seeded_global_rng(0, "init"):
        model = build_model(arch, (1, 4, 4), 3)
    opt = optimizer(model, lr=1e-2, beta1=0.9)
    cfg = fit_settings(batch_size=32, patience=100, max_epochs=epochs, progress=False)
    res = fit(Member(model, opt, torch.arange(len(y)), generator(0, "batches"), cfg),
              TrainData(DeviceData(x, x.device, storage="float32"), y, xv, yv),
              build_regularizer(None if reg_cfg is None else group_config("regularizer", "sd", **reg_cfg), 3))
    return model, res, (xv, yv)


def test_lambda_zero_reproduces_erm_exactly_and_early_stopping_sees_plain_cross_entropy() -> None:
    erm, _, _ = _fit_mup_mlp(None)
    sd0, _, _ = _fit_mup_mlp({"lam": 0.0})
    model, res, (xv, yv) = _fit_mup_mlp({"lam": 10.0})
    a, b, c = erm.state_dict(), sd0.state_dict(), model.state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)  # and λ > 0 does change training
    # The restored best state's validation loss is the plain CE (no penalty) of the returned model.
    assert res.best_val_loss == pytest.approx(cross_entropy_sum(model, xv, yv) / len(yv), rel=1e-9)


def test_mdl_job_with_sd_and_temperature(tmp_path: Path) -> None:
    quick = ["dataset=digits", "mdl=quick", "mdl.max_epochs=4", "mdl.num_blocks=3", "optim.warmup_steps=10",
             "certificate=false", "mdl.full_run=false", "arch.width=32", "mdl.calibrate_temperature=true"]
    erm = result_of(run_job(job_config(tmp_path / "erm", quick)))
    sd = result_of(run_job(job_config(tmp_path / "sd", [*quick, "regularizer=sd", "regularizer.lam=0.5"])))
    assert sd["config"]["regularizer"]["name"] == "sd"
    temps = [b["temperature"] for b in sd["mdl"]["blocks"]]
    assert all(t > 0 for t in temps)
    assert sd["mdl"]["block_ce_bits"] != erm["mdl"]["block_ce_bits"]
    assert sd["mdl"]["bits_per_sample"] < math.log2(10)
