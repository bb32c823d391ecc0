"""Where a job's inputs are kept: one `Store` per job, handed down the data steps instead of the directories and
memos that travel together.

It holds the data directory (`paths.data_dir`), the cache directory (`paths.cache_dir`: erased data, fitted erasers,
certificates; training/data/cache.py) and, for the jobs one process runs one after another (a pack,
`hydra/launcher=packed`), the pack whose memos keep what an earlier job loaded or computed (training/data/shared.py;
None: a lone job, which shares nothing).
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
from training.data.shared import Pack


@dataclass(frozen=True)
class Store:
    """A job's data directory, cache directory and in-process memos (its pack's; None: a lone job)."""

    cache_dir: Path
    data_dir: str = "data"
    pack: Pack | None = None

    @classmethod
    def of(cls, paths: PathsConfig, pack: Pack | None = None) -> Store:
        """The store of a job's `paths` (and its pack)."""
        return cls(Path(paths.cache_dir), paths.data_dir, pack)

    def load(self, dataset: DatasetCfg) -> LoadedData:
        """The dataset `dataset` names, read from the data directory (once per pack)."""
        return load_dataset(dataset, self.data_dir, None if self.pack is None else self.pack.datasets)

    def erased(self, key: Mapping[str, Any], build: Callable[[], tuple[Tensor, dict[str, Any]]]
               ) -> tuple[Tensor, dict[str, Any], bool]:
        """(erased data, report, cache hit): the erased-data cache entry of `key`, or `build()` stored there."""
        return cached_erase(self.cache_dir, key, build, None if self.pack is None else self.pack.erased)

    def eraser(self, key: Mapping[str, Any], build: Callable[[], Eraser]) -> tuple[Eraser, bool]:
        """(fitted eraser, cache hit): the fitted-eraser cache entry of `key`, or `build()` stored there."""
        return cached_eraser(self.cache_dir, key, build, None if self.pack is None else self.pack.erasers)

    def entry(self, key: Mapping[str, Any]) -> Path:
        """The directory of the erased-data cache entry of `key` (where its certificates are kept)."""
        return self.cache_dir / "erased" / key_hash(key)
