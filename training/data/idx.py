"""The IDX format of MNIST and Fashion-MNIST (optionally gzipped): one reader, one file finder."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import numpy as np

from training.data.registry import reading

log = logging.getLogger(__name__)

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
    """(training images, training labels) IDX files in `folder` or its usual subfolders: both plain or both gzipped
    first; a gzipped file next to a plain one is used too, with one warning (they may come from different downloads)."""
    for sub in _SUBDIRS:
        for images, labels in _STEMS:
            pairs = [(s, s) for s in ("", ".gz")] + [("", ".gz"), (".gz", "")]
            for k, (sx, sy) in enumerate(pairs):
                xi, yi = folder / sub / f"{images}{sx}", folder / sub / f"{labels}{sy}"
                if xi.exists() and yi.exists():
                    if k >= 2 and (xi, yi) not in _WARNED:
                        _WARNED.add((xi, yi))
                        log.warning("IDX files mix a gzipped and a plain file: %s with %s (check they come from the "
                                    "same download; gzip or unpack both to silence this)", xi, yi)
                    return xi, yi
    return None


_WARNED: set[tuple[Path, Path]] = set()  # mixed pairs already warned about (once per process)
