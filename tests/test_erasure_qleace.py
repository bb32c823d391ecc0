"""QLEACE: equal class means and covariances, PD maps, barycenter stationarity, concept-erasure oracle."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor

import erasure
from erasure.barycenter import barycenter
from erasure.qleace import QleaceEraser

from .test_erasure_common import F64, class_stats, gaussian_classes, max_cov_gap, max_mean_gap


def _psd_pow(a: Tensor, p: float) -> Tensor:
    vals, vecs = torch.linalg.eigh((a + a.mT) / 2)
    return (vecs * (vals.clamp_min(0) ** p).unsqueeze(-2)) @ vecs.mT


def _fit(x: Tensor, y: Tensor, **options: object) -> QleaceEraser:
    e = erasure.fit("qleace", x, y, **options)
    assert isinstance(e, QleaceEraser)
    return e


@pytest.mark.parametrize("n, d, k, spectrum", [(600, 4, 2, 0.0), (3000, 12, 3, 1.0), (6000, 24, 10, 1.5),
                                               (4000, 32, 5, 2.0)])
def test_equal_moments_pd_maps_and_stationarity(n: int, d: int, k: int, spectrum: float) -> None:
    x, y = gaussian_classes(n, d, k, seed=n + d, spectrum=spectrum, cov_scale=0.6)
    assert max_cov_gap(x, y) > 0.1
    e = _fit(x, y)
    xe = e(x, y)
    rep = e.report()
    assert rep["barycenter_converged"] and rep["barycenter_iterations"] >= 1
    assert rep["barycenter_residual"] <= 1e-8 and rep["rank_handling"] == "none"
    assert max_mean_gap(xe, y) <= 1e-10
    assert max_cov_gap(xe, y) <= 1e-8
    # maps are symmetric positive definite
    maps = e.maps_full()
    assert torch.allclose(maps, maps.mT, atol=1e-12)
    assert float(torch.linalg.eigvalsh(maps).min()) > 0
    # the barycenter is stationary for Σ w_k W₂²: the OT maps from it to the classes average to I
    _, covs, priors = class_stats(x, y)
    bary = e.barycenter_full()
    s, s_inv = _psd_pow(bary, 0.5), _psd_pow(bary, -0.5)
    to_class = s_inv @ _psd_pow(s @ covs @ s, 0.5) @ s_inv
    resid = torch.einsum("k,kij->ij", priors, to_class) - torch.eye(d, dtype=F64)
    assert float(torch.linalg.matrix_norm(resid)) / d**0.5 < 2e-8  # = the reported residual ≤ tol
    # ... and the erased class covariances equal it
    _, covs_after, _ = class_stats(xe, y)
    assert float(torch.linalg.matrix_norm(covs_after - bary).max() / torch.linalg.matrix_norm(bary)) < 1e-8


@pytest.mark.parametrize("k, priors", [(2, [0.3, 0.7]), (5, None), (10, None)])
def test_matches_concept_erasure_quadratic_fitter(k: int, priors: list[float] | None) -> None:
    """Oracle only (never imported by erasure/): k=2 uses its closed-form midpoint, k>2 its fixed point."""
    from concept_erasure import QuadraticFitter

    x, y = gaussian_classes(400 * k, 16, k, seed=k, spectrum=1.0, cov_scale=0.5, priors=priors)
    ours = _fit(x, y).maps_full()
    theirs = QuadraticFitter.fit(x, y, shrinkage=False).eraser.ot_maps
    assert float(torch.linalg.matrix_norm(ours - theirs).max() / torch.linalg.matrix_norm(theirs).max()) < 1e-6


def test_plain_fixed_point_agrees_with_anderson_and_reports_nonconvergence() -> None:
    x, y = gaussian_classes(3000, 10, 4, seed=11, cov_scale=0.8)
    a = _fit(x, y)
    b = _fit(x, y, anderson=0)
    assert float((a.maps_full() - b.maps_full()).norm() / b.maps_full().norm()) < 1e-7
    hist = b.report()["barycenter_history"]
    assert hist[-1] < hist[0] * 1e-6  # the plain fixed point converges too
    with pytest.warns(UserWarning, match="barycenter stopped after 1 iterations"):
        c = _fit(x, y, max_iter=1)
    assert not c.report()["barycenter_converged"] and c.report()["barycenter_iterations"] == 1
    # even unconverged, every class is mapped exactly onto the same covariance
    assert max_cov_gap(c(x, y), y) <= 1e-8


def test_barycenter_of_commuting_covariances_is_closed_form() -> None:
    """Diagonal covariances commute: the barycenter is (Σ w_k Σ_k^½)²."""
    g = torch.Generator().manual_seed(0)
    diag = torch.rand(3, 6, generator=g, dtype=F64) + 0.1
    w = torch.tensor([0.2, 0.3, 0.5], dtype=F64)
    res = barycenter(torch.diag_embed(diag), w)
    expected = torch.diag((w @ diag.sqrt()) ** 2)
    assert torch.allclose(res.cov, expected, atol=1e-12)
    assert torch.allclose(res.maps, torch.diag_embed((expected.diagonal() / diag).sqrt()), atol=1e-10)


def test_rank_deficient_truncate_and_ridge() -> None:  # the default, coupling: tests/test_qleace_coupling.py
    """A constant pixel, a pixel constant within one class, and a class with n_k < d."""
    x, y = gaussian_classes(900, 20, 3, seed=4, priors=[0.45, 0.45, 0.1])
    x = torch.cat([x, torch.full((900, 1), 0.25, dtype=F64)], 1)
    x[y == 0, 3] = 0.0
    small = (y == 2).nonzero().flatten()[15:]  # class 2 keeps 15 samples < d = 21
    keep = torch.ones(900, dtype=torch.bool)
    keep[small] = False
    x, y = x[keep], y[keep]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        e = _fit(x, y, rank_deficient="truncate")
    assert len([w for w in caught if "rank-deficient" in str(w.message)]) == 1
    rep = e.report()
    assert rep["rank_handling"] == "truncate" and rep["support_rank"] == 20
    assert rep["working_rank"] <= 14 and len(rep["warnings"]) == 1
    xe = e(x, y)
    assert torch.isfinite(xe).all()
    assert max_mean_gap(xe, y) <= 1e-10 and max_cov_gap(xe, y) <= 1e-8
    cert = erasure.certificate(xe, y)
    assert cert["max_mean_gap"] <= 1e-10 and cert["max_cov_gap"] <= 1e-8

    with pytest.warns(UserWarning, match="added a ridge"):
        r = _fit(x, y, rank_deficient="ridge")
    xr = r(x, y)
    assert torch.isfinite(xr).all() and r.report()["ridge_used"] > 0
    assert r.report()["working_rank"] == 20
    assert max_mean_gap(xr, y) <= 1e-10
    assert max_cov_gap(xr, y) < max_cov_gap(x, y)


def _wrong_batched_eigh(a: Tensor) -> tuple[Tensor, Tensor]:
    """A solver path that returns right eigenvalues and, for the second matrix of a batch, wrong eigenvectors (two
    columns swapped): what some batched GPU eigh paths do."""
    vals, vecs = torch.linalg.eigh(a)
    if a.dim() == 3 and len(a) > 1:
        vecs = vecs.clone()
        vecs[1] = vecs[1][:, [1, 0, *range(2, a.shape[-1])]]
    return vals, vecs


def test_a_wrong_decomposition_is_caught_and_redone_per_matrix_on_the_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    from erasure import moments

    x, y = gaussian_classes(3000, 12, 3, seed=7, spectrum=1.0, cov_scale=0.6)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a right decomposition warns nothing
        right = _fit(x, y)
    monkeypatch.setattr(moments, "_solver", _wrong_batched_eigh)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        checked = _fit(x, y)
    eigh_warnings = [w for w in caught if "eigh of" in str(w.message)]
    assert eigh_warnings and len({str(w.message) for w in eigh_warnings}) == 1, [str(w.message) for w in caught]
    assert "one matrix at a time on the CPU in float64" in str(eigh_warnings[0].message)
    assert torch.equal(checked.maps_full(), right.maps_full())  # the safe path: the same eraser
    assert max_cov_gap(checked(x, y), y) <= 1e-8
    monkeypatch.setattr(moments, "_solver", torch.linalg.eigh)
    covs = class_stats(x, y)[1]
    vals, vecs = _wrong_batched_eigh(covs)
    assert not moments._decomposes(covs, vals, vecs)  # the check sees what the wrong path returned


def test_a_solver_that_fails_falls_back_with_one_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    from erasure import moments

    def failing(a: Tensor) -> tuple[Tensor, Tensor]:
        raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")

    a = torch.randn(4, 6, 6, dtype=torch.float32)
    a = a @ a.mT
    monkeypatch.setattr(moments, "_solver", failing)
    with pytest.warns(RuntimeWarning, match="failed to converge") as caught:
        vals, vecs = moments.checked_eigh(a)
    assert len(caught) == 1 and vals.dtype == a.dtype and vecs.shape == a.shape
    assert moments._decomposes(a, vals, vecs)
