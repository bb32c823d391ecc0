"""The training data as one tensor on the device, batches as index gathers, epochs drawn in one go.

`DeviceData` stores images in the smallest dtype that decodes back to the float32 data *exactly* (uint8 for k/255
pixels, float16 for e.g. k/16, else float32) and decodes one batch at a time. `draw_epoch` draws one epoch's batch
order and augmentation from a model's generator: the fit loop and the vectorised trainer see identical batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from training.engine.augment import apply_crop_flip, default_pad, draw_crop_flip
from training.errors import UserError

STORAGES = ("auto", "float32", "float16", "uint8")


class StorageError(UserError, ValueError):
    """`training.storage` asks for a dtype that cannot hold the data exactly (one line)."""


def _decode(raw: Tensor) -> Tensor:
    if raw.dtype == torch.uint8:
        return raw.to(torch.float32).div_(255.0)
    return raw.to(torch.float32) if raw.dtype == torch.float16 else raw  # float32 (float64 in tests) as is


def _encode_chunk(x: Tensor, kind: str) -> Tensor | None:
    if kind == "uint8":
        if not bool(((x >= 0) & (x <= 1)).all()):
            return None
        raw = (x * 255.0).round_().to(torch.uint8)
    elif kind == "float16":
        raw = x.to(torch.float16)
    else:
        raise ValueError(f"training.storage must be one of {STORAGES}, got {kind!r}")
    return raw if torch.equal(_decode(raw), x) else None


def _encode(x: Tensor, kind: str, chunk: int = 4096) -> Tensor | None:
    """x in `kind`, or None when that is not lossless (checked chunk by chunk: small temporaries)."""
    if kind == "float32":
        return x
    out = torch.empty(x.shape, dtype=torch.uint8 if kind == "uint8" else torch.float16)
    for i in range(0, len(x), chunk):
        raw = _encode_chunk(x[i: i + chunk], kind)
        if raw is None:
            return None
        out[i: i + chunk] = raw
    return out


def compact(x: Tensor, storage: str = "auto") -> Tensor:
    """The smallest exact storage of float32 `x` ("auto"), or exactly `storage` (refused when lossy); float64 data
    (tests that check arithmetic exactly) is kept as it is."""
    if x.dtype == torch.float64 and storage in ("auto", "float32"):
        return x
    if x.dtype != torch.float32:
        raise ValueError(f"expected float32 data, got {x.dtype}")
    if storage != "auto":
        raw = _encode(x, storage)
        if raw is None:
            raise StorageError(f"training.storage={storage!r} is not allowed: training.storage must be auto or float32 "
                               f"for this data (not exactly representable as {storage}, so storing it so would "
                               "change the numbers; auto keeps the smallest exact storage)")
        return raw
    probe = x[: min(len(x), 256)]
    for kind in ("uint8", "float16"):
        if _encode(probe, kind) is not None and (raw := _encode(x, kind)) is not None:
            return raw
    return x


class DeviceData:
    """Images (n, c, h, w) on `device` in compact storage; `batch(idx, ...)` returns float32."""

    def __init__(self, x: Tensor, device: torch.device | str = "cpu", storage: str = "auto") -> None:
        self.raw = compact(x.detach().cpu() if x.device.type != "cpu" else x, storage).to(device)
        self.device = self.raw.device
        self.shape = tuple(int(s) for s in x.shape[1:])

    @property
    def storage(self) -> str:
        return str(self.raw.dtype).removeprefix("torch.")

    def __len__(self) -> int:
        return len(self.raw)

    def batch(self, idx: Tensor, offsets: Tensor | None = None, flips: Tensor | None = None,
              pad: int = 0) -> Tensor:
        """float32 images at `idx` (any shape S → S + (c, h, w)), cropped/flipped per sample when given."""
        xb = self.raw.index_select(0, idx.reshape(-1))  # 20-50× faster than x[idx] on CPU
        if offsets is not None and flips is not None:
            xb = apply_crop_flip(xb, offsets.reshape(-1, 2), flips.reshape(-1), pad)
        return _decode(xb).reshape(*idx.shape, *self.shape)

    def all(self, idx: Tensor | None = None) -> Tensor:
        return _decode(self.raw if idx is None else self.raw.index_select(0, idx.to(self.device)))


@dataclass(frozen=True)
class Epoch:
    """One epoch of one model: positions into its training set in batch order, and per-sample augmentation."""

    perm: Tensor  # (n,) int64
    offsets: Tensor | None  # (n, 2) int64, or None without augmentation
    flips: Tensor | None  # (n,) bool


def draw_epoch(n: int, gen: torch.Generator, augment: bool, pad: int) -> Epoch:
    """Draw order: randperm(n), then (when augmenting) crop offsets and flip bits for the n positions."""
    perm = torch.randperm(n, generator=gen)
    if not augment:
        return Epoch(perm, None, None)
    offsets, flips = draw_crop_flip(n, gen, pad)
    return Epoch(perm, offsets, flips)


def augment_pad(data: DeviceData, augment: bool) -> int:
    return default_pad(data.shape[1]) if augment else 0


@dataclass(frozen=True)
class ClassSegments:
    """A batch's rows grouped by class without reading the labels back (for a label-dependent batch transform):
    `order` (on the device) lists the rows class by class (stably), `counts[c]` (host integers) how many class c has."""

    order: Tensor
    counts: tuple[int, ...]


def class_segments(y: Tensor, labels: np.ndarray) -> ClassSegments:
    """The segments of a batch with labels `y` on the device, whose copy `labels` the host holds: the order is a stable
    sort on the device (no upload), the counts are counted on the host (no read back)."""
    order = torch.sort(y.reshape(-1), stable=True).indices
    return ClassSegments(order, tuple(int(c) for c in np.bincount(labels.reshape(-1))))


def host_copy(t: Tensor) -> np.ndarray:
    """A host (numpy) copy of `t`, read once outside the training steps (labels, training indices)."""
    return t.detach().cpu().numpy().copy()
