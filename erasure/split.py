"""Deterministic (optionally stratified) folds and holdouts: holdout fitting of an eraser and cross-fitted probes.

    fit_idx, coded_idx = erasure.split.holdout_split(y, 0.8, seed=0, repeat=0)   # fit on 80%, stratified, random

    fit_idx, coded_idx = erasure.split_fit(n, 0.2, fold=0, seed=0, labels=y)
    eraser = erasure.fit("leace", x[fit_idx], y[fit_idx])   # fitted on data the code never sees
    x_coded = eraser(x[coded_idx])                          # the rows the prequential code codes

With `round(1 / fraction)` folds, fold f's fit rows are disjoint from fold g's and together they cover all rows
(cross-fitting: each fold is its own MDL run, never pooled).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from .moments import as_tensor


def stratified_folds(n: int, folds: int, seed: int = 0, labels: Tensor | np.ndarray | None = None) -> list[Tensor]:
    """`folds` disjoint index sets (sorted int64, CPU) covering range(n), from a seeded permutation.

    With `labels`, every class is dealt round-robin over the folds (continuing where the previous class
    stopped), so each fold holds each class's share to within one row and the fold sizes differ by at most one.
    """
    if folds < 1 or folds > n:
        raise ValueError(f"need 1 <= folds <= n; got folds={folds}, n={n}")
    gen = torch.Generator(device="cpu").manual_seed(int(seed))
    if labels is None:
        groups = [torch.arange(n)]
    else:
        lab = as_tensor(labels).cpu().long()
        if lab.shape != (n,):
            raise ValueError(f"labels must have shape ({n},); got {tuple(lab.shape)}")
        groups = [(lab == c).nonzero().flatten() for c in torch.unique(lab).tolist()]
    assign = torch.empty(n, dtype=torch.long)
    offset = 0
    for idx in groups:
        perm = idx[torch.randperm(len(idx), generator=gen)]
        assign[perm] = (torch.arange(len(perm)) + offset) % folds
        offset += len(perm)
    return [(assign == f).nonzero().flatten() for f in range(folds)]


def split_fit(n: int, fraction: float, fold: int = 0, seed: int = 0,
              labels: Tensor | np.ndarray | None = None) -> tuple[Tensor, Tensor]:
    """(fit_idx, coded_idx) for holdout fitting: fold `fold` of `round(1 / fraction)` seeded folds is fitted on,
    the rest is coded. Deterministic in (n, fraction, fold, seed, labels); sorted int64 CPU indices; stratified
    by class when `labels` are given. The fit share is exactly 1 / round(1 / fraction) (up to one row per class).
    """
    if not 0.0 < fraction <= 0.5:
        raise ValueError(f"split_fit: fraction must be in (0, 0.5]; got {fraction}")
    folds = round(1.0 / fraction)
    if not 0 <= fold < folds:
        raise ValueError(f"split_fit: fold must be in 0..{folds - 1} for fraction {fraction}; got {fold}")
    parts = stratified_folds(n, folds, seed, labels)
    coded = torch.cat([p for f, p in enumerate(parts) if f != fold]).sort().values
    return parts[fold], coded


def fit_counts(labels: Tensor | np.ndarray, fraction: float) -> tuple[Tensor, Tensor]:
    """(class counts, fit rows per class) of `holdout_split`: round(fraction · n_k) per class k."""
    lab = as_tensor(labels).cpu().long()
    counts = torch.bincount(lab)
    return counts, torch.round(counts.to(torch.float64) * float(fraction)).long()


def holdout_split(labels: Tensor | np.ndarray, fraction: float, seed: int = 0,
                  repeat: int = 0) -> tuple[Tensor, Tensor]:
    """(fit_idx, coded_idx) of a repeated random stratified holdout: from each class k, round(fraction · n_k) rows
    drawn at random (seeded by (seed, repeat)) are fitted on and the others coded. `fraction` is any value in (0, 1)
    and really is the fit share (to rounding per class); sorted int64 CPU indices."""
    if not 0.0 < fraction < 1.0:
        raise ValueError(f"holdout_split: fraction must be in (0, 1); got {fraction}")
    lab = as_tensor(labels).cpu().long()
    counts, take = fit_counts(lab, fraction)
    gen = torch.Generator(device="cpu").manual_seed(int(np.random.SeedSequence([int(seed), int(repeat)])
                                                        .generate_state(1)[0]))
    fit = []
    for c in range(len(counts)):
        idx = (lab == c).nonzero().flatten()
        fit.append(idx[torch.randperm(len(idx), generator=gen)[: int(take[c])]])
    fit_idx = torch.cat(fit).sort().values
    mask = torch.ones(len(lab), dtype=torch.bool)
    mask[fit_idx] = False
    return fit_idx, mask.nonzero().flatten()


def stratified_sample(labels: Tensor | np.ndarray, n: int, seed: int = 0, repeat: int = 0) -> Tensor:
    """`n` of the rows (sorted int64 CPU indices), each class in proportion (rounded), drawn at random seeded by
    (seed, repeat): the fit rows `eraser.n_fit` takes from a pool."""
    lab = as_tensor(labels).cpu().long()
    if not 0 < n <= len(lab):
        raise ValueError(f"stratified_sample: n must be in 1..{len(lab)}; got {n}")
    return torch.arange(n) if n == len(lab) else holdout_split(lab, n / len(lab), seed, repeat)[0]
