"""Typed rows of the aggregate's frames, each read once from its pandas row: a summary cell
(aggregate_summary.summarize), a collected job (aggregate_collect) and a run's probe scores. The
columns a frame may lack (results written before the key existed; a frame without unfinished jobs has no `error`)
are declared here with their defaults, once; a present column is taken as it is (NaN included).
"""


from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import pandas as pd

MISSING_KEY = "?"  # a config key the result did not record (written before the key existed)

R = TypeVar("R", bound="_Row")


class _Row:
    @classmethod
    def of(cls: type[R], row: pd.Series | Mapping[str, Any], prefix: str = "") -> R:
        """An instance of a row dataclass from a frame row (or a parsed JSON object): column (key) `prefix + field`,
        or the field's default where the row lacks it."""
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        return cls(**{f.name: row[prefix + f.name] if prefix + f.name in row else f.default for f in fields})


class Recorded(dict[str, Any]):
    """A flat config (dotted keys) as a result recorded it: a key it did not record reads MISSING_KEY."""

    def __missing__(self, key: str) -> str:
        return MISSING_KEY


@dataclass(frozen=True)
class CellRow(_Row):
    """What the tables read of a summary cell beyond its label and metric columns (aggregate_render)."""

    mixed_data: Any = False
    mixed_commits: Any = False
    mixed_numerics: Any = False
    folds: Any = ""
    null_mismatch: Any = ""
    n_fit_mean: float = math.nan
    n_coded_mean: float = math.nan
    working_rank_mean: float = math.nan
    d_mean: float = math.nan
    variance_dropped_fraction_mean: float = math.nan
    at_cap_share: float = math.nan
    blocks_known: float = 0
    stops: Any = None
    budget_bound: Any = ""  # why the cell's number depends on the budget (analysis/tables.budget_reason)
    fit_rows_per_class_dim_mean: float = math.nan
    rank_irregular_mean: float = math.nan  # the share of runs whose fit is rank-irregular (erasure/rank_test.py)


@dataclass(frozen=True)
class JobRow(_Row):
    """A collected job as the table of jobs without a result shows it."""

    status: str
    seed: Any
    job_dir: str
    null: Any = None  # True: a permuted-label run
    error: Any = ""
    group: Any = None  # None: no result tells its group


@dataclass(frozen=True)
class ProbeRow(_Row):
    """One probe's out-of-sample scores in a run's row (prefix `<probe>_probe_`; absent in older certificates)."""

    below_chance: Any = None
    verdict: Any = None
    acc_z: Any = None
    loss_z: Any = None

    @property
    def zs(self) -> tuple[Any, Any]:
        return self.acc_z, self.loss_z
