"""Lanczos for the largest-magnitude eigenpair of a symmetric matrix (O(steps · d²), no d³ work)."""

from __future__ import annotations

import torch
from torch import Tensor


def top_abs_eig(mat: Tensor, start: Tensor, *, atol: float, max_steps: int = 64, check_every: int = 4,
                max_restarts: int = 10) -> tuple[float, Tensor, int]:
    """Largest-|λ| eigenvalue (signed) and unit eigenvector of symmetric `mat` (d, d).

    Lanczos with full re-orthogonalisation from `start` (a warm start converges in a few steps); stops
    when the Ritz residual ‖M u − θ u‖ ≤ atol, restarting from the Ritz vector after `max_steps`.
    Small matrices (d ≤ max_steps) use a dense eigh. Returns (theta, u, matvecs).
    """
    d = mat.shape[0]
    if d <= max_steps:
        vals, vecs = torch.linalg.eigh(mat)
        i = int(vals.abs().argmax())
        return float(vals[i]), vecs[:, i], 0
    u = start / start.norm().clamp_min(1e-300)
    theta, matvecs = 0.0, 0
    for _ in range(max_restarts):
        basis = torch.zeros(max_steps, d, dtype=mat.dtype, device=mat.device)
        alpha = torch.zeros(max_steps, dtype=mat.dtype, device=mat.device)
        beta = torch.zeros(max_steps, dtype=mat.dtype, device=mat.device)
        q = u
        for j in range(max_steps):
            basis[j] = q
            w = mat @ q
            matvecs += 1
            alpha[j] = w @ q
            for _ in range(2):  # full re-orthogonalisation, twice
                w = w - basis[: j + 1].T @ (basis[: j + 1] @ w)
            b = w.norm()
            beta[j] = b
            invariant = bool(b <= 1e-14 * alpha[: j + 1].abs().max().clamp_min(1e-300))
            if invariant or (j + 1) % check_every == 0 or j + 1 == max_steps:
                theta, u, resid = _ritz(alpha[: j + 1], beta[: j + 1], basis[: j + 1])
                if invariant or resid <= atol:
                    return theta, u, matvecs
            q = w / b
    return theta, u, matvecs


def _ritz(alpha: Tensor, beta: Tensor, basis: Tensor) -> tuple[float, Tensor, float]:
    tri = torch.diag(alpha) + torch.diag(beta[:-1], 1) + torch.diag(beta[:-1], -1)
    vals, vecs = torch.linalg.eigh(tri)
    i = int(vals.abs().argmax())
    s = vecs[:, i]
    u = s @ basis
    return float(vals[i]), u / u.norm(), float((beta[-1] * s[-1]).abs())
