"""QLEACE (paper Thm 2.6): per-class optimal-transport maps onto the Gaussian barycenter of the classes.

x' = μ + T_k (x − m_k) for x of class k, T_k = Σ_k^{-½}(Σ_k^{½} C Σ_k^{½})^{½}Σ_k^{-½}, C the barycenter of
N(0, Σ_k) with weights = class priors. Afterwards every class has mean μ and covariance C (float64).

Rank deficiency. All work happens in the eigenbasis V of the pooled within-class covariance
Σ_w = Σ_k w_k Σ_k (orthogonal change of basis: maps and barycenter are equivariant). Directions outside
the support of Σ_w (e.g. pixels constant in every class) carry no within-class variance and are set to
the global mean — exact, nothing is lost beyond between-class offsets there. Inside the support a class
covariance may still be (near-)singular (a pixel constant in one class; n_k < d); then no linear map can
give all classes the same covariance, and the fit either
  - `rank_deficient="truncate"` (default): keeps the top-r principal directions of Σ_w, with r the largest
    dimension on which every whitened class covariance has eigenvalues ≥ `class_rtol`; the other
    directions are set to the mean. Class means and covariances are then exactly equal everywhere.
  - `rank_deficient="ridge"`: adds `ridge · mean eigenvalue(Σ_w)` to every class covariance; all support
    directions are kept but class covariances are only approximately equal (residual in the report).
Either way a single warning says what was done, and report() records it.
"""

from __future__ import annotations

import time
import warnings
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from .barycenter import barycenter
from .base import Eraser, base_info, prepare_fit
from .moments import class_moments, eigh_desc, numerical_rank
from .registry import ERASERS


class QleaceEraser(Eraser):
    """Label-dependent eraser; state: mean (d,), basis (d, r), class_means (k, r), maps (k, r, r)."""

    name = "qleace"
    needs_labels = True

    def _apply(self, x64: Tensor, y: Tensor | None) -> Tensor:
        assert y is not None
        mean, basis = self.state["mean"], self.state["basis"]
        z = (x64 - mean) @ basis
        out = torch.empty_like(z)
        for c in torch.unique(y).tolist():
            idx = y == c
            out[idx] = (z[idx] - self.state["class_means"][c]) @ self.state["maps"][c]
        return mean + out @ basis.T

    def maps_full(self) -> Tensor:
        """Class → barycenter maps in the input coordinates, (k, d, d) (zero off the working subspace)."""
        b = self.state["basis"]
        return b @ self.state["maps"] @ b.T

    def barycenter_full(self) -> Tensor:
        b = self.state["basis"]
        return b @ self.state["barycenter"] @ b.T


@ERASERS.register("qleace", family="quadratic", kind="map")
def fit_qleace(x: Tensor | np.ndarray, y: Tensor | np.ndarray, *, tol: float = 1e-8, max_iter: int = 100,
               anderson: int = 2, rank_deficient: Literal["truncate", "ridge"] = "truncate",
               class_rtol: float = 1e-7, ridge: float = 1e-6, support_rtol: float = 1e-10) -> QleaceEraser:
    """Fit QLEACE in float64.

    tol / max_iter / anderson: barycenter stopping rule (relative stationarity residual), iteration cap and
    Anderson depth (0 = plain fixed point). class_rtol: a whitened class covariance eigenvalue below this
    counts as singular. support_rtol: eigenvalues of Σ_w below support_rtol·max are outside the support.
    """
    if rank_deficient not in ("truncate", "ridge"):
        raise ValueError(f"qleace: rank_deficient must be 'truncate' or 'ridge'; got {rank_deficient!r}")
    options = {"tol": tol, "max_iter": max_iter, "anderson": anderson, "rank_deficient": rank_deficient,
               "class_rtol": class_rtol, "ridge": ridge, "support_rtol": support_rtol}
    t0 = time.perf_counter()
    x64, labels, flat, k = prepare_fit(x, y)
    mom = class_moments(x64, labels, k, class_covs=True)
    assert mom.class_covs is not None
    d = x64.shape[1]
    info = base_info("qleace", flat, k, mom.counts, options)

    pooled = torch.einsum("k,kij->ij", mom.priors, mom.class_covs)
    vals, vecs = eigh_desc(pooled)
    s = numerical_rank(vals, support_rtol)
    if s == 0:
        raise ValueError("qleace: every class has zero variance; nothing to fit")
    v = vecs[:, :s]
    covs = v.T @ (mom.class_covs.reshape(k * d, d) @ v).view(k, d, s)  # (k, s, s) in the pooled eigenbasis
    del mom.class_covs
    inv_sd = vals[:s].rsqrt()
    r, handling = s, ("none" if s == d else "support")
    ridge_used = 0.0
    min_eig: float | None = None
    # A class is (near-)singular when its covariance, whitened by the pooled one, has an eigenvalue below
    # class_rtol; Cholesky of (whitened − class_rtol·I) decides that exactly and costs a third of an eigvalsh.
    if not _all_above(covs, inv_sd, class_rtol):
        white_eigs = torch.linalg.eigvalsh(covs * inv_sd[:, None] * inv_sd[None, :])
        min_eig = float(white_eigs[:, 0].min())
        bad = (white_eigs[:, 0] < class_rtol).nonzero().flatten().tolist()
        if rank_deficient == "truncate":
            # interlacing: an r-dim compression with min eigenvalue ≥ τ needs r ≤ #(eigenvalues ≥ τ)
            upper = int((white_eigs >= class_rtol).sum(-1).min())
            r = _stable_rank(covs, inv_sd, class_rtol, upper + 1)
            handling = "truncate"
            what = (f"kept the top {r} of {s} principal directions of the pooled covariance "
                    f"({_frac(vals, r):.4%} of its variance); the rest is set to the mean")
        else:
            ridge_used = ridge * float(vals[:s].mean())
            covs = covs + ridge_used * torch.eye(s, dtype=covs.dtype, device=covs.device)
            handling = "ridge"
            what = f"added a ridge of {ridge_used:.3g} to every class covariance (covariances only ~equal)"
        msg = (f"qleace: class covariances are rank-deficient (classes {bad}; support rank {s} of d={d}; "
               f"n_k min {int(mom.counts.min())}): {what}")
        warnings.warn(msg, stacklevel=2)
        info["warnings"].append(msg)

    covs = covs[:, :r, :r]
    basis = v[:, :r].contiguous()
    bary = barycenter(covs, mom.priors, tol=tol, max_iter=max_iter, anderson=anderson)
    if not bary.converged:
        msg = (f"qleace: barycenter stopped after {bary.iterations} iterations at residual "
               f"{bary.residual:.3g} > tol {tol:g}")
        warnings.warn(msg, stacklevel=2)
        info["warnings"].append(msg)
    info.update({
        "support_rank": s, "working_rank": r, "dims_set_to_mean": d - r, "rank_handling": handling,
        "variance_dropped_fraction": 1.0 - _frac(vals, r), "ridge_used": ridge_used,
        "min_whitened_class_eig": min_eig,  # computed only when some class is below class_rtol
        "barycenter_iterations": bary.iterations, "barycenter_residual": bary.residual,
        "barycenter_converged": bary.converged, "barycenter_history": bary.history,
        "fit_seconds": time.perf_counter() - t0,
    })
    state = {"mean": mom.mean, "basis": basis, "class_means": (mom.means - mom.mean) @ basis,
             "maps": bary.maps, "barycenter": bary.cov}
    return QleaceEraser(state, info)


def _frac(vals: Tensor, r: int) -> float:
    tot = float(vals.clamp_min(0).sum())
    return float(vals[:r].clamp_min(0).sum()) / tot if tot > 0 else 1.0


def _all_above(covs: Tensor, inv_sd: Tensor, tau: float) -> bool:
    """Every whitened class covariance (leading block of size covs.shape[-1]) has min eigenvalue > tau."""
    r = covs.shape[-1]
    w = inv_sd[:r]
    eye = torch.eye(r, dtype=covs.dtype, device=covs.device)
    return bool((torch.linalg.cholesky_ex(covs * w[:, None] * w[None, :] - tau * eye).info == 0).all())


def _stable_rank(covs: Tensor, inv_sd: Tensor, class_rtol: float, hi: int) -> int:
    """Largest r whose leading r×r whitened class covariances all have min eigenvalue ≥ class_rtol.

    Monotone in r (the min generalised Rayleigh quotient over nested subspaces can only fall), so bisect.
    """
    lo, hi = 0, min(hi, covs.shape[-1])  # ok(lo) holds (empty), ok(hi) fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _all_above(covs[:, :mid, :mid], inv_sd, class_rtol) else (lo, mid)
    if lo == 0:
        raise ValueError("qleace: some class covariance is numerically zero; cannot equalise covariances")
    return lo
