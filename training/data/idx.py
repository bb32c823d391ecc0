"""The IDX format of MNIST and Fashion-MNIST (optionally gzipped): one reader, one file finder."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np

from training.data.registry import reading

# Names the files go by: the original distribution, torchvision's download layout, and a common misspelling.
_STEMS = (("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
          ("train-images.idx3-ubyte", "train-labels.idx1-ubyte"))
_SUBDIRS = ("", "raw", "FashionMNIST/raw", "MNIST/raw")


def read_idx(path: Path) -> np.ndarray:
    """An unsigned-byte IDX file as an array of its stated shape; a malformed file names itself in the error."""
    opener = gzip.open if path.suffix == ".gz" else open
    with reading(path, "IDX file"):
        with opener(path, "rb") as f:
            raw = f.read()
        if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
            raise ValueError("not an unsigned-byte IDX file")
        ndim = raw[3]
        dims = [int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim)]
        data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
        if data.size != int(np.prod(dims)):
            raise ValueError(f"truncated ({data.size} of {int(np.prod(dims))} values)")
        return data.reshape(dims)


def find_idx_pair(folder: Path) -> tuple[Path, Path] | None:
    """(training images, training labels) IDX files in `folder` or its usual subfolders, gzipped or not."""
    for sub in _SUBDIRS:
        for images, labels in _STEMS:
            for suffix in ("", ".gz"):
                xi, yi = folder / sub / f"{images}{suffix}", folder / sub / f"{labels}{suffix}"
                if xi.exists() and yi.exists():
                    return xi, yi
    return None
