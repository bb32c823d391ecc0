"""Erasure certificate: residual class-moment gaps and held-out probe accuracies vs chance."""

from __future__ import annotations

import math
import time
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .moments import check_labels, class_moments, eigh_desc, flatten_features, numerical_rank


def certificate(x: Tensor | np.ndarray, y: Tensor | np.ndarray, *, seed: int = 0, test_fraction: float = 0.5,
                probe_l2: float = 1e-2, qda_shrink: float = 0.3) -> dict[str, Any]:
    """Numbers that say whether low-order class information is gone (JSON-serialisable).

    Moment gaps are measured on all of (x, y) in float64 (where an eraser makes its guarantee):
      max_mean_gap = max_k ‖m_k − μ‖₂ / √tr Σ, max_cov_gap = max_k ‖Σ_k − Σ̄‖_F / ‖Σ̄‖_F
    (Σ the total covariance, Σ̄ = Σ_k w_k Σ_k). Probes are fitted on a deterministic stratified split
    (`seed`, `test_fraction` held out) in the principal coordinates of the training part:
    an L2-regularised multinomial logistic regression (linear) and regularised QDA (class covariances
    shrunk towards the pooled one by `qda_shrink`). `chance` = majority-class rate on the held-out part.
    Below-chance probe accuracy is expected when the eraser was fitted on these very rows: equal moments
    on the whole set make the two halves' residual class differences exactly opposite, so a probe trained
    on one half is anti-correlated on the other. Read "≤ chance" as "no usable information".
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
    del mom

    train, test = _split(labels, test_fraction, seed)
    feats, dim = _principal(x64, train)
    y_tr, y_te = labels[train], labels[test]
    counts_te = torch.bincount(y_te, minlength=k)
    lin = _logistic_acc(feats[train], y_tr, feats[test], y_te, k, probe_l2)
    qda = _qda_acc(feats[train], y_tr, feats[test], y_te, k, qda_shrink)
    return {
        "max_mean_gap": float(mean_gaps.max()), "max_cov_gap": float(cov_gaps.max()),
        "mean_gap_per_class": [float(v) for v in mean_gaps], "cov_gap_per_class": [float(v) for v in cov_gaps],
        "linear_probe_acc": lin, "quadratic_probe_acc": qda,
        "chance": float(counts_te.max()) / len(test), "n_train": len(train), "n_test": len(test),
        "probe_dim": dim, "seconds": time.perf_counter() - t0,
    }


def _split(y: Tensor, test_fraction: float, seed: int) -> tuple[Tensor, Tensor]:
    gen = torch.Generator(device="cpu").manual_seed(seed)
    train, test = [], []
    y_cpu = y.cpu()
    for c in range(int(y_cpu.max()) + 1):
        idx = (y_cpu == c).nonzero().flatten()
        idx = idx[torch.randperm(len(idx), generator=gen)]
        n_test = min(len(idx) - 1, max(1, round(len(idx) * test_fraction)))
        test.append(idx[:n_test])
        train.append(idx[n_test:])
    return torch.cat(train).to(y.device), torch.cat(test).to(y.device)


def _principal(x64: Tensor, train: Tensor) -> tuple[Tensor, int]:
    """All rows in the principal coordinates of the training rows (zero-variance directions dropped),
    scaled to unit mean variance. A rotation, so an L2 probe here equals one on the raw features."""
    xt = x64[train]
    mu = xt.mean(0)
    xc = xt - mu
    vals, vecs = eigh_desc(xc.T @ xc / max(len(xt) - 1, 1))
    r = max(numerical_rank(vals, 1e-10), 1)
    scale = float(vals[:r].clamp_min(0).mean()) ** 0.5 or 1.0
    return (x64 - mu) @ vecs[:, :r] / scale, r


def _logistic_acc(xtr: Tensor, ytr: Tensor, xte: Tensor, yte: Tensor, k: int, l2: float) -> float:
    xtr, xte = xtr.float(), xte.float()  # a probe needs no float64; halves the cost
    w = torch.zeros(xtr.shape[1] + 1, k, dtype=xtr.dtype, device=xtr.device, requires_grad=True)
    xtr1 = torch.cat([xtr, torch.ones(len(xtr), 1, dtype=xtr.dtype, device=xtr.device)], 1)
    opt = torch.optim.LBFGS([w], lr=1.0, max_iter=100, history_size=20, line_search_fn="strong_wolfe",
                            tolerance_grad=1e-6, tolerance_change=1e-9)

    def closure() -> Tensor:
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(xtr1 @ w, ytr) + 0.5 * l2 * w[:-1].pow(2).sum()
        loss.backward()
        return loss

    with torch.enable_grad():
        opt.step(closure)
    with torch.no_grad():
        pred = (xte @ w[:-1] + w[-1]).argmax(1)
    return float((pred == yte).double().mean())


def _qda_acc(xtr: Tensor, ytr: Tensor, xte: Tensor, yte: Tensor, k: int, shrink: float) -> float:
    d = xtr.shape[1]
    mom = class_moments(xtr, ytr, k, class_covs=True)
    assert mom.class_covs is not None
    pooled = torch.einsum("k,kij->ij", mom.priors, mom.class_covs)
    eye = torch.eye(d, dtype=xtr.dtype, device=xtr.device)
    covs = (1 - shrink) * mom.class_covs + shrink * pooled + 1e-3 * float(torch.trace(pooled)) / d * eye
    chol = torch.linalg.cholesky(covs)  # (k, d, d)
    logdet = 2 * torch.log(torch.diagonal(chol, dim1=-2, dim2=-1)).sum(-1)
    scores = torch.empty(len(xte), k, dtype=xtr.dtype, device=xtr.device)
    for c in range(k):
        z = torch.linalg.solve_triangular(chol[c], (xte - mom.means[c]).T, upper=False)
        scores[:, c] = torch.log(mom.priors[c]) - 0.5 * logdet[c] - 0.5 * z.pow(2).sum(0)
    return float((scores.argmax(1) == yte).double().mean())
