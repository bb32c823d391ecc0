"""Input checks, float64 class moments and small symmetric-matrix helpers shared by all erasers."""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

EPS64 = float(torch.finfo(torch.float64).eps)


def as_tensor(x: Tensor | np.ndarray) -> Tensor:
    return x if isinstance(x, Tensor) else torch.as_tensor(x)


def flatten_features(x: Tensor | np.ndarray, name: str = "x") -> tuple[Tensor, torch.Size]:
    """`(n, ...)` -> `(n, d)` view plus the original shape. Rejects non-float and non-finite input."""
    x = as_tensor(x)
    if x.ndim < 2:
        raise ValueError(f"{name} must be (n, d) or images (n, C, H, W); got shape {tuple(x.shape)}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor (images scaled to [0, 1]); got {x.dtype}")
    if len(x) == 0:
        raise ValueError(f"{name} is empty")
    flat = x.reshape(len(x), -1)
    if not bool(torch.isfinite(flat).all()):
        bad = int((~torch.isfinite(flat)).any(dim=1).sum())
        raise ValueError(f"{name} contains NaN or Inf values (in {bad} of {len(flat)} rows)")
    return flat, x.shape


def check_labels(y: Tensor | np.ndarray, n: int, num_classes: int | None = None) -> tuple[Tensor, int]:
    """Validate integer labels 0..K-1 (every class present, each with >= 2 samples). Returns (y, K)."""
    y = as_tensor(y)
    if y.dtype == torch.bool or y.is_floating_point() or y.is_complex():
        raise TypeError(f"labels must be an integer tensor (int64 class ids 0..K-1); got {y.dtype}")
    if y.ndim != 1:
        raise ValueError(f"labels must be 1-D (n,); got shape {tuple(y.shape)}")
    if len(y) != n:
        raise ValueError(f"x has {n} samples but y has {len(y)} labels")
    y = y.long()
    if int(y.min()) < 0:
        raise ValueError(f"labels must be 0..K-1; found negative label {int(y.min())}")
    k = int(y.max()) + 1
    if num_classes is not None:
        if k > num_classes:
            raise ValueError(f"label {k - 1} is out of range for an eraser fitted on {num_classes} classes")
        return y, num_classes
    counts = torch.bincount(y.cpu(), minlength=k)
    missing = (counts == 0).nonzero().flatten().tolist()
    if missing:
        raise ValueError(f"labels must be 0..K-1 with every class present; classes {missing} have no samples")
    if k < 2:
        raise ValueError("need at least 2 classes to erase a concept; all labels are 0")
    few = (counts < 2).nonzero().flatten().tolist()
    if few:
        c = few[0]
        raise ValueError(f"class {c} has {int(counts[c])} sample; every class needs at least 2 "
                         f"(classes with < 2 samples: {few})")
    return y, k


@dataclass
class ClassMoments:
    """float64 moments of `(x, y)`. Covariances use Bessel's correction (n - 1 / n_k - 1)."""

    counts: Tensor  # (k,) int64
    priors: Tensor  # (k,) float64, counts / n
    means: Tensor  # (k, d)
    mean: Tensor  # (d,) global mean = priors @ means
    cov: Tensor | None = None  # (d, d) total covariance
    class_covs: Tensor | None = None  # (k, d, d)

    @property
    def k(self) -> int:
        return len(self.counts)

    @property
    def n(self) -> int:
        return int(self.counts.sum())

    def cross_cov(self) -> Tensor:
        """Cov(x, one-hot z), (d, k): column c is n_c (m_c - mu) / (n - 1)."""
        return ((self.means - self.mean) * self.counts[:, None].to(self.means)).T / (self.n - 1)


def class_moments(x64: Tensor, y: Tensor, k: int, *, total_cov: bool = False,
                  class_covs: bool = False) -> ClassMoments:
    """Means (and optionally total / per-class covariances) of float64 `x64` grouped by `y`."""
    counts = torch.bincount(y, minlength=k)
    n = len(x64)
    sums = torch.zeros(k, x64.shape[1], dtype=torch.float64, device=x64.device).index_add_(0, y, x64)
    means = sums / counts[:, None].to(sums)
    priors = counts.to(torch.float64) / n
    mean = x64.mean(0)
    mom = ClassMoments(counts.cpu(), priors, means, mean)
    if total_cov:
        xc = x64 - mean
        mom.cov = sym(xc.T @ xc) / (n - 1)
    if class_covs:
        covs = []
        for c in range(k):
            xc = x64[y == c] - means[c]
            covs.append(sym(xc.T @ xc) / (len(xc) - 1))
        mom.class_covs = torch.stack(covs)
    return mom


def sym(a: Tensor) -> Tensor:
    return (a + a.mT) / 2


def eigh_desc(a: Tensor) -> tuple[Tensor, Tensor]:
    """Eigen-decomposition of a symmetric matrix, eigenvalues in descending order (checked: `checked_eigh`)."""
    vals, vecs = checked_eigh(sym(a))
    return vals.flip(-1), vecs.flip(-1)


EIGH_RTOL = 64.0  # an eigenpair's residual ‖A v − λ v‖ and ‖VᵀV − I‖ may reach this × d × eps × ‖A‖ (float64 check)
_solver = torch.linalg.eigh  # the decomposition checked (tests inject a wrong one here)


def checked_eigh(a: Tensor) -> tuple[Tensor, Tensor]:
    """`torch.linalg.eigh` of a symmetric matrix or a batch of them (ascending), each decomposition checked in
    float64: every eigenpair's residual ‖A v − λ v‖ against its own matrix, and the eigenvectors' orthonormality.
    Some batched GPU solver paths return wrong eigenvectors or fail on low-rank float32 input; then (one warning)
    each matrix is decomposed alone on the CPU in float64, and that is returned (in `a`'s dtype and device)."""
    try:
        vals, vecs = _solver(a)
        good = _decomposes(a, vals, vecs)
    except RuntimeError as err:  # the solver failed to converge (an ill-conditioned or low-rank input)
        good, why = False, f"it failed ({str(err).splitlines()[0] if str(err) else type(err).__name__})"
    else:
        why = "an eigenpair's residual or the eigenvectors' orthonormality is off"
    if good:
        return vals, vecs
    warnings.warn(f"eigh of {tuple(a.shape)} {a.dtype} on {a.device}: {why}; decomposed again one matrix at a time "
                  "on the CPU in float64", RuntimeWarning, stacklevel=3)
    flat = a.detach().to("cpu", torch.float64).reshape(-1, *a.shape[-2:])
    pairs = [torch.linalg.eigh(m) for m in flat]
    vals = torch.stack([v for v, _ in pairs]).reshape(a.shape[:-1])
    vecs = torch.stack([q for _, q in pairs]).reshape(a.shape)
    return vals.to(a.device, a.dtype), vecs.to(a.device, a.dtype)


def _decomposes(a: Tensor, vals: Tensor, vecs: Tensor) -> bool:
    """Whether (vals, vecs) decompose each symmetric matrix of `a` (reads its lower triangle, as eigh does)."""
    a64 = torch.tril(a.to(torch.float64))
    a64 = a64 + torch.tril(a64, -1).mT
    v64, q64 = vals.to(torch.float64), vecs.to(torch.float64)
    d = a.shape[-1]
    if d == 0:
        return True
    tol = EIGH_RTOL * d * float(torch.finfo(a.dtype).eps)
    scale = torch.linalg.matrix_norm(a64).clamp_min(torch.finfo(torch.float64).tiny)  # per matrix
    residual = torch.linalg.vector_norm(a64 @ q64 - q64 * v64[..., None, :], dim=-2).amax(-1)
    eye = torch.eye(d, dtype=torch.float64, device=a.device)
    orthonormal = (q64.mT @ q64 - eye).abs().amax((-2, -1))
    return bool(torch.isfinite(residual).all() and (residual <= tol * scale).all() and (orthonormal <= tol).all())


def numerical_rank(vals_desc: Tensor, rtol: float | None = None) -> int:
    """Number of eigenvalues above `rtol * max` (default: d * eps, the torch.linalg.pinv heuristic)."""
    if rtol is None:
        rtol = vals_desc.shape[-1] * EPS64
    top = float(vals_desc[0]) if len(vals_desc) else 0.0
    return 0 if top <= 0 else int((vals_desc > rtol * top).sum())

