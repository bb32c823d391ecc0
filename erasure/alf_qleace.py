"""ALF-QLEACE (paper §2.3): LEACE, then a label-free orthogonal projection that removes the directions
along which class covariances deviate most from their average.

Greedy: with D_k = P(Σ_k − Σ̄)P (Σ_k the class covariances after LEACE, Σ̄ = Σ_k w_k Σ_k, P the current
projection), take the class with the largest spectral norm ‖D_k‖₂, remove its top singular vector v
(P ← P − vvᵀ) and update every D_k with the rank-2 formula D − (Dv)vᵀ − v(Dv)ᵀ + (vᵀDv)vvᵀ (O(k·d²));
the top singular vectors come from warm-started batched Lanczos (O(steps·k·d²)). Stop once the worst
deviation is ≤ (1 − target)·initial, or after `max_rank` directions. A projection never increases any
‖D_k‖₂. The eraser is x' = μ + (I − VVᵀ)(x_L − μ) with x_L the LEACE output: one affine map for all x.

`stop_norm="frobenius"` (the paper code's choice): the worst class and the stopping rule use ‖D_k‖_F instead
of ‖D_k‖₂ (computed exactly after every removal); the removed direction is still the worst class's top
singular vector. Frobenius mass spread over many directions keeps it going longer than the spectral rule.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from .base import Eraser, base_info, counts_info, prepare_fit
from .lanczos import top_abs_eig
from .leace import HOLDOUT_RTOL, leace_factors
from .moments import ClassMoments, class_moments, sym
from .registry import ERASERS

Greedy = tuple[Tensor, list[float], str, list[float], list[float]]
Top = Callable[[int, Tensor], float]


@dataclass(frozen=True, kw_only=True)
class AlfQleaceOptions:
    """ALF-QLEACE's options (`fit_alf_qleace(x, y, **options)`, `alf_from_moments`), each with its default.

    target: fraction of the worst class-covariance deviation (spectral norm, after LEACE) to remove.
    max_rank: cap on removed directions (None: d). lanczos_steps / eig_rtol: Krylov size per restart and
    residual tolerance (relative to the initial worst deviation) of the top-eigenvector search.
    leace_rtol: LEACE's support threshold (see erasure.leace). stop_norm: "spectral" (‖D_k‖₂, default) or
    "frobenius" (‖D_k‖_F, as the paper's code) for choosing the worst class and for the stopping rule; the
    report's deviations are in that norm. seed: the Lanczos start vectors.
    """

    target: float = 0.9
    max_rank: int | None = None
    lanczos_steps: int = 64
    eig_rtol: float = 1e-8
    leace_rtol: float | None = None
    seed: int = 0
    stop_norm: Literal["spectral", "frobenius"] = "spectral"

    def __post_init__(self) -> None:
        if not 0.0 <= self.target <= 1.0:
            raise ValueError(f"alf_qleace: target must be in [0, 1]; got {self.target}")
        if self.stop_norm not in ("spectral", "frobenius"):
            raise ValueError(f"alf_qleace: stop_norm must be 'spectral' or 'frobenius'; got {self.stop_norm!r}")


class AlfQleaceEraser(Eraser):
    """Label-free; state: mean (d,), LEACE factors left/right (d, r_L), removed directions (d, r_A)."""

    name = "alf_qleace"

    def _apply(self, x64: Tensor, y: Tensor | None) -> Tensor:
        z = x64 - self.state["mean"]
        z = z - (z @ self.state["right"]) @ self.state["left"].T
        v = self.state["directions"]
        return self.state["mean"] + z - (z @ v) @ v.T


def alf_from_moments(mom: ClassMoments, *, input_dtype: str = "float32", **options: Any) -> AlfQleaceEraser:
    """ALF-QLEACE from class moments (total and per-class covariances set): the class covariances after LEACE
    are Gᵀ Σ_k G with G = I − right leftᵀ (x_L − m_k = (x − m_k) G)."""
    o = AlfQleaceOptions(**options)
    t0 = time.perf_counter()
    assert mom.cov is not None and mom.class_covs is not None
    left, right, lstats = leace_factors(mom.mean, mom.cov, mom.cross_cov(), rtol=o.leace_rtol)
    g = torch.eye(mom.mean.shape[0], dtype=torch.float64, device=mom.mean.device) - right @ left.T
    dev = sym(g.T @ mom.class_covs @ g)
    info = counts_info("alf_qleace", int(mom.mean.shape[0]), mom.counts, input_dtype, dataclasses.asdict(o))
    return _alf_greedy(mom, (left, right, lstats), dev, o, info, t0)


@ERASERS.register("alf_qleace", family="quadratic", kind="map", options=AlfQleaceOptions,
                  from_moments=alf_from_moments, holdout_options={"leace_rtol": HOLDOUT_RTOL})
def fit_alf_qleace(x: Tensor | np.ndarray, y: Tensor | np.ndarray, **options: Any) -> AlfQleaceEraser:
    """Fit ALF-QLEACE in float64 with `AlfQleaceOptions(**options)`."""
    o = AlfQleaceOptions(**options)
    t0 = time.perf_counter()
    x64, labels, flat, k = prepare_fit(x, y)
    mom = class_moments(x64, labels, k, total_cov=True)
    assert mom.cov is not None
    left, right, lstats = leace_factors(mom.mean, mom.cov, mom.cross_cov(), rtol=o.leace_rtol)
    del mom.cov
    # Class covariances of the LEACE output, Σ̄ and the deviations D_k.
    xl = x64 - (x64 - mom.mean) @ right @ left.T
    dev = class_moments(xl, labels, k, class_covs=True).class_covs
    del xl
    assert dev is not None
    info = base_info("alf_qleace", flat, k, mom.counts, dataclasses.asdict(o))
    return _alf_greedy(mom, (left, right, lstats), dev, o, info, t0)


def _alf_greedy(mom: ClassMoments, leace: tuple[Tensor, Tensor, dict[str, Any]], dev: Tensor, o: AlfQleaceOptions,
                info: dict[str, Any], t0: float) -> AlfQleaceEraser:
    """The greedy on the class covariances after LEACE (`dev`, overwritten by the deviations D_k); `leace`: the
    LEACE factors (left, right) and their report."""
    left, right, lstats = leace
    k, d = mom.k, dev.shape[-1]
    dev -= torch.einsum("k,kij->ij", mom.priors.to(dev), dev)
    cap = d if o.max_rank is None else min(int(o.max_rank), d)

    gen = torch.Generator(device="cpu").manual_seed(o.seed)
    noise = torch.randn(k, d, generator=gen, dtype=torch.float64).to(dev.device)
    frob = [float(v) for v in torch.linalg.matrix_norm(dev)]
    vecs, norms, matvecs = noise.clone(), [0.0] * k, 0
    for c in range(k):  # initial top eigenpairs (Lanczos, tolerance relative to ‖D_c‖_F ≥ ‖D_c‖₂)
        theta, vecs[c], mv = top_abs_eig(dev[c], noise[c], atol=o.eig_rtol * frob[c], max_steps=o.lanczos_steps)
        norms[c], matvecs = abs(theta), matvecs + mv
    atol = o.eig_rtol * max(norms)

    def top(c: int, dirs: Tensor) -> float:
        """‖D_c‖₂ by Lanczos from class c's last vector (updated) projected ⊥ `dirs`, plus a little of its start."""
        nonlocal matvecs
        start = vecs[c] - dirs @ (dirs.T @ vecs[c]) + 1e-4 * noise[c]
        theta, vecs[c], mv = top_abs_eig(dev[c], start, atol=atol, max_steps=o.lanczos_steps)
        matvecs += mv
        return abs(theta)

    greedy = _frobenius_greedy if o.stop_norm == "frobenius" else _spectral_greedy
    dirs, history, stopped, initial_per_class, final_per_class = greedy(dev, vecs, norms, o.target, cap, top)
    initial = max(initial_per_class)
    r_alf = int(dirs.shape[1])
    info.update({
        "leace_rank": lstats["rank_removed"], "alf_directions": r_alf,
        "rank_removed": lstats["rank_removed"] + r_alf, "support_rank": lstats["support_rank"],
        "initial_worst_deviation": initial, "final_worst_deviation": max(final_per_class),
        "deviation_ratio": max(final_per_class) / initial if initial > 0 else 0.0,
        "initial_deviation_per_class": initial_per_class, "final_deviation_per_class": final_per_class,
        "worst_deviation_history": history + [max(final_per_class)], "stopped_by": stopped,
        "deviation_norm": o.stop_norm, "lanczos_matvecs": matvecs, "leace_rtol_used": lstats["rtol_used"],
        "leace_edit_norm": lstats["edit_norm"], "fit_seconds": time.perf_counter() - t0,
    })
    if stopped == "max_rank":
        info["warnings"].append(f"alf_qleace: reached max_rank={cap} before the target {o.target}")
    return AlfQleaceEraser({"mean": mom.mean, "left": left, "right": right, "directions": dirs}, info)


def _spectral_greedy(dev: Tensor, vecs: Tensor, norms: list[float], target: float, cap: int, top: Top) -> Greedy:
    """The greedy with ‖D_k‖₂ (`norms`: each class's, updated in place; `top`: class c's afresh, its top eigenvector
    into `vecs`): (directions, history of the worst deviation before each removal, stopped_by, initial and final
    spectral norms per class).

    Lazy: a projection never increases ‖D_k‖₂, so stale norms are upper bounds; only the class on top of the
    bounds is re-evaluated, and it is taken once its fresh norm is still the largest."""
    k, d = dev.shape[0], dev.shape[1]
    initial_per_class = list(norms)
    threshold = (1.0 - target) * max(norms)
    fresh = [True] * k
    dirs = torch.zeros(d, 0, dtype=torch.float64, device=dev.device)
    history: list[float] = []
    while True:
        c = max(range(k), key=lambda j: norms[j])
        if norms[c] <= threshold or dirs.shape[1] >= cap:
            stopped = "target" if norms[c] <= threshold else "max_rank"
            break
        if not fresh[c]:
            norms[c], fresh[c] = top(c, dirs), True
            continue
        dirs = _remove(dev, vecs[c], dirs)
        history.append(norms[c])
        fresh = [False] * k
    return dirs, history, stopped, initial_per_class, [top(c, dirs) for c in range(k)]


def _remove(dev: Tensor, vec: Tensor, dirs: Tensor) -> Tensor:
    """Project v = vec ⊥ dirs (normalised) out of every D_k in place; returns dirs with v appended."""
    k, d = dev.shape[0], dev.shape[1]
    v = vec - dirs @ (dirs.T @ vec)
    v = v / v.norm()
    dv = dev @ v  # (k, d)
    u = dv - 0.5 * (dv @ v)[:, None] * v  # D ← D − u vᵀ − v uᵀ  ==  (I − vvᵀ) D (I − vvᵀ)
    vv = v.expand(k, d)
    dev.baddbmm_(torch.stack([u, vv], 2), torch.stack([vv, u], 1), alpha=-1.0)
    return torch.cat([dirs, v[:, None]], 1)


def _frobenius_greedy(dev: Tensor, vecs: Tensor, norms: list[float], target: float, cap: int, top: Top) -> Greedy:
    """The greedy with ‖D_k‖_F (exact after every removal) for the worst class and the stop; the same outputs
    as _spectral_greedy, in the Frobenius norm (`norms`, the spectral ones, are not read)."""
    k, d = dev.shape[0], dev.shape[1]
    fro = torch.linalg.matrix_norm(dev)
    initial_per_class = [float(v) for v in fro]
    threshold = (1.0 - target) * max(initial_per_class)
    dirs = torch.zeros(d, 0, dtype=torch.float64, device=dev.device)
    history: list[float] = []
    fresh = [True] * k
    while True:
        c = int(torch.argmax(fro))
        worst = float(fro[c])
        if worst <= threshold or dirs.shape[1] >= cap:
            stopped = "target" if worst <= threshold else "max_rank"
            break
        if not fresh[c]:
            top(c, dirs)
        dirs = _remove(dev, vecs[c], dirs)
        history.append(worst)
        fresh = [False] * k
        fro = torch.linalg.matrix_norm(dev)
    return dirs, history, stopped, initial_per_class, [float(v) for v in fro]
