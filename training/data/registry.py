"""Dataset registry: `load_dataset(cfg, data_dir)` returns a `LoadedData` for any `dataset=` choice."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

import training.data.shared as shared
from erasure.registry import Registry
from training.data.shared import fresh
from training.errors import ConfigError, DataCorruptError, UserError


class DatasetMissingError(UserError, FileNotFoundError):
    """The dataset's files are absent and cannot be downloaded; the message says where to put them."""


@contextmanager
def reading(path: Path | str, what: str) -> Iterator[None]:
    """Any failure to parse `path` inside the block becomes one DataCorruptError line naming the file."""
    try:
        yield
    except UserError:
        raise
    except Exception as err:  # noqa: BLE001 - pickle, zip, HDF5, gzip ... each fail in their own way
        detail = (str(err).strip().splitlines() or [""])[0][:120]
        raise DataCorruptError(f"{what}: cannot read {path} ({type(err).__name__}: {detail}); the file is corrupt "
                               "or not in the expected format: replace it (download it again)") from err


@dataclass
class LoadedData:
    name: str
    x: Tensor  # (n, C, H, W) float32 in [0, 1] (synthetic data may leave that range)
    y: Tensor  # (n,) int64 in 0..K-1
    num_classes: int
    info: dict[str, Any] = field(default_factory=dict)
    # content_hash's memo: (the tensors' identity and version counters, their hash)
    _content_memo: tuple[tuple[int, int, int, int], str] | None = field(default=None, init=False, repr=False,
                                                                      compare=False)

    @property
    def input_shape(self) -> tuple[int, int, int]:
        c, h, w = self.x.shape[1:]
        return int(c), int(h), int(w)

    def subset(self, idx: Tensor) -> LoadedData:
        """The samples `idx` (a new LoadedData sharing nothing mutable with this one)."""
        return LoadedData(self.name, self.x[idx].contiguous(), self.y[idx].contiguous(), self.num_classes,
                          dict(self.info))

    def content_hash(self) -> str:
        """Hash of the tensors' bytes: the dataset's identity in cache keys (and `info["fingerprint"]`).
        Remembered for the same tensors while they are not modified in place (their version counters)."""
        stamp = (id(self.x), self.x._version, id(self.y), self.y._version)
        memo = self._content_memo
        if memo is not None and memo[0] == stamp:
            return memo[1]
        h = hashlib.sha256()
        h.update(self.x.contiguous().numpy().tobytes())
        h.update(self.y.contiguous().numpy().tobytes())
        digest = h.hexdigest()[:16]
        self._content_memo = (stamp, digest)
        return digest


def file_records(paths: Iterable[Path], base: Path | None = None) -> list[dict[str, Any]]:
    """What a loader read from disk, for `info["files"]`: each file's name (relative to `base` where it lies
    under it), size and sha256. Data files swapped under the same names then show in the result's fingerprint."""
    out = []
    for path in paths:
        try:
            name = str(path.relative_to(base)) if base is not None else path.name
        except ValueError:
            name = str(path)
        h = hashlib.sha256()
        with reading(path, "data file"), open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 22), b""):
                h.update(block)
        out.append({"name": name, "size": path.stat().st_size, "sha256": h.hexdigest()})
    return out


class DatasetCfg(Protocol):
    """The typed `dataset` config group (training/app/schema.py DatasetConfig) as loaders read it."""

    @property
    def name(self) -> str: ...
    @property
    def root(self) -> str | None: ...
    @property
    def download(self) -> bool: ...
    @property
    def limit(self) -> int | None: ...
    @property
    def options(self) -> Any: ...  # the dataset's own options dataclass (`options=` in its registry entry), or None


Loader = Callable[[DatasetCfg, Path], LoadedData]


@dataclass(frozen=True)
class DatasetTraits:
    """What a dataset declares where it registers (`@register("gaussian", options=GaussianOptions, generator=True)`)."""

    options: type[Any] | None = None  # the dataclass of its own keys (`dataset.n`, ...); None: it has none
    generator: bool = False  # it draws fresh samples (what eraser.fit_on=oracle fits on)
    files: bool = False  # it reads its images from files (data_dir or dataset.root); without them it does not load


# Loaders register themselves (`@register("name", options=TheirOptions)`) in their module; training/data/__init__.py
# lists the modules.
DATASETS: Registry[Loader] = Registry("dataset", declares=DatasetTraits)
register = DATASETS.register


def dataset_traits(name: str) -> DatasetTraits:
    """What dataset `name` declared at registration (UnknownNameError, listing the names, for one not registered)."""
    return DATASETS.declared(name)


def load_dataset(cfg: DatasetCfg, data_dir: str | Path = "data", memo: shared.Memo | None = None) -> LoadedData:
    """The dataset `cfg` names, read from `data_dir`: once per `memo` (a cell's store's, training/data/shared.py),
    else every time."""
    key = (repr(cfg), str(Path(data_dir).resolve()))
    return shared.remembered(memo, key, lambda: _load_dataset(cfg, data_dir),
                             lambda d: [d.x, d.y], _own_copy)


def _own_copy(data: LoadedData) -> LoadedData:
    """A LoadedData of its own (its `info` copied) holding the shared tensors (and their remembered hash)."""
    out = LoadedData(data.name, data.x, data.y, data.num_classes, fresh(data.info))
    out._content_memo = data._content_memo
    return out


def _load_dataset(cfg: DatasetCfg, data_dir: str | Path) -> LoadedData:
    data = DATASETS.get(cfg.name)(cfg, Path(data_dir))
    _validate(data, _check_lengths)  # before the shuffle: it indexes the images by the labels' positions
    perm = torch.randperm(len(data.y), generator=torch.Generator().manual_seed(0))  # fixed: some sources are sorted
    data.x, data.y = data.x[perm].contiguous(), data.y[perm].contiguous()
    if cfg.limit is not None:
        _check_limit(data, cfg.limit)
        data.x, data.y = data.x[: cfg.limit].contiguous(), data.y[: cfg.limit].contiguous()
    _validate(data)
    data.info.update(n=len(data.y), input_shape=list(data.input_shape), num_classes=data.num_classes)
    # the identity of the data loaded (result.json's dataset.fingerprint): the arrays' hash, which the erased-data
    # cache key also holds, and the files read (name, size, sha256), for the loaders that read files
    data.info["fingerprint"] = {"content": data.content_hash(), "files": data.info.pop("files", [])}
    return data


def _validate(data: LoadedData, check: Callable[[LoadedData], None] | None = None) -> None:
    try:
        (check or _check)(data)
    except ValueError as err:
        raise DataCorruptError(f"{err} (read from {data.info.get('source', '?')}): replace the files") from err


def _check_lengths(data: LoadedData) -> None:
    n_x = len(data.x) if data.x.ndim else 0
    n_y = len(data.y) if data.y.ndim else 0
    if n_x != n_y or data.y.ndim != 1:
        raise ValueError(f"{data.name}: {n_x} images but {n_y} labels{'' if data.y.ndim == 1 else ' (not one list)'}; "
                         "there must be one label per image")


def _check_limit(data: LoadedData, limit: int) -> None:
    """`dataset.limit` keeps the first rows (in the fixed shuffled order): they must hold every label the set has
    (one the whole set lacks is the files' fault: `_check` says so)."""
    firsts = {label: i for i, label in reversed(list(enumerate(data.y.tolist())))}  # each label's first row
    if late := sorted(label for label, i in firsts.items() if i >= limit):
        raise ConfigError(f"dataset.limit={limit} is not allowed: the first {limit} rows of {data.name} hold no image "
                          f"of label {', '.join(map(str, late[:5]))}{', ...' if len(late) > 5 else ''} (every class "
                          f"is coded); set dataset.limit ≥ {max(firsts[c] for c in late) + 1}, or null for all "
                          f"{len(data.y)}")


def _check(data: LoadedData) -> None:
    if data.x.dtype != torch.float32 or data.x.ndim != 4:
        raise ValueError(f"{data.name}: expected float32 NCHW images, got {data.x.dtype} {tuple(data.x.shape)}")
    if not torch.isfinite(data.x).all():
        raise ValueError(f"{data.name}: images contain NaN or Inf")
    if data.y.dtype != torch.int64 or len(data.y) != len(data.x):
        raise ValueError(f"{data.name}: labels must be int64 with one per image")
    outside = data.y[(data.y < 0) | (data.y >= data.num_classes)]
    if len(outside):
        odd = sorted({int(v) for v in outside.unique()[:5]})
        raise ValueError(f"{data.name}: {len(outside)} labels lie outside 0..{data.num_classes - 1} (label "
                         f"{', '.join(map(str, odd))}{', ...' if outside.unique().numel() > 5 else ''}): the label "
                         "file is not this dataset's, or its num_classes is wrong")
    counts = torch.bincount(data.y, minlength=data.num_classes)
    if (counts == 0).any():
        missing = [i for i, c in enumerate(counts.tolist()) if c == 0]
        raise ValueError(f"{data.name}: labels must cover 0..{data.num_classes - 1}, but no image has label "
                         f"{', '.join(map(str, missing[:5]))}{', ...' if len(missing) > 5 else ''}")
