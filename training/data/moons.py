"""Two moons arranged as in Pezeshki et al. (Gradient Starvation, Fig. 1), stored as (n, 2, 1, 1) "images" (the
registry's NCHW contract; an MLP flattens them back to 2 features). Values are not in [0, 1].
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from training.common.option_checks import NONNEG, POSITIVE
from training.data.registry import DatasetCfg, LoadedData, register
from training.engine.seeding import derive_seed


@dataclass(frozen=True, kw_only=True)
class TwoMoonsOptions:
    """`dataset=two_moons`'s own keys (conf/dataset/two_moons.yaml)."""

    n: int = field(metadata=POSITIVE)
    n_test: int = field(metadata=POSITIVE)  # an independent test draw
    noise: float = field(metadata=NONNEG)
    margin: float  # > 0: linearly separable along one coordinate with a gap of 2·margin
    rotation: float  # degrees
    data_seed: int = field(metadata={"check": lambda v: v >= 0, "allowed": "an integer ≥ 0"})


def two_moons(opts: TwoMoonsOptions, split: Literal["train", "test"] = "train") -> tuple[Tensor, Tensor]:
    """(x (n, 2) float32, y (n,) int64); the test split is an independent draw of `n_test` points. The paper's
    arrangement: the moons folded so that one coordinate (the horizontal axis after the final 90° rotation) separates
    the classes with a gap of 2·margin (> 0: separable whatever the noise; < 0: overlapping)."""
    from sklearn.datasets import make_moons

    seed = derive_seed(opts.data_seed, "two_moons_test") if split == "test" else opts.data_seed
    n = opts.n_test if split == "test" else opts.n
    x, y = make_moons(n_samples=n, noise=opts.noise, random_state=seed % 2**32)
    s = 2.0 * y - 1.0
    x = x - np.stack([np.full(n, 0.5), 0.3 * s], axis=1)
    x[:, 1] -= x[:, 1].mean()
    x[:, 1] = -s * np.abs(x[:, 1]) - s * opts.margin  # class 1 below −margin, class 0 above +margin
    x = x[:, ::-1].copy()  # rotate by 90°: the separating coordinate becomes the horizontal axis
    if opts.rotation:
        t = np.radians(opts.rotation)
        x = x @ np.array([[np.cos(t), -np.sin(t)], [np.sin(t), np.cos(t)]])
    return torch.from_numpy(x.astype(np.float32)), torch.from_numpy(y.astype(np.int64))


@register("two_moons", options=TwoMoonsOptions)
def load_two_moons(cfg: DatasetCfg, data_dir: Path) -> LoadedData:
    opts: TwoMoonsOptions = cfg.options
    x, y = two_moons(opts, "train")
    info = {"source": "sklearn make_moons (Pezeshki et al. arrangement)", "layout": "(n, 2, 1, 1)",
            "margin": opts.margin, "noise": opts.noise}
    return LoadedData("two_moons", x.reshape(-1, 2, 1, 1), y, 2, info)
