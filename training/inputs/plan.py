"""How a job's eraser is fitted (`eraser.fit_on`, `eraser.fit_source`, `eraser.fit_labels`): which rows are coded,
and what the eraser is fitted on: rows (the coded rows themselves, a held-out part, the pool beyond `dataset.limit`,
labels shuffled), a generator's fresh draws (oracle) or its exact class moments (population). A plan that cannot be
fitted is refused in one line (ConfigError), in the job's precheck. Labels are permuted for the null control before.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import Tensor

import erasure
import erasure.streaming
from erasure.progress import use as erasure_progress
from erasure.split import fit_counts, holdout_split, stratified_sample
from training.app.schema import ConfigError, DatasetConfig, EraserConfig
from training.common.progress import progress_bar
from training.data.generators import oracle_chunks, population_moments
from training.data.registry import LoadedData
from training.engine.seeding import generator
from training.inputs.store import Store

MIN_CLASS_ROWS = 2  # an eraser's fit needs at least 2 rows of every class (erasure/moments.py check_labels)
ORACLE_ROWS_PER_DIM = 200  # eraser.fit_on=oracle: default fit rows per class, per input dimension


@dataclass(frozen=True)
class EraserSpec:
    """What is fitted: the eraser's name, its options, and the rank a rank-matched baseline removes (`rank_hint`)."""

    name: str
    options: Mapping[str, Any]
    rank_hint: int | None = None


def flat(data: LoadedData) -> Tensor:
    return data.x.reshape(len(data.x), -1)


@dataclass(frozen=True)
class Rows:
    """A fit on rows: the coded rows themselves (`in_sample`) or others (a held-out part, the pool, the rows with
    shuffled labels)."""

    data: LoadedData
    in_sample: bool = False

    @property
    def n_fit(self) -> int:
        return len(self.data.y)

    def fitted_on(self) -> dict[str, Any]:
        """What the erased-data cache key adds for this source (nothing in sample: the coded rows are the key)."""
        return {} if self.in_sample else {"fitted_on": self.data.content_hash()}

    def line(self, name: str, coded: LoadedData) -> str:
        if self.in_sample:
            return f"fitting eraser {name} on {coded.name} ({len(coded.y)} x {flat(coded).shape[1]})"
        return (f"fitting eraser {name} on {len(self.data.y)} held-out samples of {self.data.name}, applying it to "
                f"the other {len(coded.y)}")

    def fit(self, spec: EraserSpec) -> erasure.Eraser:
        extra = {"rank_hint": spec.rank_hint} if spec.rank_hint is not None else {}
        with erasure_progress(progress_bar):  # a long fit shows the harness's bar / log lines
            return erasure.fit(spec.name, flat(self.data), self.data.y, **spec.options, **extra)


@dataclass(frozen=True)
class Draws:
    """`eraser.fit_on=oracle`: fresh draws of a generator dataset, streamed in chunks (`chunks()`), `n_fit` rows in
    all of `num_classes` classes; `key` identifies them (the generator's options and the row count)."""

    chunks: Callable[[], Iterable[tuple[Tensor, Tensor]]]
    n_fit: int
    num_classes: int
    key: dict[str, Any]
    in_sample = False

    def fitted_on(self) -> dict[str, Any]:
        return {"fitted_on": {"oracle": self.key}}

    def line(self, name: str, coded: LoadedData) -> str:
        return (f"fitting eraser {name} on {self.n_fit} fresh draws of {coded.name} (oracle), applying it to the "
                f"{len(coded.y)} coded rows")

    def fit(self, spec: EraserSpec) -> erasure.Eraser:
        return erasure.streaming.fit_chunks(spec.name, self.chunks(), self.num_classes, **spec.options)


@dataclass(frozen=True)
class Moments:
    """`eraser.fit_on=population`: a generator dataset's exact class moments (`moments()`, erasure ClassMoments);
    `key` identifies them (the generator's options)."""

    moments: Callable[[], Any]
    key: dict[str, Any]
    in_sample = False
    n_fit = None

    def fitted_on(self) -> dict[str, Any]:
        return {"fitted_on": {"population": self.key}}

    def line(self, name: str, coded: LoadedData) -> str:
        return (f"fitting eraser {name} on the exact class moments of {coded.name} (population), applying it to the "
                f"{len(coded.y)} coded rows")

    def fit(self, spec: EraserSpec) -> erasure.Eraser:
        return erasure.streaming.fit_moments(spec.name, self.moments(), **spec.options)


FitSource = Rows | Draws | Moments


@dataclass(frozen=True)
class FitPlan:
    """How the eraser is fitted (`eraser.fit_on`): all and self on the coded rows (`coded_idx` of the loaded data;
    None: all), holdout on the rows `fit_idx` (a split) or on `pool` (rows beyond dataset.limit), oracle on `draws`,
    population on `moments` (coding the rows self codes). fit_source / fit_fraction / repeat: as configured where the
    mode reads them, else None."""

    fit_on: str
    coded_idx: Tensor | None = None
    fit_idx: Tensor | None = None
    pool: LoadedData | None = None
    draws: Draws | None = None
    moments: Moments | None = None
    fit_source: str | None = None
    fit_fraction: float | None = None
    repeat: int | None = None
    shuffle: tuple[int, int] | None = None  # eraser.fit_labels=shuffled: (seed, repeat) of the fit labels' permutation

    @property
    def in_sample(self) -> bool:
        return self.fit_on in ("self", "all")

    def coded(self, data: LoadedData) -> LoadedData:
        return data if self.coded_idx is None else data.subset(self.coded_idx)

    def labelled(self, fit: LoadedData) -> LoadedData:
        """The fit rows with the labels the eraser is fitted on: their own, or (`shuffle`) a fixed permutation of
        them (the same class counts, no relation to the rows): the coded rows keep their true labels."""
        if self.shuffle is None:
            return fit
        perm = torch.randperm(len(fit.y), generator=generator(*self.shuffle, "fit_labels"))
        return LoadedData(fit.name, fit.x, fit.y[perm].contiguous(), fit.num_classes,
                          {**fit.info, "shuffled_fit_labels": True})

    def fit_rows(self, data: LoadedData) -> LoadedData | None:
        """The rows fitted on, labels as they are: the coded rows (all, self), a part of `data` or the pool
        (holdout); None for oracle and population."""
        if self.in_sample:
            return self.coded(data)
        return data.subset(self.fit_idx) if self.fit_idx is not None else self.pool

    def source(self, data: LoadedData) -> FitSource:
        """What the eraser is fitted on: the draws, the moments, or the fit rows (labelled as the plan says; rows
        with shuffled labels are fitted out of sample)."""
        if self.draws is not None:
            return self.draws
        if self.moments is not None:
            return self.moments
        rows = self.fit_rows(data)
        assert rows is not None
        return Rows(self.labelled(rows), in_sample=self.in_sample and self.shuffle is None)

    def mapped(self, fn: Callable[[Tensor], Tensor]) -> FitPlan:
        """This plan with `fn` applied to the pool's images (the loaded data's z-score applies to the pool too)."""
        if self.pool is None:
            return self
        p = self.pool
        return replace(self, pool=LoadedData(p.name, fn(p.x), p.y, p.num_classes, dict(p.info)))


ALL = FitPlan("all")  # every coded row, with its label


def with_permuted_labels(data: LoadedData, permute: bool, seed: int) -> LoadedData:
    """`dataset.permute_labels`: the labels shuffled once, seeded by the job seed, before anything else sees them."""
    if not permute:
        return data
    perm = torch.randperm(len(data.y), generator=generator(seed, "permute_labels"))
    return LoadedData(data.name, data.x, data.y[perm].contiguous(), data.num_classes,
                      {**data.info, "permuted_labels": True})


def fit_plan(e: EraserConfig, dataset: DatasetConfig, seed: int, data: LoadedData, store: Store) -> FitPlan | None:
    """How the eraser is fitted (`eraser.fit_on`) on `data` (labels already permuted for a null), and which rows are
    coded; None for fit_on=all (with the coded labels). A holdout that cannot be fitted is refused in one line
    (ConfigError). `store`: where the pool is read (`eraser.fit_source=pool`)."""
    shuffle = (seed, e.repeat) if e.fit_labels == "shuffled" else None  # the fit labels' permutation
    if e.fit_on == "all":
        return None if shuffle is None else FitPlan("all", shuffle=shuffle)
    o = dataset.options  # oracle, population: a generator's (training/data/generators.py)
    if e.fit_on == "oracle":  # fresh draws (never the coded rows), n_fit rows per class (null: ORACLE_ROWS_PER_DIM · d)
        per_class = e.n_fit or ORACLE_ROWS_PER_DIM * int(data.x[0].numel())
        key = {"dataset": dataset.name, "options": dataclasses.asdict(o), "rows_per_class": per_class}
        return FitPlan("oracle", draws=Draws(lambda: oracle_chunks(o, per_class), per_class * data.num_classes,
                                             data.num_classes, key))
    if e.fit_source == "pool":
        pool = _pool(e, dataset, seed, data, store)
        return FitPlan(e.fit_on, pool=pool, fit_source="pool", repeat=e.repeat, shuffle=shuffle)

    _check_split(e.fit_fraction, data)
    fit_idx, coded_idx = holdout_split(data.y, e.fit_fraction, seed=seed, repeat=e.repeat)
    moments = None if e.fit_on != "population" else Moments(  # its exact class moments, coding the rows self codes
        lambda: population_moments(o), {"dataset": dataset.name, "options": dataclasses.asdict(o), "population": True})
    return FitPlan(e.fit_on, coded_idx=coded_idx, fit_idx=fit_idx if e.fit_on == "holdout" else None,
                   fit_source="split", fit_fraction=float(e.fit_fraction), repeat=e.repeat, moments=moments,
                   shuffle=shuffle)


def _check_split(fit_fraction: float, data: LoadedData) -> None:
    """Both parts of a split (the fit rows and the coded rows) need MIN_CLASS_ROWS rows of every class."""
    f = float(fit_fraction)
    counts, fit = fit_counts(data.y, f)
    coded = counts - fit
    if int(fit.min()) >= MIN_CLASS_ROWS and int(coded.min()) >= MIN_CLASS_ROWS:
        return
    n_min = int(counts.min())
    side, rows = ("fit", int(fit.min())) if int(fit.min()) < MIN_CLASS_ROWS else ("coded", int(coded.min()))
    lo, hi = math.ceil(1000 * MIN_CLASS_ROWS / n_min) / 1000, math.floor(1000 * (1 - MIN_CLASS_ROWS / n_min)) / 1000
    works = (f"use eraser.fit_fraction between {lo:g} and {hi:g}" if lo <= hi else
             f"no fit_fraction can leave {MIN_CLASS_ROWS} rows of each class on both sides")
    raise ConfigError(f"eraser.fit_fraction={f:g} is not allowed: the smallest class of {data.name} has {n_min} "
                      f"rows and the {side} part gets as few as {rows} rows of a class (every class needs "
                      f"{MIN_CLASS_ROWS} on each side to fit the eraser and code the rest); {works}, or use more "
                      "data (dataset.limit)")


def _pool(e: EraserConfig, dataset: DatasetConfig, seed: int, data: LoadedData, store: Store) -> LoadedData:
    """`eraser.fit_source=pool`: the dataset's rows beyond `dataset.limit` (labels permuted too for a null), all of
    them or `eraser.n_fit` drawn stratified by (seed, repeat)."""
    full = store.load(dataclasses.replace(dataset, limit=None))
    limit = int(dataset.limit or 0)
    if len(full.y) <= limit:
        raise ConfigError(f"eraser.fit_source=pool is not allowed: {data.name} has {len(full.y)} rows and "
                          f"dataset.limit={limit} codes all of them, leaving no pool; lower dataset.limit or use "
                          "eraser.fit_source=split")
    pool = full.subset(torch.arange(limit, len(full.y)))
    if dataset.permute_labels:
        perm = torch.randperm(len(pool.y), generator=generator(seed, "permute_labels", "pool"))
        pool = LoadedData(pool.name, pool.x, pool.y[perm].contiguous(), pool.num_classes, pool.info)
    n_fit = e.n_fit
    if n_fit is not None and n_fit > len(pool.y):
        raise ConfigError(f"eraser.n_fit={n_fit} is not allowed: the pool beyond dataset.limit={limit} has "
                          f"{len(pool.y)} rows; use eraser.n_fit ≤ {len(pool.y)} or null (the whole pool)")
    if n_fit is not None:
        pool = pool.subset(stratified_sample(pool.y, n_fit, seed=seed, repeat=e.repeat))
    counts = torch.bincount(pool.y, minlength=pool.num_classes)
    if int(counts.min()) < MIN_CLASS_ROWS:
        raise ConfigError(f"eraser.n_fit={n_fit} is not allowed: the pool's smallest class gets {int(counts.min())} "
                          f"rows (every class needs {MIN_CLASS_ROWS}); raise eraser.n_fit or lower dataset.limit")
    return pool

