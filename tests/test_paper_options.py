"""The paper code's details as eraser options (defaults unchanged): ALF-QLEACE's stop norm, gradient erasure's
unsquared loss and 8-bit truncation."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import erasure
from erasure.gradient import DEFAULTS, _loss, quantize

from .test_erasure_common import F64, gaussian_classes

# ---------------------------------------------------------------- ALF-QLEACE stop_norm

A = torch.tensor([0.8, 0.4, 0.39, 0.38, 0.37, 0.36, 0.35, 0.34, 0.33, 0.32], dtype=F64)


def _exact_classes(n_per_class: int = 400) -> tuple[Tensor, Tensor]:
    """Two classes with exact sample moments: coordinates 0..9 have class variances 1 ± a (so after LEACE
    D_0 = diag(a), D_1 = −diag(a)), coordinate 10 carries the mean difference (±0.5), coordinate 11 is noise."""
    g = torch.Generator().manual_seed(0)
    xs, ys = [], []
    for c, sign in enumerate((1.0, -1.0)):
        z = torch.randn(n_per_class, 12, generator=g, dtype=F64)
        z = z - z.mean(0)
        z = z @ torch.linalg.inv(torch.linalg.cholesky(torch.cov(z.T))).T  # sample covariance exactly I
        var = torch.ones(12, dtype=F64)
        var[:10] += sign * A
        mean = torch.zeros(12, dtype=F64)
        mean[10] = 0.5 * sign
        xs.append(mean + z * var.sqrt())
        ys.append(torch.full((n_per_class,), c))
    return torch.cat(xs), torch.cat(ys)


def test_alf_frobenius_stop_removes_more_directions_than_spectral() -> None:
    """target 0.4: the spectral rule stops once max ‖D_k‖₂ ≤ 0.6·0.8 = 0.48, i.e. after removing the 0.8 direction
    (1 direction); the Frobenius rule needs √(Σ remaining a²) ≤ 0.6·‖a‖ and removes the largest first."""
    x, y = _exact_classes()
    spectral = erasure.fit("alf_qleace", x, y, target=0.4).report()
    frob = erasure.fit("alf_qleace", x, y, target=0.4, stop_norm="frobenius").report()
    sq = (A**2).flip(0).cumsum(0).flip(0)  # Σ_{j ≥ i} a_j²: Frobenius² left after removing the i largest
    expected = int((sq > (0.6**2) * sq[0]).sum())
    assert expected == 5  # vs 1 for the spectral rule
    assert spectral["leace_rank"] == frob["leace_rank"] == 1
    assert spectral["alf_directions"] == 1 and spectral["deviation_norm"] == "spectral"
    assert frob["alf_directions"] == expected and frob["deviation_norm"] == "frobenius"
    assert frob["initial_worst_deviation"] == pytest.approx(float(A.norm()), rel=1e-8)
    assert spectral["initial_worst_deviation"] == pytest.approx(0.8, rel=1e-8)
    assert frob["final_worst_deviation"] == pytest.approx(float(sq[expected].sqrt()), rel=1e-6)
    assert frob["worst_deviation_history"][:2] == pytest.approx([float(sq[0].sqrt()), float(sq[1].sqrt())], rel=1e-6)
    assert frob["options"]["stop_norm"] == "frobenius"
    with pytest.raises(ValueError, match="stop_norm"):
        erasure.fit("alf_qleace", x, y, stop_norm="nuclear")


# ---------------------------------------------------------------- gradient erasure: loss and quantize_mode


def test_quantize_modes_on_known_values() -> None:
    levels = torch.tensor([0, 3, 127, 254], dtype=F64)
    x = (levels + 0.7) / 255  # 0.7 of the way to the next level
    assert torch.equal(quantize(x, "round"), (levels + 1) / 255)
    assert torch.equal(quantize(x, "truncate"), levels / 255)
    assert torch.equal(quantize(torch.tensor([0.5], dtype=F64), "round"), torch.tensor([128 / 255], dtype=F64))
    assert torch.equal(quantize(torch.tensor([0.5], dtype=F64), "truncate"), torch.tensor([127 / 255], dtype=F64))
    exact = torch.arange(256, dtype=F64) / 255
    assert torch.equal(quantize(exact, "truncate"), exact) and torch.equal(quantize(exact, "round"), exact)


def _gradient(x: Tensor, y: Tensor, **options: object) -> tuple[Tensor, dict]:
    return erasure.erase("gradient", x, y, {"iterations": 10, "progress": False, "device": "cpu", **options})


def test_quantize_mode_truncate_floors_the_optimised_images() -> None:
    x, y = gaussian_classes(200, 6, 2, seed=3, cov_scale=0.6)
    x = torch.sigmoid(x)
    raw, _ = _gradient(x, y)
    rounded, rep_r = _gradient(x, y, quantize=True)
    truncated, rep_t = _gradient(x, y, quantize=True, quantize_mode="truncate")
    assert torch.equal(rounded, torch.round(raw * 255) / 255)  # the default, as before
    assert torch.equal(truncated, torch.floor(raw * 255) / 255)
    assert not torch.equal(rounded, truncated) and bool((truncated <= rounded).all())
    assert rep_t["options"]["quantize_mode"] == "truncate" and rep_r["options"]["quantize_mode"] == "round"
    with pytest.raises(ValueError, match="quantize_mode"):
        _gradient(x, y, quantize=True, quantize_mode="ceil")


def test_norm_loss_is_the_unsquared_distances() -> None:
    """loss='norm': w_mean‖m − μ‖ + w_cov‖Σ_k − Σ‖_F + w_mse·mse; the mean term's gradient per row is the unit
    direction / n whatever the gap's size (the squared loss's is 2(m − μ)/n, proportional to it)."""
    x, y = gaussian_classes(300, 6, 2, seed=2, cov_scale=0.7)
    x = torch.sigmoid(x)
    mu, sigma = x.mean(0), torch.cov(x.T)
    xk0 = x[y == 0]
    xk = xk0 + 0.01 * torch.randn(xk0.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    o = {**DEFAULTS, "w_mean": 0.3, "w_cov": 0.7, "w_mse": 2.0, "loss": "norm"}
    with torch.no_grad():
        loss, stats = _loss(xk, xk0, mu, sigma, o)
        squared, stats_sq = _loss(xk, xk0, mu, sigma, {**o, "loss": "squared"})
    mean_d = float((xk.mean(0) - mu).norm())
    cov_d = float((torch.cov(xk.T) - sigma).norm())
    mse = float((xk - xk0).pow(2).mean())
    assert float(loss) == pytest.approx(0.3 * mean_d + 0.7 * cov_d + 2.0 * mse, rel=1e-12)
    assert float(squared) == pytest.approx(0.3 * mean_d**2 + 0.7 * cov_d**2 + 2.0 * mse, rel=1e-12)
    assert stats["mean_gap"] == pytest.approx(stats_sq["mean_gap"], rel=1e-12)  # reported gaps do not change
    n = len(xk)
    for shift in (1.0, 3.0):
        xs = (xk0 + shift * (xk - xk0)).requires_grad_(True)
        (g,) = torch.autograd.grad(_loss(xs, xk0, mu, sigma, {**o, "w_cov": 0.0, "w_mse": 0.0, "w_mean": 1.0})[0], xs)
        gap = xs.detach().mean(0) - mu
        assert torch.allclose(g, (gap / gap.norm() / n).expand_as(g), rtol=1e-10, atol=1e-15)


def test_norm_loss_end_to_end_differs_and_is_reported() -> None:
    x, y = gaussian_classes(200, 6, 2, seed=4, cov_scale=0.6)
    x = torch.sigmoid(x)
    sq, rep_sq = _gradient(x, y, w_mean=1.0, w_cov=1.0)
    nrm, rep_n = _gradient(x, y, w_mean=1.0, w_cov=1.0, loss="norm")
    assert rep_sq["loss"] == "squared" and rep_n["loss"] == "norm"
    assert not torch.allclose(sq, nrm)
    assert torch.isfinite(nrm).all() and rep_n["max_mean_gap_after"] < rep_n["max_mean_gap_before"]
    with pytest.raises(ValueError, match="loss"):
        _gradient(x, y, loss="abs")
