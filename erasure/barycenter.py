"""Bures-Wasserstein barycenter of centred Gaussians N(0, Σ_k) (Álvarez-Esteban et al. 2016 fixed point).

With S = L Lᵀ (Cholesky) the fixed point `S ← T S T`, `T = Σ_k w_k S^{-½}(S^{½} Σ_k S^{½})^{½} S^{-½}`, reads
`S ← L⁻ᵀ G² L⁻¹` with `G = Σ_k w_k (Lᵀ Σ_k L)^{½}` (any square-root factor of S gives the same T), so one
iteration costs one batched eigh of the k matrices Lᵀ Σ_k L and no eigh of S. The same eigh gives the
class → barycenter maps `T_k = (L Q_k) Λ_k^{-½} (L Q_k)ᵀ`, which satisfy T_k Σ_k T_k = S exactly.

Stopping rule (relative, dimensionless): the stationarity residual ‖T − I‖_F / √d of the maps from the
barycenter to the classes (T = I at the barycenter), with T = L⁻ᵀ G L⁻¹. Optional Anderson mixing of
the iterates (depth `anderson`) cuts the iteration count on heterogeneous classes.

Singular classes (QLEACE's coupling mode) make the fixed point sublinear: the objective
Σ_k w_k W₂²(N(0, S), N(0, Σ_k)) = tr S + Σ_k w_k tr Σ_k − 2 tr G settles long before the residual reaches
`tol` (MNIST-5k: relative decrease < 1e-7 per step after ~10 steps, residual still ~4e-3). With
`objective_rtol` set, the iteration also stops once the objective's relative decrease in one step falls
below it. The objective is reported either way. Maps use Λ_k^{+½} (pseudo-inverse), so a singular class
gets the map of its range instead of an infinite one.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from .moments import checked_eigh, sym


@dataclass
class Barycenter:
    cov: Tensor  # (d, d) barycenter covariance S
    maps: Tensor  # (k, d, d) symmetric PD maps T_k with T_k Σ_k T_k = S
    iterations: int  # fixed-point updates performed
    residual: float  # ‖Σ_k w_k T_k⁻¹ − I‖_F / √d at `cov`
    converged: bool
    history: list[float] = field(default_factory=list)
    objective: list[float] = field(default_factory=list)  # Σ_k w_k W₂² per evaluation (relative to Σ w_k tr Σ_k)
    stopped_by: str = "residual"  # residual | objective | stall | max_iter


@dataclass
class _Eval:
    chol: Tensor
    vals: Tensor
    vecs: Tensor
    residual: float
    new: Tensor
    objective: float  # Σ_k w_k W₂²(N(0, S), N(0, Σ_k)) without the constant Σ_k w_k tr Σ_k


def _evaluate(s: Tensor, covs: Tensor, w: Tensor) -> _Eval | None:
    chol, info = torch.linalg.cholesky_ex(s)
    if int(info) != 0:
        return None
    k, d, _ = covs.shape
    m = chol.mT @ (covs.reshape(k * d, d) @ chol).view(k, d, d)  # Lᵀ Σ_k L, one large GEMM first
    vals, vecs = checked_eigh(m)  # reads one triangle: no need to symmetrise first
    vals = vals.clamp_min(0.0)
    # G = Σ_k w_k Q_k Λ_k^½ Q_kᵀ = P Pᵀ with P = [Q_k (w_k Λ_k^½)^½]_k, as one (d × kd) GEMM
    p = (vecs * (w[:, None, None] * vals[:, None, :].sqrt()).sqrt()).permute(1, 0, 2).reshape(d, k * d)
    g = p @ p.T
    x = torch.linalg.solve_triangular(chol.mT, g, upper=True)  # L⁻ᵀ G
    t = torch.linalg.solve_triangular(chol.mT, x.mT, upper=True).mT  # L⁻ᵀ G L⁻¹
    eye = torch.eye(len(s), dtype=s.dtype, device=s.device)
    residual = float(torch.linalg.matrix_norm(t - eye)) / len(s) ** 0.5
    objective = float(torch.trace(s)) - 2 * float((w[:, None] * vals.sqrt()).sum())
    return _Eval(chol, vals, vecs, residual, sym(x @ x.mT), objective)


def barycenter(covs: Tensor, weights: Tensor, *, tol: float = 1e-9, max_iter: int = 100,
               anderson: int = 2, objective_rtol: float | None = None) -> Barycenter:
    """Barycenter covariance and class→barycenter maps of N(0, covs[k]) with weights (float64, PSD covs
    whose weighted mean is PD).

    Stops when the residual is <= tol, after `max_iter` updates, when it has not improved for 3
    evaluations (float64 noise floor), or (objective_rtol) when the objective decreased by less than
    objective_rtol · Σ_k w_k tr Σ_k in the last step; the best evaluated iterate is returned.
    """
    w = (weights / weights.sum()).to(covs)
    s = torch.einsum("k,kij->ij", w, covs)
    best: _Eval | None = None
    best_s = s
    history: list[float] = []
    objective: list[float] = []
    scale = float(torch.einsum("k,kii->", w, covs)) or 1.0
    stopped_by = "max_iter"
    fs: list[Tensor] = []
    gs: list[Tensor] = []
    stall = 0
    it = 0
    for it in range(max_iter + 1):
        ev = _evaluate(s, covs, w)
        if ev is None and gs:  # the extrapolated iterate lost definiteness: take the plain update
            s, fs, gs = gs[-1].view_as(s), [], []
            ev = _evaluate(s, covs, w)
        if ev is None:
            raise ValueError("barycenter: the weighted mean covariance is not positive definite")
        history.append(ev.residual)
        objective.append(1.0 + ev.objective / scale)
        settled = objective_rtol is not None and len(objective) > 1 and \
            objective[-2] - objective[-1] <= objective_rtol
        if best is None or ev.residual < best.residual or settled:
            best, best_s, stall = ev, s, 0
        else:
            stall += 1
        if ev.residual <= tol or stall >= 3 or settled or it == max_iter:
            stopped_by = "residual" if ev.residual <= tol else "stall" if stall >= 3 else \
                "objective" if settled else "max_iter"
            break
        s = _anderson(s, ev.new, fs, gs, anderson) if anderson > 0 else ev.new
    assert best is not None
    lq = best.chol @ best.vecs
    floor = best.vals[:, -1:] * best.vals.shape[-1] * torch.finfo(best.vals.dtype).eps
    inv_sqrt = torch.where(best.vals > floor, best.vals.clamp_min(floor.min()).rsqrt(), 0.0)
    maps = sym((lq * inv_sqrt[:, None, :]) @ lq.mT)
    return Barycenter(best_s, maps, it, best.residual, best.residual <= tol, history, objective,
                      stopped_by)


def _anderson(s: Tensor, g: Tensor, fs: list[Tensor], gs: list[Tensor], depth: int) -> Tensor:
    """Type-II Anderson mixing of the fixed-point iterates (history kept in fs/gs, modified in place)."""
    fs.append((g - s).flatten())
    gs.append(g.flatten())
    del fs[:-(depth + 1)], gs[:-(depth + 1)]
    if len(fs) < 2:
        return g
    df = torch.stack([b - a for a, b in zip(fs[:-1], fs[1:], strict=True)], 1)
    dg = torch.stack([b - a for a, b in zip(gs[:-1], gs[1:], strict=True)], 1)
    gamma = torch.linalg.lstsq(df, fs[-1][:, None]).solution
    return sym((gs[-1] - (dg @ gamma)[:, 0]).view_as(s))
