"""In sample or out of sample: an eraser fitted on the rows it erases makes them dependent.

Library level, no harness: the split identity behind the below-chance artefact, the cross-fitted certificate
(accuracy and log-loss against chance, with SEs, and its below-chance flag), LEACE applied to rows it never saw,
the label-injection warning for QLEACE fitted on few rows per class, and the holdout split helper.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from torch import Tensor

import erasure
from erasure.certificate import _score
from erasure.leace import HOLDOUT_RTOL, LeaceEraser
from erasure.qleace import QleaceEraser, label_injection_risk
from erasure.split import split_fit, stratified_folds

from .test_erasure_common import F64, gaussian_classes

# ---------------------------------------------------------------- the split identity


def _erase(name: str, x: Tensor, y: Tensor, **options: object) -> Tensor:
    e = erasure.fit(name, x, y, **options)
    return e.apply_in_sample(x, y) if e.needs_labels else e(x)


def _block_deviations(xe: Tensor, y: Tensor, rows: Tensor, mu: Tensor, cov: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Per class k, for the rows `rows`: n_kX (mean_kX − μ) (k, d) and S_kX − (n_kX / n_k)(n_k − 1) C (k, d, d),
    S_kX = Σ_{i ∈ X, y_i = k} (x'_i − μ)(x'_i − μ)ᵀ the block's scatter about the common mean μ."""
    n_k = torch.bincount(y, minlength=k).to(F64)
    mean_dev, scatter_dev = [], []
    for c in range(k):
        z = xe[rows[y[rows] == c]] - mu
        mean_dev.append(z.sum(0))
        scatter_dev.append(z.T @ z - len(z) / n_k[c] * (n_k[c] - 1) * cov)
    return torch.stack(mean_dev), torch.stack(scatter_dev)


@pytest.mark.parametrize("mode", ["plain", "coupling"])
def test_qleace_in_sample_block_deviations_are_the_negative_of_the_rest(mode: str) -> None:
    """QLEACE fitted on all rows gives every class mean μ and covariance C exactly on those rows. Hence for any
    block B of rows and its complement R, per class k (n_kX rows of class k in X, μ the erased data's mean, C
    the barycenter):
        n_kB (mean_kB − μ) + n_kR (mean_kR − μ) = 0   and
        [S_kB − n_kB/n_k·(n_k − 1) C] + [S_kR − n_kR/n_k·(n_k − 1) C] = 0   (S the scatter about μ),
    while each bracket alone is of the order of sampling noise: the block's class deviations from the
    equalised moments are exactly the negative of the rest's. Asserted to 1e-8 relative to n_k‖C‖."""
    k = 3
    if mode == "plain":  # n_k ≫ d, well conditioned: the plain map T_k
        x, y = gaussian_classes(3000, 6, k, seed=21, cov_scale=0.8)
    else:  # pixel 0 constant in class 0: a singular class, the default coupling (exact-moment noise)
        x, y = gaussian_classes(1500, 8, k, seed=22, cov_scale=0.8)
        x[y == 0, 0] = 0.5
    e = erasure.fit("qleace", x, y, rank_deficient="coupling")
    assert isinstance(e, QleaceEraser)
    xe = e.apply_in_sample(x, y)
    if mode == "coupling":
        assert e.report()["rank_handling"] == "coupling" and max(e.report()["noise_rank"]) > 0
    mu, cov = xe.mean(0), e.barycenter_full()
    n_k = torch.bincount(y, minlength=k).to(F64)
    scale = n_k[:, None, None] * torch.linalg.matrix_norm(cov)
    for seed in range(5):
        block = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))[: len(x) // 3]
        rest = torch.ones(len(x), dtype=torch.bool)
        rest[block] = False
        mb, sb = _block_deviations(xe, y, block, mu, cov, k)
        mr, sr = _block_deviations(xe, y, rest.nonzero().flatten(), mu, cov, k)
        assert float(((mb + mr).norm(dim=1) / (n_k * cov.trace().sqrt())).max()) < 1e-8
        assert float((torch.linalg.matrix_norm(sb + sr) / scale.flatten()).max()) < 1e-8
        # not a trivial zero: each block alone deviates by sampling noise
        assert float((torch.linalg.matrix_norm(sb) / scale.flatten()).min()) > 1e-3


def test_leace_in_sample_block_means_are_the_negative_of_the_rest() -> None:
    """LEACE equalises class means (not covariances) on its rows: n_kB (mean_kB − μ) + n_kR (mean_kR − μ) = 0."""
    x, y = gaussian_classes(2000, 10, 4, seed=23)
    xe = _erase("leace", x, y)
    mu = xe.mean(0)
    block = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))[:700]
    rest = torch.ones(len(x), dtype=torch.bool)
    rest[block] = False
    scale = float((x - x.mean(0)).norm(dim=1).mean())
    for c in range(4):
        sb = (xe[block[y[block] == c]] - mu).sum(0)
        sr = (xe[rest & (y == c)] - mu).sum(0)
        assert float((sb + sr).norm()) < 1e-9 * scale * len(x)
        assert float(sb.norm()) > 1e-3 * scale


# ---------------------------------------------------------------- the certificate on null data

SEEDS = range(20)
N, D, K = 2000, 20, 4  # the artefact's z grows like √(2·d·(K − 1)); with K = 2 it averages −4.3 here


@pytest.fixture(scope="module")
def null_certificates() -> dict[str, list[dict]]:
    """Labels independent of x. 'all': eraser fitted on every row, certificate on the same rows; 'holdout':
    fitted on a stratified 20% (split_fit), certificate on the other 80% erased with that map."""
    out: dict[str, list[dict]] = {}
    for name in ("leace", "qleace"):
        for mode in ("all", "holdout"):
            certs = []
            for seed in SEEDS:
                g = torch.Generator().manual_seed(seed)
                x = torch.randn(N, D, generator=g, dtype=F64)
                y = torch.randint(0, K, (N,), generator=g)
                if mode == "all":
                    certs.append(erasure.certificate(_erase(name, x, y), y))
                    continue
                fit, coded = split_fit(N, 0.2, fold=0, seed=seed, labels=y)
                opts = {"rtol": HOLDOUT_RTOL} if name == "leace" else {}
                e = erasure.fit(name, x[fit], y[fit], **opts)
                xc, yc = x[coded], y[coded]
                certs.append(erasure.certificate(e(xc, yc) if e.needs_labels else e(xc), yc))
            out[f"{name}/{mode}"] = certs
    return out


def _z(certs: list[dict], probe: str, which: str = "loss") -> Tensor:
    return torch.tensor([c[f"{probe}_probe_{which}_z"] for c in certs])


def test_leace_fitted_on_all_rows_pushes_the_held_out_probe_below_chance(null_certificates: dict) -> None:
    """Measured (K = 4, 20 seeds): linear-probe log-loss z mean −7.1 (all), within [−2.1, 2.0] (holdout)."""
    z_all = _z(null_certificates["leace/all"], "linear")
    assert float(z_all.mean()) < -5.0
    assert all(c["linear_probe_below_chance"] and c["below_chance"] for c in null_certificates["leace/all"])
    z_hold = _z(null_certificates["leace/holdout"], "linear")
    assert float(z_hold.abs().max()) <= 3.0 and abs(float(z_hold.mean())) < 1.0
    assert float(_z(null_certificates["leace/holdout"], "linear", "acc").abs().max()) <= 3.0
    assert not any(c["below_chance"] for c in null_certificates["leace/holdout"])
    assert all(c["linear_probe_verdict"] == "no information detected" for c in null_certificates["leace/holdout"])


def test_qleace_fitted_on_all_rows_is_flagged_and_holdout_with_few_rows_injects(null_certificates: dict) -> None:
    """In sample both probes are pushed below chance (equal means and covariances on the rows: measured mean
    z −7.8 linear, −23.7 quadratic). Fitted on 100 rows per class in d = 20 (n_k/d = 5) the class maps inject the
    label instead: the held-out probes find information that the data never had (mean z ≈ +9 / +35)."""
    certs = null_certificates["qleace/all"]
    assert all(c["linear_probe_below_chance"] and c["quadratic_probe_below_chance"] for c in certs)
    assert all(c["verdict"] == "dependence artefact" for c in certs)
    assert float(_z(certs, "linear").mean()) < -5.0 and float(_z(certs, "quadratic").mean()) < -5.0
    certs = null_certificates["qleace/holdout"]
    assert not any(c["below_chance"] for c in certs)
    assert all(c["quadratic_probe_verdict"] == "information" for c in certs)
    assert label_injection_risk([100] * K, D) is not None


# ---------------------------------------------------------------- the certificate's numbers


def test_certificate_keys_chances_and_standard_errors() -> None:
    x, y = gaussian_classes(1200, 8, 3, seed=31, mean_scale=0.6, cov_scale=1.0, priors=[0.5, 0.3, 0.2])
    cert = erasure.certificate(x, y)
    json.dumps(cert, allow_nan=False)
    n = len(y)
    priors = torch.bincount(y).to(F64) / n
    assert cert["chance"] == pytest.approx(float(priors.max()))
    assert cert["chance_loss_bits"] == pytest.approx(float(-(priors * priors.log2()).sum()), rel=1e-12)
    assert cert["n_scored"] == n == cert["n_train"] + cert["n_test"]
    for probe in ("linear", "quadratic"):
        p = f"{probe}_probe_"
        acc = cert[p + "acc"]
        smooth = (acc * n + 0.5) / (n + 1)
        assert cert[p + "acc_se"] == pytest.approx(math.sqrt(smooth * (1 - smooth) / n), rel=1e-12)
        assert cert[p + "acc_z"] == pytest.approx((acc - cert[p + "acc_null"]) / cert[p + "acc_se"], rel=1e-12)
        assert cert[p + "loss_z"] == pytest.approx(
            (cert["chance_loss_bits"] - cert[p + "loss_bits"]) / cert[p + "loss_se"], rel=1e-9)
        assert cert[p + "verdict"] == "information" and not cert[p + "below_chance"]
        assert cert[p + "loss_bits"] < cert["chance_loss_bits"]
    assert cert["verdict"] == "information" and not cert["below_chance"]


def test_score_against_hand_computed_values() -> None:
    """4 rows, 2 classes, priors (1/2, 1/2): log-loss in bits, the paired SE, the permutation-null accuracy."""
    y = torch.tensor([0, 0, 1, 1])
    p = torch.tensor([[0.8, 0.2], [0.4, 0.6], [0.3, 0.7], [0.9, 0.1]], dtype=F64)
    s = _score(p.log(), y, torch.tensor([0.5, 0.5], dtype=F64), 3.0)
    loss = -torch.tensor([0.8, 0.4, 0.7, 0.1], dtype=F64).log2()
    assert s["loss_bits"] == pytest.approx(float(loss.mean()), rel=1e-12)
    assert s["loss_se"] == pytest.approx(float((loss - 1).std()) / 2, rel=1e-12)
    assert s["acc"] == 0.5 and s["acc_null"] == pytest.approx(0.5)  # predictions 0, 1, 1, 0
    # a probe that is always wrong: below chance; always right: information
    wrong = _score(torch.tensor([[0.1, 0.9]] * 50 + [[0.9, 0.1]] * 50, dtype=F64).log(),
                   torch.tensor([0] * 50 + [1] * 50), torch.tensor([0.5, 0.5], dtype=F64), 3.0)
    assert wrong["acc"] == 0.0 and wrong["acc_z"] < -3 and wrong["below_chance"]
    assert wrong["verdict"] == "dependence artefact"


# ---------------------------------------------------------------- LEACE applied out of sample


def _heldout_setup() -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """d = 10, 3 classes with different means; pixel 9 ~ U(0, 1) independent of the class. Fit rows: the first
    600 with pixel 9 zeroed except 0.01 in one row (fitted variance ≈ 1e-7 of the largest); held out: 2400."""
    x, y = gaussian_classes(3000, 9, 3, seed=1)
    x = torch.cat([x, torch.rand(3000, 1, generator=torch.Generator().manual_seed(2), dtype=F64)], 1)
    xf, yf = x[:600].clone(), y[:600]
    xf[:, 9] = 0.0
    xf[5, 9] = 0.01
    return xf, yf, x[600:], y[600:]


E9 = torch.nn.functional.one_hot(torch.tensor([9]), 10).to(F64)  # a unit change of pixel 9


def _gap(x: Tensor, y: Tensor) -> float:
    means = torch.stack([x[y == c].mean(0) for c in range(int(y.max()) + 1)])
    return float((means - x.mean(0)).norm(dim=1).max())


def test_leace_near_null_fit_direction_is_null_at_the_holdout_threshold_and_a_constant_one_passes_through() -> None:
    """Pixel 9 lit (0.01) in one of the 600 fit rows: at the default d·eps it is whitened by ~1/√1e-7 and a
    unit change of it in a held-out row moves the erased row by `edit_norm` ≈ 200 (measured 194), and the
    held-out class means stay far apart. At rtol = HOLDOUT_RTOL it is null: the change passes through (×1)
    and the held-out class means are close (sampling noise of 600 fit rows)."""
    xf, yf, xr, yr = _heldout_setup()
    loose = erasure.fit("leace", xf, yf)
    tight = erasure.fit("leace", xf, yf, rtol=HOLDOUT_RTOL)
    assert isinstance(loose, LeaceEraser) and isinstance(tight, LeaceEraser)
    rl, rt = loose.report(), tight.report()
    assert rl["rtol_used"] == pytest.approx(10 * torch.finfo(F64).eps) and rt["rtol_used"] == HOLDOUT_RTOL
    assert (rl["support_rank"], rt["support_rank"]) == (10, 9)
    for e, rep in ((loose, rl), (tight, rt)):
        assert rep["edit_norm"] == pytest.approx(float(torch.linalg.matrix_norm(e.matrix(), ord=2)), rel=1e-9)
    amp_loose = float((loose(xr[:1] + E9) - loose(xr[:1])).norm())
    amp_tight = float((tight(xr[:1] + E9) - tight(xr[:1])).norm())
    assert amp_loose > 50 and rl["edit_norm"] > 50
    assert amp_tight == pytest.approx(1.0, abs=1e-6) and rt["edit_norm"] < 1.5
    # every held-out row moves by at most edit_norm × its distance from the fitted mean
    ratio = (tight(xr) - xr).norm(dim=1) / (xr - xf.mean(0)).norm(dim=1)
    assert float(ratio.max()) <= rt["edit_norm"] * (1 + 1e-9)
    before = _gap(xr, yr)
    assert _gap(tight(xr), yr) < 0.1 * before < _gap(loose(xr), yr)
    # in sample both are exact on the fit rows up to the dropped direction's tiny variance
    assert _gap(tight(xf), yf) < 1e-3 * _gap(xf, yf)
    # pixel 9 constant in the fit rows is outside the support (default rtol): on held-out rows where it varies, the
    # edit neither reads nor writes it: e(x + δ e₉) = e(x) + δ e₉ exactly
    constant = xf.clone()
    constant[5, 9] = 0.0
    outside = erasure.fit("leace", constant, yf)
    assert outside.report()["support_rank"] == 9
    assert float((outside(xr[:7] + E9) - outside(xr[:7]) - E9).abs().max()) < 1e-12
    assert _gap(outside(xr), yr) < 0.1 * _gap(xr, yr)


def test_leace_out_of_sample_matches_concept_erasure() -> None:
    """Well-conditioned full-rank data: fitted on 800 rows, applied to 1200 others, ours (default and
    HOLDOUT_RTOL: no eigenvalue is near it) equals concept-erasure's LeaceFitter (float64, no shrinkage)."""
    from concept_erasure import LeaceFitter

    x, y = gaussian_classes(2000, 12, 4, seed=41, spectrum=1.0)
    xf, yf, xr = x[:800], y[:800], x[800:]
    z = torch.nn.functional.one_hot(yf, 4).to(F64)
    theirs = LeaceFitter.fit(xf, z, svd_tol=1e-9, shrinkage=False, constrain_cov_trace=False).eraser(xr)
    norm = float((xr - xr.mean(0)).norm())
    for rtol in (None, HOLDOUT_RTOL):
        ours = erasure.fit("leace", xf, yf, rtol=rtol)(xr)
        assert float((ours - theirs).norm()) / norm < 1e-8


# ---------------------------------------------------------------- QLEACE label-injection warning


def test_label_injection_risk_warns_below_100_rows_per_dimension() -> None:
    assert label_injection_risk([10_000, 20_000], 100) is None  # min n_k / d = 100: no warning
    msg = label_injection_risk(torch.tensor([9_999, 20_000]), 100)
    assert msg is not None and "\n" not in msg
    assert "label injection" in msg and "dataset.permute_labels=true" in msg and "9999" in msg
    assert label_injection_risk([400, 500], 784) is not None  # MNIST-5k at a 20% holdout: 0.51
    assert label_injection_risk([50, 60], 2, ratio=10) is None
    with pytest.raises(ValueError):
        label_injection_risk([], 5)


# ---------------------------------------------------------------- the holdout split helper


def test_split_fit_folds_are_deterministic_disjoint_covering_and_stratified() -> None:
    y = torch.tensor([0] * 103 + [1] * 58 + [2] * 39)[torch.randperm(200, generator=torch.Generator().manual_seed(0))]
    n, frac = len(y), 0.2
    fits = []
    for fold in range(5):
        fit, coded = split_fit(n, frac, fold=fold, seed=7, labels=y)
        again = split_fit(n, frac, fold=fold, seed=7, labels=y)
        assert torch.equal(fit, again[0]) and torch.equal(coded, again[1])
        assert torch.equal(torch.sort(torch.cat([fit, coded])).values, torch.arange(n))
        assert len(fit) in (40, 41) or abs(len(fit) - n * frac) <= 1
        for c, count in enumerate((103, 58, 39)):
            assert abs(int((y[fit] == c).sum()) - count * frac) <= 1
        fits.append(fit)
    assert torch.equal(torch.sort(torch.cat(fits)).values, torch.arange(n))  # folds disjoint and covering
    assert not torch.equal(split_fit(n, frac, 0, seed=8, labels=y)[0], fits[0])
    plain = stratified_folds(10, 3, seed=0)
    assert sorted(len(f) for f in plain) == [3, 3, 4]
    with pytest.raises(ValueError):
        split_fit(n, 0.7)
    with pytest.raises(ValueError):
        split_fit(n, 0.25, fold=4)
