"""QLEACE: equal class means and covariances, PD maps, barycenter stationarity, concept-erasure oracle; its
rank-deficiency modes: the exact Gaussian coupling (default), truncate, ridge and the paper code's shrinkage."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import torch
from torch import Tensor

import erasure
from erasure.barycenter import barycenter
from erasure.qleace import QleaceEraser, shrink_covariances

from .test_erasure_common import F64, class_stats, gaussian_classes, max_cov_gap, max_mean_gap

# a rank-deficient fit warns what it did; tests that check a warning catch it themselves
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _fit(x: Tensor, y: Tensor, **options: object) -> QleaceEraser:
    e = erasure.fit("qleace", x, y, **options)
    assert isinstance(e, QleaceEraser)
    return e


def _psd_pow(a: Tensor, p: float, rtol: float = 1e-12) -> Tensor:
    """Symmetric power; for p < 0 the pseudo-inverse power (eigenvalues ≤ rtol·max count as zero)."""
    vals, vecs = torch.linalg.eigh((a + a.mT) / 2)
    keep = vals > rtol * vals.max()
    powed = torch.where(keep, vals.clamp_min(1e-300) ** p, torch.zeros_like(vals)) if p < 0 else vals.clamp_min(0) ** p
    return (vecs * powed.unsqueeze(-2)) @ vecs.mT


def _rank_deficient_data() -> tuple[Tensor, Tensor]:
    """Imbalanced classes; a pixel constant everywhere, 8 pixels constant within class 0 (so its null space
    meets any 14-dim subspace of the 20-dim support), and class 2 with 15 samples (< d = 21). Class 1 stays
    non-singular."""
    x, y = gaussian_classes(900, 20, 3, seed=4, priors=[0.45, 0.45, 0.1], spectrum=1.0)
    x = torch.cat([x, torch.full((900, 1), 0.25, dtype=F64)], 1)
    x[y == 0, 3:11] = 0.0
    small = (y == 2).nonzero().flatten()[15:]
    keep = torch.ones(900, dtype=torch.bool)
    keep[small] = False
    return x[keep], y[keep]


@pytest.mark.parametrize("n, d, k, spectrum, priors", [(600, 4, 2, 0.0, [0.3, 0.7]), (3000, 12, 3, 1.0, None),
                                                       (6000, 24, 10, 1.5, None), (4000, 32, 5, 2.0, None)])
def test_equal_moments_pd_maps_stationarity_and_concept_erasure(n: int, d: int, k: int, spectrum: float,
                                                                priors: list[float] | None) -> None:
    """The oracle, concept-erasure's QuadraticFitter (never imported by erasure/): k=2 uses its closed-form
    midpoint, k>2 its fixed point."""
    from concept_erasure import QuadraticFitter

    x, y = gaussian_classes(n, d, k, seed=n + d, spectrum=spectrum, cov_scale=0.6, priors=priors)
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
    _, covs, weights = class_stats(x, y)
    bary = e.barycenter_full()
    s, s_inv = _psd_pow(bary, 0.5), _psd_pow(bary, -0.5)
    to_class = s_inv @ _psd_pow(s @ covs @ s, 0.5) @ s_inv
    resid = torch.einsum("k,kij->ij", weights, to_class) - torch.eye(d, dtype=F64)
    assert float(torch.linalg.matrix_norm(resid)) / d**0.5 < 2e-8  # = the reported residual ≤ tol
    # ... and the erased class covariances equal it
    _, covs_after, _ = class_stats(xe, y)
    assert float(torch.linalg.matrix_norm(covs_after - bary).max() / torch.linalg.matrix_norm(bary)) < 1e-8
    theirs = QuadraticFitter.fit(x, y, shrinkage=False).eraser.ot_maps
    assert float(torch.linalg.matrix_norm(maps - theirs).max() / torch.linalg.matrix_norm(theirs).max()) < 1e-6


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


def _wrong_batched_eigh(a: Tensor) -> tuple[Tensor, Tensor]:
    """A solver path that returns right eigenvalues and, for the second matrix of a batch, wrong eigenvectors (two
    columns swapped): what some batched GPU eigh paths do."""
    vals, vecs = torch.linalg.eigh(a)
    if a.dim() == 3 and len(a) > 1:
        vecs = vecs.clone()
        vecs[1] = vecs[1][:, [1, 0, *range(2, a.shape[-1])]]
    return vals, vecs


def test_a_wrong_or_failing_decomposition_is_caught_and_redone(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong one: per matrix on the CPU; a solver that fails: a fallback, with one warning."""
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

    def failing(a: Tensor) -> tuple[Tensor, Tensor]:
        raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")

    a = torch.randn(4, 6, 6, dtype=torch.float32)
    a = a @ a.mT
    monkeypatch.setattr(moments, "_solver", failing)
    with pytest.warns(RuntimeWarning, match="failed to converge") as fallback:
        vals, vecs = moments.checked_eigh(a)
    assert len(fallback) == 1 and vals.dtype == a.dtype and vecs.shape == a.shape
    assert moments._decomposes(a, vals, vecs)


# ---------------------------------------------------------------- rank deficiency: the coupling (default)

def test_rank_deficient_imbalanced_data_coupling_exact_moments_truncate_and_ridge() -> None:
    x, y = _rank_deficient_data()
    assert max_cov_gap(x, y) > 0.1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        e = erasure.fit("qleace", x, y)
    assert isinstance(e, QleaceEraser)
    assert [str(w.message) for w in caught if "rank-deficient" in str(w.message)]  # said what it did
    rep = e.report()
    counts = torch.bincount(y)
    assert rep["rank_handling"] == "coupling" and rep["support_rank"] == 20
    assert rep["working_rank"] == min(20, int(counts.min()) - 1) == 14 and rep["rank_limited_by"] == "class size"
    # class 0's constant pixels leave ≥ 14 + 8 − 20 null directions in the working subspace
    assert rep["noise_rank"][0] >= 2 and rep["noise_rank"][1] == 0
    xe = e.apply_in_sample(x, y)
    assert torch.isfinite(xe).all()
    assert max_mean_gap(xe, y) <= 1e-12 and max_cov_gap(xe, y) <= 1e-12
    cert = erasure.certificate(xe, y)
    assert cert["max_mean_gap"] <= 1e-12 and cert["max_cov_gap"] <= 1e-12
    # every class ends with exactly the barycenter covariance
    _, covs_after, _ = class_stats(xe, y)
    bary = e.barycenter_full()
    assert float((covs_after - bary).abs().max()) <= 1e-12 * float(bary.abs().max())
    # the noise share is tr R_k / tr C
    for c in range(3):
        assert rep["noise_share"][c] == pytest.approx(float(torch.trace(e.noise_cov_full(c)) / torch.trace(bary)),
                                                      rel=1e-9, abs=1e-15)
    # the other modes: truncate (exact moments on fewer directions) and ridge
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        e = _fit(x, y, rank_deficient="truncate")
    assert len([w for w in caught if "rank-deficient" in str(w.message)]) == 1
    rep = e.report()
    assert rep["rank_handling"] == "truncate" and rep["support_rank"] == 20
    assert rep["working_rank"] <= 14 and len(rep["warnings"]) == 1
    xe = e(x, y)
    assert torch.isfinite(xe).all()
    assert max_mean_gap(xe, y) <= 1e-10 and max_cov_gap(xe, y) <= 1e-8  # (the certificate's gaps: these)
    with pytest.warns(UserWarning, match="added a ridge"):
        r = _fit(x, y, rank_deficient="ridge")
    xr = r(x, y)
    assert torch.isfinite(xr).all() and r.report()["ridge_used"] > 0
    assert r.report()["working_rank"] == 20
    assert max_mean_gap(xr, y) <= 1e-10
    assert max_cov_gap(xr, y) < max_cov_gap(x, y)


def test_coupling_noise_exact_in_sample_iid_out_of_sample() -> None:
    """In sample the noise has exact moments per class (zero mean, uncorrelated with the data, covariance R_k).
    Applied to rows it was not fitted on (numerics version 3), it is N(0, R_k) drawn independently per row: not
    exactly zero-sum per class, its covariance approaching R_k; on too few rows the in-sample draw falls back to it."""
    x, y = _rank_deficient_data()
    e = _fit(x, y)
    noise = e.apply_in_sample(x, y) - e._apply(x, y)  # the linear part B_k(x − m_k) without the noise
    scale = float(e.barycenter_full().abs().max())
    for c in range(3):
        idx = y == c
        eps, xc = noise[idx], x[idx] - x[idx].mean(0)
        n = int(idx.sum())
        assert float(eps.mean(0).abs().max()) <= 1e-12 * scale**0.5
        assert float((xc.T @ eps).abs().max()) / (n - 1) <= 1e-12 * scale  # uncorrelated with the class's data
        r = e.noise_cov_full(c)
        assert float((eps.T @ eps / (n - 1) - r).abs().max()) <= 1e-12 * scale
        if e.report()["noise_rank"][c] == 0:
            assert float(eps.abs().max()) <= 1e-12 * scale**0.5
    c = 0
    assert e.report()["noise_rank"][c] >= 2
    rows = x[y == c][:60] + 0.01  # rows the eraser was not fitted on
    yc = torch.full((len(rows),), c)
    noise_out = e(rows, yc) - e._apply(rows, yc)
    assert float(noise_out.mean(0).abs().max()) > 1e-3 * scale**0.5  # out of sample: a plain draw
    many = torch.zeros(20000, x.shape[1], dtype=F64)
    noise = e(many, torch.full((20000,), c)) - e._apply(many, torch.full((20000,), c))
    r = e.noise_cov_full(c)
    assert float((noise.T @ noise / len(noise) - r).abs().max()) <= 0.05 * float(r.abs().max())
    sub = torch.cat([(y == c).nonzero().flatten()[:3] for c in range(3)])
    with pytest.warns(UserWarning, match="fewer than"):
        out = e.apply_in_sample(x[sub], y[sub])
    assert torch.isfinite(out).all()


def test_coupling_matches_the_closed_form_b_and_r() -> None:
    """B_k = C T'_k Σ_k⁺ and R_k = C − C T'_k Σ_k⁺ T'_k C with T'_k = C^{-½}(C^{½}Σ_kC^{½})^{½}C^{-½}, built
    here independently (eigh, float64) from the reported barycenter and the class covariances. Class 1 is
    non-singular: B_1 = Σ^{-½}(Σ^{½}CΣ^{½})^{½}Σ^{-½}, no noise. With every class non-singular the coupling is
    exactly the plain map (same output as rank_deficient=truncate, which then truncates nothing)."""
    x, y = _rank_deficient_data()
    e = _fit(x, y)
    v = e.state["basis"]
    _, covs, _ = class_stats(x, y)
    covs = v.T @ covs @ v
    cb = e.state["barycenter"]
    s, s_inv = _psd_pow(cb, 0.5), _psd_pow(cb, -0.5)
    for c in range(3):
        t = s_inv @ _psd_pow(s @ covs[c] @ s, 0.5) @ s_inv
        pinv = _psd_pow(covs[c], -1.0, rtol=1e-10)
        b = cb @ t @ pinv
        r = cb - cb @ t @ pinv @ t @ cb
        ours_b = e.state["maps"][c]
        # ours acts on rows (z ↦ z B) and is symmetric; B_k = C T' Σ⁺ equals it on range(Σ_k), where the data
        # lives (both vanish or not off it: Σ⁺ kills null(Σ_k), ours need not), and R_k must agree everywhere
        proj = covs[c] @ pinv
        assert float((ours_b @ proj - b @ proj).abs().max()) <= 1e-7 * float(b.abs().max())
        ours_r = v.T @ e.noise_cov_full(c) @ v
        assert float((ours_r - r).abs().max()) <= 1e-7 * float(cb.abs().max())
    root, root_inv = _psd_pow(covs[1], 0.5), _psd_pow(covs[1], -0.5)
    t1 = root_inv @ _psd_pow(root @ cb @ root, 0.5) @ root_inv
    assert e.report()["noise_rank"][1] == 0
    assert float((e.state["maps"][1] - t1).abs().max()) <= 1e-8 * float(t1.abs().max())
    xp, yp = gaussian_classes(3000, 12, 4, seed=3, spectrum=1.0, cov_scale=0.6, priors=[0.1, 0.2, 0.3, 0.4])
    plain, truncated = _fit(xp, yp), _fit(xp, yp, rank_deficient="truncate")
    assert plain.report()["rank_handling"] == truncated.report()["rank_handling"] == "none"
    assert plain.report()["noise_rank"] == [0, 0, 0, 0] and not plain.has_noise
    assert float((plain(xp, yp) - truncated(xp, yp)).abs().max()) <= 1e-9 * float(xp.abs().max())


def test_coupling_is_deterministic_given_the_seed_and_survives_save_load(tmp_path: Path) -> None:
    x, y = _rank_deficient_data()
    a, b, c = _fit(x, y), _fit(x, y), _fit(x, y, seed=1)
    xa = a.apply_in_sample(x, y)
    assert torch.equal(xa, b.apply_in_sample(x, y)) and torch.equal(a(x, y), b(x, y))  # out of sample too
    xc = c.apply_in_sample(x, y)
    assert not torch.allclose(xa, xc) and max_cov_gap(xc, y) <= 1e-12
    assert not torch.allclose(a(x, y), c(x, y))
    a.save(tmp_path / "q.pt")
    assert torch.equal(erasure.load(tmp_path / "q.pt").apply_in_sample(x, y), xa)
    # float32 in, float32 out; fitted and applied on images (n, C, H, W)
    img = x[:, :20].reshape(-1, 1, 4, 5).float()
    e = _fit(img, y)
    out = e(img, y)
    assert out.shape == img.shape and out.dtype == torch.float32


# ---------------------------------------------------------------- shrinkage (the paper code's estimator)

def test_shrinkage_formula_matches_concept_erasure() -> None:
    from concept_erasure.shrinkage import optimal_linear_shrinkage

    g = torch.Generator().manual_seed(0)
    for n, d in ((40, 30), (400, 30), (30, 60)):
        a = torch.randn(n, d, generator=g, dtype=F64) * torch.linspace(0.1, 2.0, d, dtype=F64)
        s = torch.cov(a.T, correction=0)[None]
        ours, alpha = shrink_covariances(s, torch.tensor([n]))
        theirs = optimal_linear_shrinkage(s, n)
        assert 0 < float(alpha) < 1
        assert float((ours - theirs).abs().max()) <= 1e-12 * float(theirs.abs().max())


@pytest.mark.parametrize("k", [2, 5])
def test_shrinkage_matches_concept_erasure_quadratic_fitter(k: int) -> None:
    """concept-erasure's QuadraticFitter(shrinkage=True) (the paper's code), as an oracle: same maps and, on
    balanced classes (where its unweighted target mean equals ours), the same erased data. n_k < d here."""
    from concept_erasure import QuadraticFitter

    d, per = 40, 30
    x, _ = gaussian_classes(per * k, d, k, seed=k, spectrum=1.0, cov_scale=0.5)
    y = torch.arange(k).repeat_interleave(per)
    x = x + torch.randn(k, d, generator=torch.Generator().manual_seed(1), dtype=F64)[y]
    x[y == 0, 5] = 0.5  # a pixel constant in one class: its covariance is singular, shrinkage fixes that
    e = _fit(x, y, rank_deficient="shrinkage")
    rep = e.report()
    assert rep["rank_handling"] == "shrinkage" and rep["working_rank"] == d and not rep["warnings"]
    assert all(0 < a < 1 for a in rep["shrinkage_alpha"])
    fitter = QuadraticFitter.fit(x, y)  # shrinkage=True is its default
    theirs = fitter.eraser.ot_maps
    ours = e.maps_full()
    assert float((ours - theirs).abs().max()) <= 1e-6 * float(theirs.abs().max())
    out, ref = e(x, y), fitter.eraser(x, y)
    assert float((out - ref).abs().max()) <= 1e-6 * float(ref.abs().max())
    # means are erased exactly; covariances only approximately (the paper's QLEACE)
    assert max_mean_gap(out, y) <= 1e-10
    assert 1e-8 < max_cov_gap(out, y) < max_cov_gap(x, y)
