"""Where a job's inputs are kept: one `Store` (the data directory, the cache directory of training/data/cache.py and,
for the seeds of a cell, the in-process memos of training/data/shared.py), handed down the data steps. A cell's seeds
share one (`Store.of(paths, memos=True)`, made by the command line): the dataset is loaded once, an eraser fitted
once per fit key, the erased data read once. A job with a store of its own (`Store.of(paths)`) shares nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from torch import Tensor

from erasure import Eraser
from training.app.sections import PathsConfig
from training.data.cache import cached_erase, cached_eraser, key_hash
from training.data.registry import DatasetCfg, LoadedData, load_dataset
from training.data.shared import Memo


@dataclass(frozen=True)
class Store:
    """A job's (a cell's) data directory, cache directory and in-process memos (None: none kept)."""

    cache_dir: Path
    data_dir: str = "data"
    datasets: Memo | None = None
    erased_data: Memo | None = None
    erasers: Memo | None = None

    @classmethod
    def of(cls, paths: PathsConfig, memos: bool = False) -> Store:
        """The store of `paths`; `memos`: keeping what one job loads or computes for the next (a cell's seeds)."""
        if not memos:
            return cls(Path(paths.cache_dir), paths.data_dir)
        return cls(Path(paths.cache_dir), paths.data_dir, Memo("dataset"), Memo("erased data"), Memo("fitted eraser"))

    def clear(self) -> None:
        """Empty the memos (the cell is done)."""
        for memo in (self.datasets, self.erased_data, self.erasers):
            if memo is not None:
                memo.clear()

    def load(self, dataset: DatasetCfg) -> LoadedData:
        """The dataset `dataset` names, read from the data directory (once per store)."""
        return load_dataset(dataset, self.data_dir, self.datasets)

    def erased(self, key: Mapping[str, Any], build: Callable[[], tuple[Tensor, dict[str, Any]]]
               ) -> tuple[Tensor, dict[str, Any], bool]:
        """(erased data, report, cache hit): the erased-data cache entry of `key`, or `build()` stored there."""
        return cached_erase(self.cache_dir, key, build, self.erased_data)

    def eraser(self, key: Mapping[str, Any], build: Callable[[], Eraser]) -> tuple[Eraser, bool]:
        """(fitted eraser, cache hit): the fitted-eraser cache entry of `key`, or `build()` stored there."""
        return cached_eraser(self.cache_dir, key, build, self.erasers)

    def entry(self, key: Mapping[str, Any]) -> Path:
        """The directory of the erased-data cache entry of `key` (where its certificates are kept)."""
        return self.cache_dir / "erased" / key_hash(key)
