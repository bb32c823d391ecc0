"""Random baseline (paper Fig. 1): orthogonal projection removing a random subspace of a given rank."""

from __future__ import annotations

import time

import numpy as np
import torch
from torch import Tensor

from .base import Eraser, base_info, prepare_fit
from .registry import ERASERS
from .traits import RankHint


class RandomEraser(Eraser):
    """Label-free; x' = μ + (I − VVᵀ)(x − μ) with V (d, r) a Haar-random orthonormal basis."""

    name = "random"

    def _apply(self, x64: Tensor, y: Tensor | None) -> Tensor:
        v = self.state["directions"]
        z = x64 - self.state["mean"]
        return x64 - (z @ v) @ v.T


@ERASERS.register("random", family="linear", kind="map", rank_hint=RankHint(option="rank", source="alf_qleace"))
def fit_random(x: Tensor | np.ndarray, y: Tensor | np.ndarray, *, rank: int | None = None, seed: int = 0,
               rank_hint: int | None = None) -> RandomEraser:
    """rank: dimensions to remove; None uses `rank_hint` (the ALF-QLEACE rank of the same data, passed by
    the caller), else falls back to K − 1 (the LEACE rank) and says so in the report."""
    t0 = time.perf_counter()
    x64, labels, flat, k = prepare_fit(x, y)
    d = x64.shape[1]
    if rank is not None:
        r, source = int(rank), "option"
    elif rank_hint is not None:
        r, source = int(rank_hint), "rank_hint"
    else:
        r, source = k - 1, "num_classes-1 (no rank and no rank_hint given)"
    if not 0 <= r <= d:
        raise ValueError(f"random: rank must be in [0, d={d}]; got {r}")
    gen = torch.Generator(device="cpu").manual_seed(seed)
    q, rr = torch.linalg.qr(torch.randn(d, r, generator=gen, dtype=torch.float64))
    q = q * torch.sign(torch.diagonal(rr))  # unique (Haar) basis
    info = base_info("random", flat, k, torch.bincount(labels, minlength=k).cpu(),
                     {"rank": rank, "seed": seed})
    info.update({"rank_removed": r, "rank_source": source, "fit_seconds": time.perf_counter() - t0})
    if source.startswith("num_classes"):
        info["warnings"].append(f"random: no rank given; removed K-1 = {r} directions")
    return RandomEraser({"mean": x64.mean(0), "directions": q.to(x64.device)}, info)
