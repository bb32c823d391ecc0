"""Erasure certificate: residual class-moment gaps and cross-fitted probes (linear, quadratic, MLP) scored against
chance."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .mlp_probe import mlp_scores
from .moments import check_labels, class_moments, eigh_desc, flatten_features, numerical_rank
from .split import stratified_folds
from .threads import single_threaded

LDA_SHRINKAGE = (1e-3, 1e-2, 0.1, 0.3, 1.0)  # linear probe: pooled covariance shrunk towards (tr/r)·I
TEMPERATURES = torch.logspace(-3.0, 1.5, 46, dtype=torch.float64)  # × 1/spread of the calibration scores
PROBES = ("linear", "quadratic", "mlp")


@single_threaded
def certificate(x: Tensor | np.ndarray, y: Tensor | np.ndarray, *, seed: int = 0, qda_shrink: float = 0.3,
                flag_se: float = 3.0) -> dict[str, Any]:
    """Numbers that say whether low-order class information is gone (JSON-serialisable).

    Moment gaps are measured on all of (x, y) in float64 (where an eraser makes its guarantee):
      max_mean_gap = max_k ‖m_k − μ‖₂ / √tr Σ, max_cov_gap = max_k ‖Σ_k − Σ̄‖_F / ‖Σ̄‖_F
    (Σ the total covariance, Σ̄ = Σ_k w_k Σ_k).

    Probes are scored out of sample by 2-fold cross-fitting: a seeded split stratified by class (`seed`);
    each half's probe is fitted on the other half (in the principal coordinates of that half, zero-variance
    directions dropped) and every row is scored once, by the probe that never saw it. Linear probe: a
    Gaussian classifier with a shared covariance (LDA) shrunk towards a multiple of I; quadratic probe: QDA,
    class covariances shrunk towards the pooled one by `qda_shrink` (plus a small ridge). Each outputs
    log p(k | x) ∝ log π_k + t·score_k(x), π the class priors of all of (x, y); the shrinkage (LDA) and the
    temperature t ≥ 10⁻³/spread are chosen on an inner stratified split of the training half (fit on one
    part, calibrate on the other; the weakest setting within one SE of the best), then the probe is
    refitted on the whole training half. MLP probe (erasure/mlp_probe.py): one hidden ReLU layer on the
    leading principal coordinates, seeded by `seed`, fitted on the inner fit part, early-stopped and
    calibrated (temperature) on the inner calibration part, not refitted (it must stay cheap).
    A probe that finds nothing shrinks towards t → 0, i.e. towards the
    prior-only code, but never reaches it: its first-order sign survives (the z-scores below do not depend
    on t as t → 0), so a probe trained on dependent data still shows which way it was pushed.

    Reported per probe (`linear_probe_*`, `quadratic_probe_*`, `mlp_probe_*`) over the n pooled held-out predictions:
      acc, acc_se (binomial SE of the per-row 0/1, half a count added to each side), acc_null = Σ_k π_k q_k
      (expected accuracy of a label-independent predictor with the probe's prediction frequencies q;
      = `chance`, the majority rate, when it always predicts the majority class), acc_z = (acc − acc_null)/acc_se;
      loss_bits (mean log-loss, bits), loss_se (SE of the per-row difference to the prior-only code's
      log-loss), loss_z = (chance_loss_bits − loss_bits)/loss_se (positive: better than chance);
      below_chance (acc_z or loss_z < −flag_se) and verdict: "dependence artefact" when below chance,
      "information" when acc_z or loss_z > flag_se, else "no information detected".
    Below chance is information too, not success: a held-out probe can only do reliably worse than the
    prior when its training rows and the scored rows are dependent, e.g. when the eraser was fitted on these
    very rows (equal class moments on the whole set make the two halves' class deviations exactly opposite).
    `below_chance` and `verdict` at the top level summarise both probes. LEACE's guarantee covers the
    log-loss of linear scores (any convex loss), not the accuracy of an argmax over K > 2 of them: that can
    use covariance differences, so after LEACE linear_probe_acc may sit above chance while loss_z does not.
    """
    t0 = time.perf_counter()
    flat, _ = flatten_features(x)
    labels, k = check_labels(y, len(flat))
    x64 = flat.to(torch.float64)
    labels = labels.to(x64.device)
    mom = class_moments(x64, labels, k, total_cov=True, class_covs=True)
    assert mom.cov is not None and mom.class_covs is not None
    scale = math.sqrt(max(float(torch.trace(mom.cov)), 0.0))
    mean_gaps = (mom.means - mom.mean).norm(dim=1) / (scale or 1.0)
    pooled = torch.einsum("k,kij->ij", mom.priors, mom.class_covs)
    pooled_norm = float(torch.linalg.matrix_norm(pooled)) or 1.0
    cov_gaps = torch.linalg.matrix_norm(mom.class_covs - pooled) / pooled_norm
    priors = mom.priors.cpu()
    counts = mom.counts
    del mom

    n = len(labels)
    log_prior = torch.log(priors).to(x64.device)
    folds = [f.to(x64.device) for f in stratified_folds(n, 2, seed, labels)]
    logp = {p: torch.empty(n, k, dtype=torch.float64, device=x64.device) for p in PROBES}
    settings: dict[str, list[dict[str, float]]] = {p: [] for p in PROBES}
    dims = []
    for f in range(2):
        train, test = folds[1 - f], folds[f]
        feats, dim = _principal(x64, train)
        dims.append(dim)
        fitted = _fit_probes(feats[train], labels[train], feats[test], log_prior, qda_shrink, seed + 1 + f)
        for probe, (scored, setting) in fitted.items():
            logp[probe][test] = scored
            settings[probe].append(setting)
    out: dict[str, Any] = {
        "max_mean_gap": float(mean_gaps.max()), "max_cov_gap": float(cov_gaps.max()),
        "mean_gap_per_class": [float(v) for v in mean_gaps], "cov_gap_per_class": [float(v) for v in cov_gaps],
        "chance": float(counts.max()) / n, "chance_loss_bits": float(-(priors * torch.log2(priors)).sum()),
    }
    verdicts = []
    for probe in PROBES:
        scores = _score(logp[probe].cpu(), labels.cpu(), priors, flag_se)
        verdicts.append(scores["verdict"])
        out.update({f"{probe}_probe_{key}": value for key, value in scores.items()})
    out.update({
        "below_chance": "dependence artefact" in verdicts,
        "verdict": next((v for v in ("dependence artefact", "information") if v in verdicts),
                        "no information detected"),
        "probe_scoring": f"2-fold cross-fit (stratified, seed {seed}); log-loss in bits; flag at {flag_se:g} SE",
        "probe_settings": settings, "n_train": len(folds[1]), "n_test": len(folds[0]), "n_scored": n,
        "probe_dim": min(dims), "seconds": time.perf_counter() - t0,
    })
    return out


def _principal(x64: Tensor, train: Tensor) -> tuple[Tensor, int]:
    """All rows in the principal coordinates of the training rows (zero-variance directions dropped),
    scaled to unit mean variance (a rotation and one scale: the probes' isotropic shrinkage targets keep
    their meaning)."""
    xt = x64[train]
    mu = xt.mean(0)
    xc = xt - mu
    vals, vecs = eigh_desc(xc.T @ xc / max(len(xt) - 1, 1))
    r = max(numerical_rank(vals, 1e-10), 1)
    scale = float(vals[:r].clamp_min(0).mean()) ** 0.5 or 1.0
    return (x64 - mu) @ vecs[:, :r] / scale, r


def _fit_probes(xtr: Tensor, ytr: Tensor, xte: Tensor, log_prior: Tensor, qda_shrink: float,
                seed: int) -> dict[str, tuple[Tensor, dict[str, float]]]:
    """Per probe, the held-out log-probabilities (n_test, k) and the chosen settings: an inner split of the training
    rows (seeded by `seed`) for shrinkage and temperature, then refit on all training rows (the MLP: no refit)."""
    k = len(log_prior)
    inner = [i.to(xtr.device) for i in stratified_folds(len(xtr), 2, seed, ytr)]
    fit_rows, cal_rows = inner
    x1, y1, x2, y2 = xtr[fit_rows], ytr[fit_rows], xtr[cal_rows], ytr[cal_rows]
    out = {}
    for probe in PROBES:
        if probe == "mlp":
            cal, y_cal, scores = mlp_scores(xtr, ytr, xte, k, inner, seed + 6)  # its weights' own seed
            shrink, t = _select([(0.0, cal)], y_cal, log_prior)
        elif probe == "linear":
            st = _lda_fit(x1, y1, k)
            shrink, t = _select([(a, _lda_scores(st, a, x2)) for a in LDA_SHRINKAGE], y2, log_prior)
            scores = _lda_scores(_lda_fit(xtr, ytr, k), shrink, xte)
        else:
            shrink, t = _select([(qda_shrink, _qda_scores(_qda_fit(x1, y1, k, qda_shrink), x2))], y2, log_prior)
            scores = _qda_scores(_qda_fit(xtr, ytr, k, shrink), xte)
        logp = torch.log_softmax(log_prior + t * scores, dim=1)
        out[probe] = (logp, {"shrinkage": float(shrink), "temperature": float(t)})
    return out


def _class_means(x: Tensor, y: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Class means (k, r) (a class absent here gets the overall mean: it scores like no information) and counts."""
    counts = torch.bincount(y, minlength=k)
    sums = torch.zeros(k, x.shape[1], dtype=x.dtype, device=x.device).index_add_(0, y, x)
    means = torch.where(counts[:, None] > 0, sums / counts.clamp_min(1)[:, None].to(x), x.mean(0))
    return means, counts


def _lda_fit(x: Tensor, y: Tensor, k: int) -> dict[str, Tensor]:
    means, counts = _class_means(x, y, k)
    xc = x - means[y]
    dof = max(len(x) - int((counts > 0).sum()), 1)
    evals, evecs = eigh_desc(xc.T @ xc / dof)
    return {"means": means, "evals": evals.clamp_min(0), "evecs": evecs}


def _lda_scores(st: dict[str, Tensor], shrink: float, x: Tensor) -> Tensor:
    """x·Σ⁻¹m_k − ½ m_kᵀΣ⁻¹m_k with Σ = (1 − shrink)·S_w + shrink·(tr S_w / r)·I."""
    ev = st["evals"]
    level = float(ev.mean()) or 1.0
    prec = 1.0 / ((1 - shrink) * ev + shrink * level)
    mv = st["means"] @ st["evecs"]  # (k, r) in the eigenbasis of S_w
    return (x @ st["evecs"]) @ (mv * prec).T - 0.5 * (mv * mv * prec).sum(1)


def _qda_fit(x: Tensor, y: Tensor, k: int, shrink: float) -> dict[str, Tensor]:
    means, counts = _class_means(x, y, k)
    r = x.shape[1]
    scatter = torch.zeros(k, r, r, dtype=x.dtype, device=x.device)
    for c in range(k):
        xc = x[y == c] - means[c]
        scatter[c] = xc.T @ xc
    pooled = scatter.sum(0) / max(len(x) - int((counts > 0).sum()), 1)
    eye = torch.eye(r, dtype=x.dtype, device=x.device)
    ridge = 1e-3 * (float(torch.trace(pooled)) / r or 1.0)
    covs = torch.empty_like(scatter)
    for c in range(k):
        own = scatter[c] / (int(counts[c]) - 1) if counts[c] >= 2 else pooled  # too few rows: the pooled one
        covs[c] = (1 - shrink) * own + shrink * pooled + ridge * eye
    chol = torch.linalg.cholesky(covs)
    inv = torch.linalg.solve_triangular(chol, eye.expand(k, r, r), upper=False)  # L⁻¹
    logdet = 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
    return {"means": means, "inv_chol": inv.float(), "logdet": logdet}


def _qda_scores(st: dict[str, Tensor], x: Tensor) -> Tensor:
    """−½ log det Σ_k − ½ (x − m_k)ᵀΣ_k⁻¹(x − m_k) (Mahalanobis terms in float32: a probe needs no more)."""
    k = len(st["means"])
    out = torch.empty(len(x), k, dtype=x.dtype, device=x.device)
    for c in range(k):
        z = (x - st["means"][c]).float() @ st["inv_chol"][c].T
        out[:, c] = -0.5 * st["logdet"][c] - 0.5 * z.pow(2).sum(1).to(x.dtype)
    return out


def _select(candidates: list[tuple[float, Tensor]], y: Tensor, log_prior: Tensor) -> tuple[float, float]:
    """(shrinkage, temperature) for the probe, from its calibration scores under each shrinkage.

    Temperatures: a log grid c ∈ [10⁻³, 10^1.5] divided by the spread of the (row-centred) scores. The
    one-SE rule: among all (shrinkage, c) whose mean log-loss log π + t·scores is within one SE (of the
    per-row loss difference to the prior-only code, at the best pair) of the best, take the smallest c (then
    the lowest loss). A probe without signal then stays at the weak end instead of fitting calibration noise.
    """
    chance = -log_prior[y]
    pairs, losses = [], []
    for shrink, scores in candidates:
        s = scores - scores.mean(1, keepdim=True)
        spread = float(s.std()) or 1.0
        ts = (TEMPERATURES / spread).to(s)
        logits = log_prior + ts[:, None, None] * s  # (T, m, k)
        losses.append(-torch.log_softmax(logits, dim=2).gather(2, y.expand(len(ts), -1)[:, :, None]).squeeze(2))
        pairs += [(shrink, float(t), i) for i, t in enumerate(ts)]
    nll = torch.cat(losses)  # (candidates · T, m)
    means = nll.mean(1)
    best = int(torch.argmin(means))
    se = float((nll[best] - chance).std()) / math.sqrt(nll.shape[1]) if nll.shape[1] > 1 else 0.0
    ok = (means <= means[best] + se).nonzero().flatten().tolist()
    pick = min(ok, key=lambda j: (pairs[j][2], float(means[j])))
    return pairs[pick][0], pairs[pick][1]


def _score(logp: Tensor, y: Tensor, priors: Tensor, flag_se: float) -> dict[str, Any]:
    n = len(y)
    root_n = math.sqrt(n)
    loss = -logp.gather(1, y[:, None]).squeeze(1) / math.log(2)
    diff = loss + torch.log2(priors)[y]  # per-row log-loss minus the prior-only code's (bits)
    loss_se = float(diff.std()) / root_n if n > 1 else 0.0
    pred = logp.argmax(1)
    hits = int((pred == y).sum())
    acc = hits / n
    smooth = (hits + 0.5) / (n + 1)  # half a count each way: all right or all wrong still has an SE
    acc_se = math.sqrt(smooth * (1 - smooth) / n)
    acc_null = float((priors * torch.bincount(pred, minlength=len(priors)).double() / n).sum())
    acc_z = (acc - acc_null) / acc_se if acc_se > 0 else 0.0
    loss_z = -float(diff.mean()) / loss_se if loss_se > 0 else 0.0
    below = acc_z < -flag_se or loss_z < -flag_se
    info = acc_z > flag_se or loss_z > flag_se
    return {"acc": acc, "acc_se": acc_se, "acc_null": acc_null, "acc_z": acc_z, "loss_bits": float(loss.mean()),
            "loss_se": loss_se, "loss_z": loss_z, "below_chance": below,
            "verdict": "dependence artefact" if below else "information" if info else "no information detected"}
