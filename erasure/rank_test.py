"""Rank regularity of a fitted linear eraser: are the K − 1 directions it removes more label-aligned than the ones it
would remove under shuffled labels?

LEACE removes col(W Σ_xz) (W = Σ_xx^{-1/2}, Σ_xz = Cov(x, one-hot z)): in whitened coordinates its k-th removed
direction carries label covariance s_k, the k-th singular value of W Σ_xz. Where the population class means are
(nearly) equal those directions are chosen by the fit sample's noise, and the edit removes structure that has
nothing to do with the concept. The test compares the WEAKEST removed direction, s_{K−1}, with its distribution
under `permutations` shuffles of the labels (the same rows, the same class counts): p = (1 + #{shuffled ≥ observed})
/ (1 + permutations). `rank_irregular` when p > `alpha`: at least one removed direction is no more label-aligned
than noise. Whitening uses the support of Σ_xx above `rtol`·λ_max; where the support reaches the rows (n − 1 ≤ its
rank) every labelling gives the same singular values and the fit is irregular by construction (p = 1).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from .moments import check_labels, eigh_desc, flatten_features, numerical_rank

PERMUTATIONS = 99
ALPHA = 0.05
RTOL = 1e-6  # LEACE's out-of-sample support threshold (erasure/leace.py HOLDOUT_RTOL)


def _alignment(z: Tensor, labels: Tensor, k: int) -> Tensor:
    """Singular values (descending) of the whitened cross-covariance of centred `z` with the one-hot labels."""
    sums = torch.zeros(k, z.shape[1], dtype=z.dtype).index_add_(0, labels, z)  # n_c (m_c − μ): z is centred
    return torch.linalg.svdvals(sums.T / (len(z) - 1))


def rank_test(x: Tensor | np.ndarray, y: Tensor | np.ndarray, *, permutations: int = PERMUTATIONS, seed: int = 0,
              alpha: float = ALPHA, rtol: float = RTOL) -> dict[str, Any]:
    """The permutation test above on the eraser's fit rows (x, y) (JSON-serialisable): `rank_irregular`, `p`,
    `alignment` (the K − 1 singular values), `null_weakest` (the shuffled fits' mean weakest one), `permutations`,
    `seed`, `rank_tested` (K − 1 and the support rank, the smaller)."""
    flat, _ = flatten_features(x)
    labels, k = check_labels(y, len(flat))
    x64 = flat.to(torch.float64).cpu()
    labels = labels.cpu()
    n = len(labels)
    xc = x64 - x64.mean(0)
    vals, vecs = eigh_desc(xc.T @ xc / max(n - 1, 1))
    r = numerical_rank(vals, rtol)
    z = xc @ (vecs[:, :r] / vals[:r].sqrt())
    m = min(k - 1, r)
    observed = _alignment(z, labels, k)[:m]
    gen = torch.Generator().manual_seed(seed)
    weakest = torch.tensor([float(_alignment(z, labels[torch.randperm(n, generator=gen)], k)[m - 1])
                            for _ in range(permutations)], dtype=torch.float64) if m > 0 else torch.zeros(0)
    # ties count against regularity: a statistic that no labelling changes (support = the rows) gives p = 1
    obs = float(observed[m - 1]) if m > 0 else 0.0
    p = (1 + int((weakest >= obs * (1 - 1e-9)).sum())) / (1 + permutations) if m > 0 else 1.0
    return {"rank_irregular": bool(p > alpha), "p": p, "alignment": [float(v) for v in observed],
            "null_weakest": float(weakest.mean()) if len(weakest) else 0.0, "permutations": permutations,
            "seed": seed, "rank_tested": m, "alpha": alpha}
