"""Two moons arranged as in Pezeshki et al. (Gradient Starvation, Fig. 1), stored as (n, 2, 1, 1) "images" (the
registry's NCHW contract; an MLP flattens them back to 2 features). Values are not in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from training.common.option_checks import NONNEG, POSITIVE
from training.data.registry import DatasetCfg, LoadedData, register
from training.engine.seeding import derive_seed


def two_moons_arrays(n: int, noise: float, margin: float, seed: int, rotation: float = 0.0) -> tuple[np.ndarray,
                                                                                                      np.ndarray]:
    """The paper's arrangement: the moons folded so that one coordinate (the horizontal axis after the final 90°
    rotation) separates the classes with a gap of 2·margin (> 0: separable whatever the noise; < 0: overlapping)."""
    from sklearn.datasets import make_moons

    x, y = make_moons(n_samples=n, noise=noise, random_state=seed % 2**32)
    s = 2.0 * y - 1.0
    x = x - np.stack([np.full(n, 0.5), 0.3 * s], axis=1)
    x[:, 1] -= x[:, 1].mean()
    x[:, 1] = -s * np.abs(x[:, 1]) - s * margin  # class 1 below −margin, class 0 above +margin
    x = x[:, ::-1].copy()  # rotate by 90°: the separating coordinate becomes the horizontal axis
    if rotation:
        t = np.radians(rotation)
        x = x @ np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])
    return x.astype(np.float32), y.astype(np.int64)


@dataclass(frozen=True, kw_only=True)
class TwoMoonsOptions:
    """`dataset=two_moons`'s own keys (conf/dataset/two_moons.yaml)."""

    n: int = field(metadata=POSITIVE)
    n_test: int = field(metadata=POSITIVE)  # an independent test draw
    noise: float = field(metadata=NONNEG)
    margin: float  # > 0: linearly separable along one coordinate with a gap of 2·margin
    rotation: float  # degrees
    data_seed: int = field(metadata={"check": lambda v: v >= 0, "allowed": "an integer ≥ 0"})


def two_moons(opts: TwoMoonsOptions, split: str = "train") -> tuple[Tensor, Tensor]:
    """(x (n, 2) float32, y (n,) int64); the test split is an independent draw of `n_test` points."""
    seed, n = opts.data_seed, opts.n
    if split == "test":
        seed, n = derive_seed(seed, "two_moons_test"), opts.n_test
    elif split != "train":
        raise ValueError(f"two_moons split must be train or test, got {split!r}")
    x, y = two_moons_arrays(n, opts.noise, opts.margin, seed, opts.rotation)
    return torch.from_numpy(x), torch.from_numpy(y)


@register("two_moons", options=TwoMoonsOptions)
def load_two_moons(cfg: DatasetCfg, data_dir: Path) -> LoadedData:
    opts: TwoMoonsOptions = cfg.options
    x, y = two_moons(opts, "train")
    info = {"source": "sklearn make_moons (Pezeshki et al. arrangement)", "layout": "(n, 2, 1, 1)",
            "margin": opts.margin, "noise": opts.noise}
    return LoadedData("two_moons", x.reshape(-1, 2, 1, 1), y, 2, info)
