"""LEACE (Belrose et al. 2023): the least-squares affine edit that makes all class means equal.

x' = x - W⁺ P W (x - μ), W = (Σ_xx)^{-1/2} (pseudo-inverse on the support of Σ_xx), P the orthogonal
projection onto the column space of W Σ_xz (Σ_xz = Cov(x, one-hot z)). Stored as the rank-r factors
`left = W⁺U`, `right = WU` (U an orthonormal basis of col(W Σ_xz)), so x' = x - ((x - μ) right) leftᵀ.
`method="orth"` is the plain orthogonal projection onto col(Σ_xz)^⊥ (also equalises means, larger edit).

Support threshold (`rtol`). Eigen-directions of Σ_xx with eigenvalue ≤ rtol·λ_max are null: W and W⁺ vanish
there, so the edit neither reads nor writes them (a pixel constant in the fit sample passes through unchanged,
also on rows where it varies). The default rtol = d·eps (the torch.linalg.pinv / concept-erasure threshold)
whitens every direction the sample has any variance in: exact equal class means on the fit sample (~1e-15).
Applied out of sample that can blow rows up: a direction with tiny fitted variance λ (a border pixel lit in
one fitted image) is scaled by 1/√λ and written back along directions of large variance. The edit matrix
A = W⁺PW bounds it: ‖x' − x‖ ≤ ‖A‖₂·‖x − μ‖, and ‖A‖₂ ≤ √(λ_max / λ_min kept) ≤ 1/√rtol; the report gives
`edit_norm` = ‖A‖₂ (1 for an orthogonal projection). Measured on MNIST-5k, fitted on a stratified 20%
(1000 rows, d = 784) and applied to the other 80%: rtol = d·eps gives ‖A‖₂ ≈ 1e4 and rows edited by up to
433× their distance from the mean; rtol = 1e-8: 15×; 1e-6: 3.4×; 1e-4: 1.2×. In sample (all 5000 rows) the
max class-mean gap (relative, certificate) is 2.5e-14 at d·eps, 2e-6 at 1e-8, 3.3e-5 at 1e-6, 9e-4 at 1e-4.
So: keep the default to erase the rows it was fitted on; pass `rtol=HOLDOUT_RTOL` (1e-6) for an eraser
applied to rows it never saw.
"""

from __future__ import annotations

import time
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from .base import Eraser, counts_info, prepare_fit
from .moments import EPS64, ClassMoments, class_moments, eigh_desc, numerical_rank
from .registry import ERASERS

HOLDOUT_RTOL = 1e-6  # support threshold recommended for an eraser applied out of sample (see the module doc)


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
        return basis, basis, {"support_rank": d, "rank_removed": int(basis.shape[1]), "rtol_used": None,
                              "edit_norm": 1.0 if basis.shape[1] else 0.0}
    if method != "leace":
        raise ValueError(f"leace: method must be 'leace' or 'orth'; got {method!r}")
    vals, vecs = eigh_desc(cov)
    rtol_used = d * EPS64 if rtol is None else float(rtol)
    r_sup = numerical_rank(vals, rtol)
    v, lam = vecs[:, :r_sup], vals[:r_sup]
    # W Σ_xz and W⁺ restricted to the support, without forming the d×d whitening matrix.
    wz = v @ ((v.T @ cross) / lam.sqrt()[:, None])
    basis, _ = _col_basis(wz)
    proj = v.T @ basis  # (r_sup, r)
    right = v @ (proj / lam.sqrt()[:, None])  # W U
    left = v @ (proj * lam.sqrt()[:, None])  # W⁺ U
    return left, right, {"support_rank": r_sup, "rank_removed": int(basis.shape[1]), "rtol_used": rtol_used,
                         "edit_norm": edit_norm(left, right)}


def edit_norm(left: Tensor, right: Tensor) -> float:
    """‖left rightᵀ‖₂ from thin QRs of the rank-r factors (the largest factor by which the edit scales x − μ)."""
    if left.shape[1] == 0:
        return 0.0
    r_left = torch.linalg.qr(left).R
    r_right = torch.linalg.qr(right).R
    return float(torch.linalg.matrix_norm(r_left @ r_right.T, ord=2))


def _col_basis(a: Tensor) -> tuple[Tensor, Tensor]:
    """Orthonormal basis of the numerical column space of `a` (relative threshold max(shape)·eps)."""
    u, s, _ = torch.linalg.svd(a, full_matrices=False)
    if len(s) == 0 or float(s[0]) == 0.0:
        return u[:, :0], s[:0]
    keep = s > s[0] * max(a.shape) * EPS64
    return u[:, keep], s[keep]


def leace_from_moments(mom: ClassMoments, *, input_dtype: str = "float32", method: Literal["leace", "orth"] = "leace",
                       rtol: float | None = None) -> LeaceEraser:
    """LEACE from class moments (the total covariance set): what `fit_leace` does after computing them."""
    t0 = time.perf_counter()
    assert mom.cov is not None
    left, right, stats = leace_factors(mom.mean, mom.cov, mom.cross_cov(), method=method, rtol=rtol)
    info = counts_info("leace", int(mom.mean.shape[0]), mom.counts, input_dtype, {"method": method, "rtol": rtol})
    info.update(stats)
    info["fit_seconds"] = time.perf_counter() - t0
    return LeaceEraser({"mean": mom.mean, "left": left, "right": right}, info)


@ERASERS.register("leace", family="linear", kind="map", from_moments=leace_from_moments,
                  holdout_options={"rtol": HOLDOUT_RTOL})
def fit_leace(x: Tensor | np.ndarray, y: Tensor | np.ndarray, *, method: Literal["leace", "orth"] = "leace",
              rtol: float | None = None) -> LeaceEraser:
    """Fit LEACE in float64.

    rtol: eigen-directions of Σ_xx with eigenvalue ≤ rtol·max are null (not whitened, not edited); None means
    d·eps (exact in sample). For rows the eraser was not fitted on use HOLDOUT_RTOL (1e-6): see the module doc.
    The report gives `rtol_used`, `support_rank` and `edit_norm` = ‖A‖₂ (x' = x − A(x − μ)).
    """
    t0 = time.perf_counter()
    x64, labels, flat, k = prepare_fit(x, y)
    mom = class_moments(x64, labels, k, total_cov=True)
    eraser = leace_from_moments(mom, input_dtype=str(flat.dtype).replace("torch.", ""), method=method, rtol=rtol)
    eraser.info["fit_seconds"] = time.perf_counter() - t0
    return eraser
