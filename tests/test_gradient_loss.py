"""Gradient moment erasure: the paper's squared loss (§2.4) and optional 8-bit quantisation."""

from __future__ import annotations

import pytest
import torch

import erasure
from erasure.gradient import DEFAULTS, _loss

from .test_erasure_common import F64, gaussian_classes


def test_loss_is_the_squared_distances_and_so_are_its_gradients() -> None:
    """∂/∂X w‖m − μ‖² = 2w(m − μ)/n per row and ∂/∂X w‖Σ_k − Σ‖_F² = 4w/(n−1)·X_c(Σ_k − Σ): linear in the gap
    (an unsquared norm would give a unit-length direction instead)."""
    x, y = gaussian_classes(300, 6, 2, seed=2, cov_scale=0.7)
    x = torch.sigmoid(x)
    mu, sigma = x.mean(0), torch.cov(x.T)
    xk0 = x[y == 0]
    xk = xk0 + 0.01 * torch.randn(xk0.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    o = {**DEFAULTS, "w_mean": 0.3, "w_cov": 0.7, "w_mse": 2.0}
    with torch.no_grad():
        loss, stats = _loss(xk, xk0, mu, sigma, o)
    mean_sq = float((xk.mean(0) - mu).pow(2).sum())
    cov_sq = float((torch.cov(xk.T) - sigma).pow(2).sum())
    mse = float((xk - xk0).pow(2).mean())
    assert float(loss) == pytest.approx(0.3 * mean_sq + 0.7 * cov_sq + 2.0 * mse, rel=1e-12)
    # the reported gaps stay relative norms (not squared)
    assert stats["mean_gap"] == pytest.approx(mean_sq**0.5 / float(torch.trace(sigma)) ** 0.5, rel=1e-12)
    assert stats["cov_gap"] == pytest.approx(cov_sq**0.5 / float(torch.linalg.matrix_norm(sigma)), rel=1e-12)
    n = len(xk)
    for w_mean, w_cov in ((1.0, 0.0), (0.0, 1.0)):
        xg = xk.clone().requires_grad_(True)
        o = {**DEFAULTS, "w_mean": w_mean, "w_cov": w_cov, "w_mse": 0.0}
        (grad,) = torch.autograd.grad(_loss(xg, xk0, mu, sigma, o)[0], xg)
        xc = xk - xk.mean(0)
        expected = (2 * (xk.mean(0) - mu) / n).expand_as(xk) if w_mean else 4 / (n - 1) * xc @ (torch.cov(xk.T) - sigma)
        assert torch.allclose(grad, expected, rtol=1e-10, atol=1e-14)


def test_quantize_rounds_to_8_bits_and_reports_gaps_after_rounding() -> None:
    x, y = gaussian_classes(400, 10, 2, seed=5, cov_scale=0.6)
    x = (torch.sigmoid(x) * 255).round() / 255
    out, rep = erasure.erase("gradient", x, y, {"iterations": 20, "quantize": True, "progress": False,
                                                  "device": "cpu", "w_mean": 1.0, "w_cov": 1.0})
    assert rep["quantized"] and rep["loss"] == "squared"
    assert torch.equal(out, (out * 255).round() / 255)
    assert float(out.min()) >= 0 and float(out.max()) <= 1
    gaps = [float((out[y == c].mean(0) - x.mean(0)).norm()) for c in range(2)]
    assert rep["max_mean_gap_after"] == pytest.approx(max(gaps) / float(torch.cov(x.T).trace().sqrt()), rel=1e-9)
    assert rep["max_mean_gap_after"] < rep["max_mean_gap_before"]
    plain, rep_plain = erasure.erase("gradient", x, y, {"iterations": 20, "progress": False, "device": "cpu",
                                                          "w_mean": 1.0, "w_cov": 1.0})
    assert not rep_plain["quantized"] and not torch.equal(plain, (plain * 255).round() / 255)
    assert float((plain - out).abs().max()) <= 0.5 / 255 + 1e-12  # the same optimisation, rounded
