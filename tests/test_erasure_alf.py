"""ALF-QLEACE: target reached, no class deviation increases, label-free, rank-2 updates exact."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

import erasure
from erasure.alf_qleace import AlfQleaceEraser
from erasure.lanczos import top_abs_eig

from .test_erasure_common import F64, class_stats, gaussian_classes, max_mean_gap


def deviations(x: Tensor, y: Tensor) -> Tensor:
    """‖Σ_k − Σ̄‖₂ per class (Σ̄ = prior-weighted average), computed densely from the data."""
    _, covs, priors = class_stats(x, y)
    avg = torch.einsum("k,kij->ij", priors, covs)
    return torch.linalg.eigvalsh(covs - avg).abs().amax(-1)


@pytest.mark.parametrize("n, d, k, target", [(800, 8, 2, 0.9), (3000, 40, 3, 0.9), (5000, 100, 10, 0.9),
                                             (3000, 80, 4, 0.5)])
def test_target_reached_and_no_class_gets_worse(n: int, d: int, k: int, target: float) -> None:
    x, y = gaussian_classes(n, d, k, seed=d, spectrum=1.0, cov_scale=0.7)
    e = erasure.fit("alf_qleace", x, y, target=target)
    assert isinstance(e, AlfQleaceEraser)
    rep = e.report()
    xl = erasure.fit("leace", x, y)(x)
    before = deviations(xl, y)  # the initial deviation is measured after LEACE
    xe = e(x)
    after = deviations(xe, y)
    assert rep["stopped_by"] == "target"
    assert float(after.max()) <= (1 - target) * float(before.max()) * (1 + 1e-9)
    assert bool((after <= before * (1 + 1e-9) + 1e-12).all())
    assert abs(rep["initial_worst_deviation"] - float(before.max())) <= 1e-8 * float(before.max())
    assert abs(rep["final_worst_deviation"] - float(after.max())) <= 1e-7 * float(before.max())
    assert rep["rank_removed"] == rep["leace_rank"] + rep["alf_directions"] and rep["leace_rank"] == k - 1
    assert 0 < rep["alf_directions"] < d
    assert max_mean_gap(xe, y) <= 1e-10  # LEACE part still holds
    assert torch.allclose(e(xe), xe, atol=1e-10)  # an affine projection: idempotent
    assert not e.needs_labels  # label-free: each row is mapped alone
    perm = torch.randperm(n, generator=torch.Generator().manual_seed(0))
    assert torch.allclose(xe[perm], e(x[perm]), atol=1e-12)


def test_greedy_takes_the_worst_direction_first() -> None:
    """One class has a large extra variance along a known direction: the first removal is that direction."""
    x, y = gaussian_classes(4000, 30, 3, seed=3, cov_scale=0.2)
    g = torch.Generator().manual_seed(1)
    u = torch.randn(30, generator=g, dtype=F64)
    u /= u.norm()
    idx = y == 1
    x[idx] += 4.0 * torch.randn(int(idx.sum()), 1, generator=g, dtype=F64) * u
    e = erasure.fit("alf_qleace", x, y, max_rank=1)
    v = e.state["directions"][:, 0]
    assert abs(float(v @ u)) > 0.95
    assert e.report()["stopped_by"] == "max_rank" and e.report()["alf_directions"] == 1


def _dense_greedy(x: Tensor, y: Tensor, target: float) -> Tensor:
    """Reference: recompute P Σ_k P and P Σ̄ P densely and eigh them at every step. Returns V (d, r)."""
    xl = erasure.fit("leace", x, y)(x)
    _, covs, priors = class_stats(xl, y)
    avg = torch.einsum("k,kij->ij", priors, covs)
    d = x.shape[1]
    p = torch.eye(d, dtype=F64)
    dirs: list[Tensor] = []
    initial = None
    while True:
        vals, vecs = torch.linalg.eigh(p @ covs @ p - p @ avg @ p)
        worst = vals.abs().amax(-1)
        initial = float(worst.max()) if initial is None else initial
        if float(worst.max()) <= (1 - target) * initial:
            return torch.stack(dirs, 1)
        c = int(worst.argmax())
        v = vecs[c, :, int(vals[c].abs().argmax())]
        dirs.append(v)
        p = p - torch.outer(v, v)


def test_lanczos_matches_dense_eigh_and_rank2_updates_match_dense_greedy() -> None:
    g = torch.Generator().manual_seed(0)
    for d in (100, 300):
        a = torch.randn(d, d, generator=g, dtype=F64)
        a = a + a.T
        vals, vecs = torch.linalg.eigh(a)
        i = int(vals.abs().argmax())
        theta, u, _ = top_abs_eig(a, torch.randn(d, generator=g, dtype=F64), atol=1e-10 * float(vals.abs().max()))
        assert abs(theta - float(vals[i])) < 1e-8 * abs(float(vals[i]))
        assert abs(float(u @ vecs[:, i])) > 1 - 1e-8
    x, y = gaussian_classes(3000, 90, 4, seed=8, spectrum=0.5, cov_scale=0.7)
    ref = _dense_greedy(x, y, 0.9)
    ours = erasure.fit("alf_qleace", x, y, target=0.9).state["directions"]
    assert ours.shape == ref.shape
    assert torch.allclose(ours @ ours.T, ref @ ref.T, atol=1e-6)
