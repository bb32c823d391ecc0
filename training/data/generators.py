"""Generator datasets with a known answer: class-conditional Gaussians and two-component mixtures.

Each class's law is fixed by `data_seed`; the rows are draws from it. The coded rows (`draw(o, rows, 0)`) and any
other draws (`eraser.fit_on=oracle`, `oracle_chunks`) come from separate seeds, so an eraser can be fitted on the
population as closely as one likes without touching the coded data.
- `gaussian`: class k ~ N(mean_gap·u_k, σ²(I + cov_gap·(d/4)·a_k a_kᵀ)), u_k and a_k random unit vectors.
  Population QLEACE (and population LEACE when cov_gap = 0) leaves x independent of y: the true code length of the
  labels is H(Y) = log2 K.
- `mixture`: class k ~ ½ N(mean_gap·u_k + s·a_k, σ²I) + ½ N(mean_gap·u_k − s·a_k, σ²I), s = `separation`·σ: mean
  mean_gap·u_k and covariance σ²I + s² a_k a_kᵀ, bimodal along its own direction. QLEACE matches the first two
  moments only, so the bimodality (the label) survives it: the true code is below H(Y).
Rows per class = round(rows_per_dim · dim) (`dataset.rows_per_dim`); images of shape (1, 1, dim).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from erasure.moments import ClassMoments
from erasure.streaming import fit_moments
from training.common.option_checks import NONNEG, POSITIVE, POSITIVE_NUMBER
from training.data.registry import DatasetCfg, LoadedData, register
from training.errors import ConfigError

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


def load_generated(cfg: DatasetCfg, data_dir: Path) -> LoadedData:
    """The coded rows of `dataset=gaussian` or `mixture` (`cfg.name`)."""
    o: GaussianOptions = cfg.options
    x, y = draw(o, o.rows_per_class)
    return LoadedData(cfg.name, x, y, o.num_classes, {"source": f"generator {cfg.name} (data_seed {o.data_seed})",
                                                      "rows_per_class": o.rows_per_class,
                                                      "label_entropy_bits": math.log2(o.num_classes)})  # H(Y)


register("gaussian", options=GaussianOptions, generator=True)(load_generated)
register("mixture", options=MixtureOptions, generator=True)(load_generated)


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


def _components(o: GaussianOptions) -> list[list[tuple[Tensor, Tensor]]]:
    """Per class its Gaussian components (mean, covariance), equally weighted: one (gaussian), two (mixture)."""
    means, covs = class_laws(o)
    if not isinstance(o, MixtureOptions):
        return [[(means[k], covs[k])] for k in range(o.num_classes)]
    _, a = _law(o)
    eye = o.sigma**2 * torch.eye(o.dim, dtype=torch.float64)
    return [[(means[k] + sign * o.sigma * o.separation * a[k], eye) for sign in (1.0, -1.0)]
            for k in range(o.num_classes)]


def _class_maps(eraser: Any, d: int, k: int) -> tuple[Tensor, Tensor]:
    """The affine map x ↦ A_j x + b_j a fitted eraser applies to rows of label j, probed on 0 and the unit
    vectors: (K, d, d), (K, d)."""
    probe = torch.cat([torch.zeros(1, d), torch.eye(d)]).double()
    maps, shifts = [], []
    for j in range(k):
        out = (eraser(probe, torch.full((d + 1,), j)) if eraser.needs_labels else eraser(probe)).double()
        maps.append((out[1:] - out[0]).T)
        shifts.append(out[0])
    return torch.stack(maps), torch.stack(shifts)


def population_truth_bits(o: GaussianOptions, eraser: str, options: dict[str, Any] | None = None,
                          rows_per_class: int = 50_000) -> tuple[float, float]:
    """H(Y | X') in bits after the POPULATION eraser `eraser` (fitted on `population_moments`, float64), and its
    Monte Carlo standard error (over `rows_per_class` fresh draws per class): the code length a learner approaches
    with unlimited data. The eraser is affine per class (x ↦ A_j x + b_j: LEACE, QLEACE, ALF-QLEACE on full-rank
    moments), so class j's erased law is its components pushed through (A_j m + b_j, A_j C A_jᵀ); p(y | x') follows
    from those densities on the span of the erased laws."""
    k, d = o.num_classes, o.dim
    fitted = fit_moments(eraser, population_moments(o), input_dtype="float64", **(options or {}))
    maps, shifts = _class_maps(fitted, d, k)
    laws = [[(maps[j] @ m + shifts[j], maps[j] @ c @ maps[j].T) for m, c in comps]
            for j, comps in enumerate(_components(o))]
    centre = torch.stack([m for comps in laws for m, _ in comps]).mean(0)
    spread = sum(c + torch.outer(m - centre, m - centre) for comps in laws for m, c in comps)
    vals, vecs = torch.linalg.eigh(spread)
    basis = vecs[:, vals > 1e-9 * vals.max()]  # the span of the erased laws
    x, y = draw(o, rows_per_class, 2)
    flat = x.reshape(len(y), -1).double()
    z = (torch.einsum("nij,nj->ni", maps[y], flat) + shifts[y] - centre) @ basis
    logp = torch.empty(len(y), k, dtype=torch.float64)
    for j, comps in enumerate(laws):
        parts = []
        for m, c in comps:
            chol = torch.linalg.cholesky(basis.T @ c @ basis)
            white = torch.linalg.solve_triangular(chol, (z - (m - centre) @ basis).T, upper=False)
            parts.append(-0.5 * (white**2).sum(0) - torch.log(torch.diagonal(chol)).sum())
        logp[:, j] = torch.logsumexp(torch.stack(parts), 0) - math.log(len(comps))
    bits = -torch.log_softmax(logp, 1)[torch.arange(len(y)), y] / math.log(2)
    return float(bits.mean()), float(bits.std() / math.sqrt(len(bits)))


def check_generated_size(name: str, o: Any) -> None:
    """A generator dataset draws its rows in float64 at once (here): one that would not fit in
    this machine's memory is refused before it is drawn (it would fail after minutes, in a traceback)."""
    rows_per_class, dim, classes = (getattr(o, k, None) for k in ("rows_per_class", "dim", "num_classes"))
    if not (isinstance(rows_per_class, int) and isinstance(dim, int) and isinstance(classes, int)):
        return
    need = 2 * rows_per_class * classes * dim * 8  # the float64 draws and what they become
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return
    if need > have:
        raise ConfigError(f"dataset.dim={dim} is not allowed here: dataset={name} would draw "
                          f"{rows_per_class * classes} rows of {dim} numbers ({need / 2**30:.0f} GiB), more than this "
                          f"machine's {have / 2**30:.0f} GiB of memory; lower dataset.dim or dataset.rows_per_dim")
