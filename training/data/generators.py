"""Generator datasets with a known answer (issue 29): class-conditional Gaussians and two-component mixtures.

Each class's law is fixed by `data_seed`; the rows are draws from it. The coded rows (`draw(o, rows, 0)`) and any
other draws (`eraser.fit_on=oracle`: fresh rows the code never sees, `oracle_chunks`) come from separate seeds, so
an eraser can be fitted on the population as closely as one likes without touching the coded data.

- `gaussian`: class k ~ N(mean_gap·u_k, σ²(I + cov_gap·(d/4)·a_k a_kᵀ)), u_k and a_k random unit vectors; equal
  covariances when cov_gap = 0. Population QLEACE (and population LEACE when cov_gap = 0) leaves x independent of
  y: the true code length of the labels is then H(Y) (log2 K, the classes being balanced).
- `mixture`: class k ~ ½ N(mean_gap·u_k + s·a_k, σ²I) + ½ N(mean_gap·u_k − s·a_k, σ²I), s = `separation`·σ: every
  class has mean mean_gap·u_k and covariance σ²I + s² a_k a_kᵀ, but is bimodal along its own direction. QLEACE
  matches the first two moments only, so the bimodality (the label) survives it: the true code is below H(Y).

Rows per class = round(rows_per_dim · dim) (`dataset.rows_per_dim`); images of shape (1, 1, dim).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from erasure.moments import ClassMoments
from training.common.option_checks import NONNEG, POSITIVE, POSITIVE_NUMBER
from training.data.registry import DatasetCfg, LoadedData, register

CHUNK_ROWS = 4096  # rows per class per oracle chunk (memory: K · CHUNK_ROWS · d float64)


@dataclass(frozen=True, kw_only=True)
class GaussianOptions:
    """`dataset=gaussian`'s own keys (conf/dataset/gaussian.yaml)."""

    dim: int = field(metadata=POSITIVE)
    num_classes: int = field(metadata={"check": lambda v: v >= 2, "allowed": "an integer ≥ 2"})
    rows_per_dim: float = field(metadata=POSITIVE_NUMBER)
    mean_gap: float = field(metadata=NONNEG)  # norm of each class-mean offset
    cov_gap: float = field(metadata=NONNEG)  # strength of each class's own covariance direction (0: equal)
    sigma: float = field(metadata=POSITIVE_NUMBER)
    data_seed: int = field(metadata=NONNEG)

    @property
    def rows_per_class(self) -> int:
        return max(2, round(self.rows_per_dim * self.dim))


@dataclass(frozen=True, kw_only=True)
class MixtureOptions(GaussianOptions):
    """`dataset=mixture`: GaussianOptions (cov_gap unused: 0) and the half-distance of each class's two modes."""

    separation: float = field(metadata=POSITIVE_NUMBER)


def _gen(*key: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(np.random.SeedSequence(list(key)).generate_state(1)[0]))


def _law(o: GaussianOptions) -> tuple[Tensor, Tensor]:
    """Each class's mean offset direction u_k and own direction a_k (unit rows, (K, d) each), from data_seed."""
    g = _gen(o.data_seed, 0)
    u = torch.randn(o.num_classes, o.dim, generator=g, dtype=torch.float64)
    a = torch.randn(o.num_classes, o.dim, generator=g, dtype=torch.float64)
    return u / u.norm(dim=1, keepdim=True), a / a.norm(dim=1, keepdim=True)


def draw(o: GaussianOptions, rows_per_class: int, *key: int) -> tuple[Tensor, Tensor]:
    """`rows_per_class` rows of every class (float32 (n, 1, 1, d), labels 0..K-1 interleaved), from the seed
    (data_seed, 1, *key): key () the coded rows, (1, i) the i-th oracle chunk."""
    u, a = _law(o)
    k, d = o.num_classes, o.dim
    g = _gen(o.data_seed, 1, *key)
    y = torch.arange(rows_per_class * k) % k
    z = torch.randn(len(y), d, generator=g, dtype=torch.float64)
    if isinstance(o, MixtureOptions):
        sign = torch.randint(0, 2, (len(y), 1), generator=g, dtype=torch.float64) * 2 - 1
        x = o.mean_gap * u[y] + o.sigma * (z + o.separation * sign * a[y])
    else:
        boost = math.sqrt(1 + o.cov_gap * d / 4) - 1
        z = z + boost * (z * a[y]).sum(1, keepdim=True) * a[y]
        x = o.mean_gap * u[y] + o.sigma * z
    return x.float().reshape(len(y), 1, 1, d), y


def oracle_chunks(o: GaussianOptions, rows_per_class: int) -> Iterator[tuple[Tensor, Tensor]]:
    """Fresh rows of every class, `rows_per_class` in all, in chunks of at most CHUNK_ROWS per class; never the
    coded rows (their seeds differ)."""
    done, i = 0, 0
    while done < rows_per_class:
        m = min(CHUNK_ROWS, rows_per_class - done)
        yield draw(o, m, 1, i)
        done, i = done + m, i + 1


def label_entropy_bits(o: GaussianOptions) -> float:
    """H(Y) of the balanced classes: log2 K."""
    return math.log2(o.num_classes)


def _load(name: str, cfg: DatasetCfg) -> LoadedData:
    o: GaussianOptions = cfg.options
    x, y = draw(o, o.rows_per_class)
    return LoadedData(name, x, y, o.num_classes, {"source": f"generator {name} (data_seed {o.data_seed})",
                                                  "rows_per_class": o.rows_per_class,
                                                  "label_entropy_bits": label_entropy_bits(o)})


@register("gaussian", options=GaussianOptions, generator=True)
def load_gaussian(cfg: DatasetCfg, data_dir: Path) -> LoadedData:
    return _load("gaussian", cfg)


@register("mixture", options=MixtureOptions, generator=True)
def load_mixture(cfg: DatasetCfg, data_dir: Path) -> LoadedData:
    return _load("mixture", cfg)


POPULATION_N = 10**9  # each class's count in population moments: Bessel's correction vanishes


def class_laws(o: GaussianOptions) -> tuple[Tensor, Tensor]:
    """Each class's exact mean (K, d) and covariance (K, d, d), float64: gaussian σ²(I + cov_gap·(d/4)·a_k a_kᵀ)
    (what `draw` makes: z + boost·(z·a)a has covariance (I + ((1 + boost)² − 1) a aᵀ)); mixture σ²(I + s² a_k a_kᵀ)
    (its two modes ± σ s a_k, equal weights)."""
    u, a = _law(o)
    strength = o.separation**2 if isinstance(o, MixtureOptions) else o.cov_gap * o.dim / 4
    covs = o.sigma**2 * (torch.eye(o.dim, dtype=torch.float64) + strength * torch.einsum("ki,kj->kij", a, a))
    return o.mean_gap * u, covs


def population_moments(o: GaussianOptions) -> ClassMoments:
    """The generator's exact class moments (`eraser.fit_on=population`: the eraser fitted on the population, as
    if from infinitely many rows): balanced priors, class means and covariances from `class_laws`."""
    means, covs = class_laws(o)
    k = o.num_classes
    priors = torch.full((k,), 1.0 / k, dtype=torch.float64)
    mean = priors @ means
    total = torch.einsum("k,kij->ij", priors, covs) + torch.einsum("k,ki,kj->ij", priors, means - mean, means - mean)
    return ClassMoments(torch.full((k,), POPULATION_N), priors, means, mean, total, covs)


def mixture_truth_bits(o: MixtureOptions, rows_per_class: int = 50_000) -> float:
    """H(Y | X') in bits for `mixture` after POPULATION QLEACE: the code length a learner approaches with unlimited
    data (Monte Carlo over `rows_per_class` fresh draws per class, seeded; its standard error is printed by
    scripts/calibrate.py as negligible at the default size).

    QLEACE is fitted on the exact class moments (`population_moments`), so it is the population map; class k's
    erased law is then ½N(±σ s M_k a_k, σ² M_k M_k) in the working basis (M_k its symmetric map), and p(y | x')
    follows from those K two-component densities."""
    from erasure.streaming import fit_moments

    _, a = _law(o)
    k, s, sig = o.num_classes, o.separation, o.sigma
    e = fit_moments("qleace", population_moments(o))
    basis, maps = e.state["basis"], e.state["maps"]
    mean = population_moments(o).mean
    modes = sig * s * torch.einsum("kij,kj->ki", maps, a @ basis)  # (K, r): ± the two modes of each class
    chol = torch.linalg.cholesky(sig**2 * maps @ maps.mT)  # (K, r, r)
    x, y = draw(o, rows_per_class, 2)
    z = (x.reshape(len(y), -1).double() - mean) @ basis
    zb = torch.einsum("nr,nrq->nq", z - e.state["class_means"][y], maps[y])
    logp = torch.empty(len(y), k, dtype=torch.float64)
    for j in range(k):
        comps = []
        for sign in (1.0, -1.0):
            white = torch.linalg.solve_triangular(chol[j], (zb - sign * modes[j]).T, upper=False)
            comps.append(-0.5 * (white**2).sum(0) - torch.log(torch.diagonal(chol[j])).sum())
        logp[:, j] = torch.logsumexp(torch.stack(comps), 0) - math.log(2)
    post = torch.log_softmax(logp, 1)[torch.arange(len(y)), y]
    return float(-post.mean() / math.log(2))
