"""LEACE: equal class means, idempotence, minimal edit, oracle agreement with concept-erasure."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import erasure
from erasure.leace import LeaceEraser

from .test_erasure_common import F64, class_stats, gaussian_classes, max_mean_gap


@pytest.mark.parametrize("d, k", [(5, 2), (16, 3), (40, 10), (64, 4)])
def test_class_means_equal_idempotent_and_as_concept_erasure(d: int, k: int) -> None:
    from concept_erasure import LeaceFitter

    x, y = gaussian_classes(20 * d + 50 * k, d, k, seed=d + k, spectrum=1.5)
    assert max_mean_gap(x, y) > 0.05
    e = erasure.fit("leace", x, y)
    xe = e(x)
    assert max_mean_gap(xe, y) <= 1e-10
    assert e.report()["rank_removed"] == k - 1
    assert torch.allclose(e(xe), xe, rtol=0, atol=1e-12 * float(x.abs().max()))
    # the global mean is preserved
    assert torch.allclose(xe.mean(0), x.mean(0), atol=1e-12)
    # the oracle (never imported by erasure/)
    z = torch.nn.functional.one_hot(y, k).to(F64)
    theirs = LeaceFitter.fit(x, z, svd_tol=1e-9, shrinkage=False, constrain_cov_trace=False).eraser(x)
    assert float((xe - theirs).norm() / (x - x.mean(0)).norm()) < 1e-8


def test_float32_input_is_fitted_in_float64() -> None:
    """An image-like spectrum (cond ~1e4): float32 statistics would leave a ~1e-3 mean gap."""
    x, y = gaussian_classes(4000, 64, 10, seed=3, spectrum=2.2)
    x32 = x.float()
    out = erasure.fit("leace", x32, y)(x32)
    assert out.dtype == torch.float32
    # the float32 output carries only float32 rounding (~1e-7), not a float32-fit failure
    assert max_mean_gap(out, y) < 1e-5
    assert max_mean_gap(x32, y) > 0.05


def _edit_cost(a: Tensor, cov: Tensor, metric: Tensor) -> float:
    """E‖A(x − μ)‖²_M = tr(M A Σ Aᵀ) for the edit x' = x − A(x − μ)."""
    return float(torch.trace(metric @ a @ cov @ a.T))


def test_minimal_edit_among_mean_equalising_affine_erasers() -> None:
    d, k = 10, 4
    x, y = gaussian_classes(3000, d, k, seed=5, spectrum=1.0)
    e = erasure.fit("leace", x, y)
    assert isinstance(e, LeaceEraser)
    a_leace = e.matrix()
    orth = erasure.fit("leace", x, y, method="orth")
    assert isinstance(orth, LeaceEraser)
    a_orth = orth.matrix()
    cov = torch.cov(x.T)
    means, _, priors = class_stats(x, y)
    cross = ((means - x.mean(0)) * priors[:, None]).T  # ∝ Cov(x, one-hot z)
    u, s, _ = torch.linalg.svd(cross, full_matrices=False)
    u = u[:, s > 1e-12 * s[0]]
    off = torch.eye(d, dtype=F64) - u @ u.T  # A = A_leace + R (I − UUᵀ) keeps A Σ_xz = Σ_xz
    g = torch.Generator().manual_seed(0)
    r = torch.randn(d, d, generator=g, dtype=F64)
    metrics = {"euclidean": torch.eye(d, dtype=F64), "covariance": torch.linalg.inv(cov),
               "random_psd": (lambda m: m @ m.T)(r)}
    alternatives = [a_orth] + [a_leace + eps * torch.randn(d, d, generator=g, dtype=F64) @ off
                               for eps in (1e-4, 1e-2, 1.0) for _ in range(5)]
    for alt in alternatives:  # each alternative is a valid eraser: class means become equal
        assert max_mean_gap(x - (x - x.mean(0)) @ alt.T, y) < 1e-9
    for name, m in metrics.items():
        best = _edit_cost(a_leace, cov, m)
        for alt in alternatives:
            assert _edit_cost(alt, cov, m) >= best * (1 - 1e-10), name
        assert _edit_cost(a_orth, cov, m) > best * 1.001, name  # orth is strictly worse here


def test_rank_deficient_covariance() -> None:
    """Constant and duplicated features: pseudo-whitening on the support, means still equal."""
    x, y = gaussian_classes(600, 8, 3, seed=9)
    x = torch.cat([x, torch.full((600, 2), 0.5, dtype=F64), x[:, :1]], 1)
    e = erasure.fit("leace", x, y)
    xe = e(x)
    assert e.report()["support_rank"] == 8
    assert torch.isfinite(xe).all()
    assert max_mean_gap(xe, y) <= 1e-10
    assert torch.allclose(xe[:, 8:10], x[:, 8:10], rtol=0, atol=1e-12)  # constant pixels untouched
