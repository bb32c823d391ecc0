"""Fit an eraser on more rows than fit in memory: class moments accumulated chunk by chunk.

    sums = erasure.streaming.MomentSums(num_classes=4, dim=64)
    for x, y in chunks:                        # any number of (n_i, d) float chunks with their labels
        sums.add(x, y)
    eraser = erasure.streaming.fit_moments("qleace", sums.moments())   # or fit_chunks("qleace", chunks, 4)

Per class it keeps the count, the mean and the scatter Σ (x − m)(x − m)ᵀ in float64, merged exactly (Chan et al.:
M = M_a + M_b + δδᵀ n_a n_b / n), so the memory is k·d² whatever the number of rows, and the eraser equals the one
fitted on the concatenation up to float64 round-off (tests/test_streaming_fit.py). The erasers that fit from
moments declare `from_moments` in their registry entry (LEACE, QLEACE, ALF-QLEACE, control).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .base import Eraser
from .moments import ClassMoments, as_tensor, sym
from .registry import ERASERS
from .threads import single_threaded


class MomentSums:
    """Running per-class count, mean and scatter (float64) of labelled rows."""

    def __init__(self, num_classes: int, dim: int, device: str | torch.device = "cpu") -> None:
        if num_classes < 2 or dim < 1:
            raise ValueError(f"MomentSums: need num_classes >= 2 and dim >= 1; got {num_classes}, {dim}")
        self.k, self.d = num_classes, dim
        self.counts = torch.zeros(num_classes, dtype=torch.long)
        self.means = torch.zeros(num_classes, dim, dtype=torch.float64, device=device)
        self.scatter = torch.zeros(num_classes, dim, dim, dtype=torch.float64, device=device)
        self.dtype = "float32"

    def add(self, x: Tensor | np.ndarray, y: Tensor | np.ndarray) -> None:
        xt, yt = as_tensor(x), as_tensor(y).long().cpu()
        flat = xt.reshape(len(xt), -1)
        if flat.shape[1] != self.d or len(yt) != len(flat):
            raise ValueError(f"MomentSums.add: expected (n, {self.d}) rows with n labels; got {tuple(flat.shape)} "
                             f"and {len(yt)} labels")
        if not bool(torch.isfinite(flat).all()):
            raise ValueError("MomentSums.add: the rows contain NaN or Inf values")
        if int(yt.min()) < 0 or int(yt.max()) >= self.k:
            raise ValueError(f"MomentSums.add: labels must be 0..{self.k - 1}")
        self.dtype = str(flat.dtype).replace("torch.", "")
        x64 = flat.to(self.means.device, torch.float64)
        for c in torch.unique(yt).tolist():
            rows = x64[(yt == c).to(x64.device)]
            nb, na = len(rows), int(self.counts[c])
            mb = rows.mean(0)
            centred = rows - mb
            sb = centred.T @ centred
            n = na + nb
            delta = mb - self.means[c]
            self.scatter[c] += sb + torch.outer(delta, delta) * (na * nb / n)
            self.means[c] += delta * (nb / n)
            self.counts[c] = n

    def moments(self) -> ClassMoments:
        """Class counts, priors, means, the global mean, the total and per-class covariances (Bessel's
        correction), as `moments.class_moments` gives them for the concatenated rows."""
        few = (self.counts < 2).nonzero().flatten().tolist()
        if few:
            raise ValueError(f"MomentSums: every class needs at least 2 rows; classes {few} have fewer")
        n = int(self.counts.sum())
        w = self.counts.to(torch.float64).to(self.means.device)
        priors = w / n
        mean = priors @ self.means
        offsets = self.means - mean
        between = torch.einsum("k,ki,kj->ij", w, offsets, offsets)
        cov = sym(self.scatter.sum(0) + between) / (n - 1)
        class_covs = sym(self.scatter) / (w - 1)[:, None, None]
        return ClassMoments(self.counts.clone(), priors, self.means.clone(), mean, cov, class_covs)


@single_threaded
def fit_moments(name: str, mom: ClassMoments, *, input_dtype: str = "float32", **options: Any) -> Eraser:
    """Eraser `name` fitted from class moments (total and per-class covariances set), with its fitter's options."""
    if name not in ERASERS or "from_moments" not in ERASERS.meta(name):
        able = [e.name for e in ERASERS if "from_moments" in e.meta]
        raise ValueError(f"eraser {name!r} cannot be fitted from moments; these can: {able}")
    if mom.cov is None or mom.class_covs is None:
        raise ValueError("fit_moments: the moments need the total and the per-class covariances")
    return ERASERS.meta(name)["from_moments"](mom, input_dtype=input_dtype, **options)


@single_threaded  # the chunks' moment sums too
def fit_chunks(name: str, chunks: Iterable[tuple[Tensor, Tensor]], num_classes: int, **options: Any) -> Eraser:
    """`fit_moments` on the moments of every (x, y) chunk, accumulated one chunk at a time."""
    sums: MomentSums | None = None
    for x, y in chunks:
        if sums is None:
            sums = MomentSums(num_classes, int(as_tensor(x).reshape(len(x), -1).shape[1]))
        sums.add(x, y)
    if sums is None:
        raise ValueError("fit_chunks: no chunks")
    return fit_moments(name, sums.moments(), input_dtype=sums.dtype, **options)
