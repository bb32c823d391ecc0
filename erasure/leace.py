"""LEACE (Belrose et al. 2023): the least-squares affine edit that makes all class means equal.

x' = x - W⁺ P W (x - μ), W = (Σ_xx)^{-1/2} (pseudo-inverse on the support of Σ_xx), P the orthogonal
projection onto the column space of W Σ_xz (Σ_xz = Cov(x, one-hot z)). Stored as the rank-r factors
`left = W⁺U`, `right = WU` (U an orthonormal basis of col(W Σ_xz)), so x' = x - ((x - μ) right) leftᵀ.
`method="orth"` is the plain orthogonal projection onto col(Σ_xz)^⊥ (also equalises means, larger edit).
"""

from __future__ import annotations

import time
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from .base import Eraser, base_info, prepare_fit
from .moments import EPS64, class_moments, eigh_desc, numerical_rank
from .registry import ERASERS


class LeaceEraser(Eraser):
    name = "leace"

    @property
    def rank(self) -> int:
        return int(self.state["left"].shape[1])

    def _apply(self, x64: Tensor, y: Tensor | None) -> Tensor:
        left, right = self.state["left"], self.state["right"]
        return x64 - ((x64 - self.state["mean"]) @ right) @ left.T

    def matrix(self) -> Tensor:
        """The (d, d) edit matrix A with x' = x - A (x - μ)."""
        return self.state["left"] @ self.state["right"].T


def leace_factors(mean: Tensor, cov: Tensor, cross: Tensor, *, method: str = "leace",
                  rtol: float | None = None) -> tuple[Tensor, Tensor, dict[str, Any]]:
    """Rank-r factors (left, right) of the LEACE edit from float64 Σ_xx and Σ_xz."""
    d = cov.shape[0]
    if method == "orth":
        basis, s = _col_basis(cross)
        return basis, basis, {"support_rank": d, "rank_removed": int(basis.shape[1])}
    if method != "leace":
        raise ValueError(f"leace: method must be 'leace' or 'orth'; got {method!r}")
    vals, vecs = eigh_desc(cov)
    r_sup = numerical_rank(vals, rtol)
    v, lam = vecs[:, :r_sup], vals[:r_sup]
    # W Σ_xz and W⁺ restricted to the support, without forming the d×d whitening matrix.
    wz = v @ ((v.T @ cross) / lam.sqrt()[:, None])
    basis, _ = _col_basis(wz)
    proj = v.T @ basis  # (r_sup, r)
    right = v @ (proj / lam.sqrt()[:, None])  # W U
    left = v @ (proj * lam.sqrt()[:, None])  # W⁺ U
    return left, right, {"support_rank": r_sup, "rank_removed": int(basis.shape[1])}


def _col_basis(a: Tensor) -> tuple[Tensor, Tensor]:
    """Orthonormal basis of the numerical column space of `a` (relative threshold max(shape)·eps)."""
    u, s, _ = torch.linalg.svd(a, full_matrices=False)
    if len(s) == 0 or float(s[0]) == 0.0:
        return u[:, :0], s[:0]
    keep = s > s[0] * max(a.shape) * EPS64
    return u[:, keep], s[keep]


@ERASERS.register("leace", family="linear", kind="map")
def fit_leace(x: Tensor | np.ndarray, y: Tensor | np.ndarray, *, method: Literal["leace", "orth"] = "leace",
              rtol: float | None = None) -> LeaceEraser:
    """Fit LEACE in float64. `rtol`: eigenvalues of Σ_xx below rtol·max are treated as zero (default d·eps)."""
    t0 = time.perf_counter()
    x64, labels, flat, k = prepare_fit(x, y)
    mom = class_moments(x64, labels, k, total_cov=True)
    assert mom.cov is not None
    left, right, stats = leace_factors(mom.mean, mom.cov, mom.cross_cov(), method=method, rtol=rtol)
    info = base_info("leace", flat, k, mom.counts, {"method": method, "rtol": rtol})
    info.update(stats)
    info["fit_seconds"] = time.perf_counter() - t0
    return LeaceEraser({"mean": mom.mean, "left": left, "right": right}, info)
