"""Paper datasets that need a download or a user-supplied folder: CIFAR-10, SVHN, CIFARNet. Each reads the on-disk
format itself (torchvision only downloads), so a missing or partial copy gives one line saying where the files go.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.data.registry import DatasetCfg, DatasetMissingError, LoadedData, file_records, reading, register


def _root(cfg: DatasetCfg, data_dir: Path) -> Path:
    return Path(cfg.root) if cfg.root else data_dir


def _nhwc_uint8(images: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(images.transpose(0, 3, 1, 2))).float().div_(255.0)


def _try_download(cfg: DatasetCfg, fetch: Callable[[], object]) -> str:
    """Run a torchvision download; return why it did not happen (empty string on success)."""
    if not cfg.download:
        return "download disabled"
    try:
        fetch()
        return ""
    except Exception as e:  # noqa: BLE001 - no network is the common case here
        return f"download failed: {type(e).__name__}: {str(e)[:80]}"


CIFAR10_URL = "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz"
# What a CIFAR-10 batch pickle references: numpy arrays (their rebuild function, class and dtype, under numpy 1's
# and numpy 2's module names) and `_codecs.encode` (bytes in protocol-2 pickles). Anything else is refused.
CIFAR_PICKLE_GLOBALS = frozenset({
    ("numpy.core.multiarray", "_reconstruct"), ("numpy._core.multiarray", "_reconstruct"),
    ("numpy", "ndarray"), ("numpy", "dtype"), ("_codecs", "encode"),
})


class _CifarUnpickler(pickle.Unpickler):
    """Unpickles only what a CIFAR-10 batch holds (dicts, lists, strings, bytes, ints, numpy arrays): a crafted
    file cannot run code (a plain `pickle.load` would call whatever its `__reduce__` names, e.g. os.system)."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in CIFAR_PICKLE_GLOBALS:
            raise pickle.UnpicklingError(f"refused {module}.{name}: a CIFAR-10 batch holds only lists, strings and "
                                         "numpy arrays, so this file is not one (it could run code)")
        return super().find_class(module, name)


@register("cifar10", files=True)
def load_cifar10(cfg: DatasetCfg, data_dir: Path) -> LoadedData:
    root = _root(cfg, data_dir)
    folder = root / "cifar-10-batches-py"
    batches = [folder / f"data_batch_{i}" for i in range(1, 6)]
    reason = ""
    if not all(b.exists() for b in batches):
        from torchvision.datasets import CIFAR10

        reason = _try_download(cfg, lambda: CIFAR10(str(root), train=True, download=True))
    missing = [b.name for b in batches if not b.exists()]
    if missing:
        raise DatasetMissingError(f"CIFAR-10 not found: {folder} lacks {missing} ({reason or 'incomplete'}); "
                                  f"extract {CIFAR10_URL} into {root} (or set paths.data_dir / dataset.root)")
    xs, ys = [], []
    for b in batches:
        with reading(b, "CIFAR-10 batch"), open(b, "rb") as f:
            entry = _CifarUnpickler(f, encoding="latin1").load()  # latin1: its Python 2 strings
            if not isinstance(entry, dict):
                raise ValueError(f"expected a dict with data and labels, got {type(entry).__name__}")
            xs.append(np.asarray(entry["data"], dtype=np.uint8).reshape(-1, 3, 32, 32))
            ys.append(np.asarray(entry["labels"], dtype=np.int64))
    x = torch.from_numpy(np.concatenate(xs)).float().div_(255.0)
    return LoadedData("cifar10", x, torch.from_numpy(np.concatenate(ys)), 10,
                      {"source": str(folder), "files": file_records(batches, folder)})


SVHN_URL = "http://ufldl.stanford.edu/housenumbers/train_32x32.mat"


@register("svhn", files=True)
def load_svhn(cfg: DatasetCfg, data_dir: Path) -> LoadedData:
    from scipy.io import loadmat

    folder = _root(cfg, data_dir) / "svhn"
    path = folder / "train_32x32.mat"
    reason = ""
    if not path.exists():
        from torchvision.datasets import SVHN

        reason = _try_download(cfg, lambda: SVHN(str(folder), split="train", download=True))
    if not path.exists():
        raise DatasetMissingError(f"SVHN not found: {path} is missing ({reason}); download {SVHN_URL} there")
    with reading(path, "SVHN"):
        mat = loadmat(str(path))
        x = mat["X"]  # (32, 32, 3, N) uint8
        y = mat["y"].astype(np.int64).reshape(-1) % 10  # the file labels digit 0 as 10
        x = np.transpose(x, (3, 0, 1, 2))
    return LoadedData("svhn", _nhwc_uint8(x), torch.from_numpy(y), 10,
                      {"source": str(path), "files": file_records([path], folder)})


@register("cifarnet", files=True)
def load_cifarnet(cfg: DatasetCfg, data_dir: Path) -> LoadedData:
    folder = _root(cfg, data_dir) / "cifarnet"
    npz = folder / "train.npz"
    shards: list[Path] = []
    if npz.exists():
        with reading(npz, "CIFARNet (expects arrays `images` uint8 NHWC 64x64x3 and `labels`)"), np.load(npz) as f:
            images, labels = f["images"], f["labels"]
    else:
        shards = sorted(folder.glob("**/train-*.parquet"))
        if not shards:
            raise DatasetMissingError(f"CIFARNet not found: put {npz} (arrays images uint8 NHWC 64x64x3, labels) or "
                                      f"the HF EleutherAI/cifarnet parquet shards (train-*.parquet) under {folder}")
        images, labels = _read_parquet_images(shards)
    with reading(npz if npz.exists() else folder, "CIFARNet (images must be uint8 NHWC, one integer label each)"):
        x, y = _nhwc_uint8(images), torch.from_numpy(np.asarray(labels).astype(np.int64).reshape(-1))
    return LoadedData("cifarnet", x, y, 10,
                      {"source": str(folder), "files": file_records(shards or [npz], folder)})


def _read_parquet_images(shards: list[Path]) -> tuple[np.ndarray, np.ndarray]:
    import io

    import pandas as pd
    from PIL import Image

    frames = []
    for shard in shards:
        with reading(shard, "CIFARNet parquet shard (columns img/image with PNG bytes, label)"):
            df = pd.read_parquet(shard)
            img_col = "img" if "img" in df.columns else "image"
            images = np.stack([np.asarray(Image.open(io.BytesIO(v["bytes"])).convert("RGB")) for v in df[img_col]])
            frames.append((images, df["label"].to_numpy()))
    return np.concatenate([f[0] for f in frames]), np.concatenate([f[1] for f in frames])
