"""Per-sample random crop (zero padding of 1/8 of the side) + horizontal flip, batched on the device.

The draws and the transform are separate: a training loop draws a whole epoch's crops at once and the vectorised
trainer applies them to many models' batches in one gather. As torchvision's RandomCrop(padding=pad) followed by
RandomHorizontalFlip: the h×w window at offset (dy, dx) ∈ [0, 2·pad]² of the padded image, mirrored when flipped.
"""

from __future__ import annotations

import torch
from torch import Tensor

PAD_VALUE = 0  # zero padding, as torchvision's RandomCrop default (uint8 0 decodes to 0.0 too)


def default_pad(height: int) -> int:
    return max(1, height // 8)


def draw_crop_flip(n: int, gen: torch.Generator, pad: int) -> tuple[Tensor, Tensor]:
    """Offsets (n, 2) int64 in [0, 2·pad] and flip bits (n,) bool, drawn from `gen` in this order."""
    offsets = torch.randint(0, 2 * pad + 1, (n, 2), generator=gen)
    flips = torch.rand(n, generator=gen) < 0.5
    return offsets, flips


def apply_crop_flip(x: Tensor, offsets: Tensor, flips: Tensor, pad: int) -> Tensor:
    """Crop and flip each image of x (b, c, h, w) by its own (offsets[i], flips[i]); any dtype, one gather."""
    b, c, h, w = x.shape
    hp, wp = h + 2 * pad, w + 2 * pad
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad), value=PAD_VALUE)
    offsets, flips = offsets.to(x.device), flips.to(x.device)
    rows = offsets[:, 0, None] + torch.arange(h, device=x.device)  # (b, h)
    cols = offsets[:, 1, None] + torch.arange(w, device=x.device)  # (b, w)
    cols = torch.where(flips[:, None], cols.flip(1), cols)
    flat = (rows[:, :, None] * wp + cols[:, None, :]).reshape(b, 1, h * w).expand(b, c, h * w)
    return padded.reshape(b, c, hp * wp).gather(2, flat).reshape(b, c, h, w)


def crop_flip(x: Tensor, gen: torch.Generator, pad: int | None = None) -> Tensor:
    """Each image gets its own crop offset and flip, drawn from `gen` (a CPU generator keeps CPU and GPU runs
    on the same stream)."""
    pad = default_pad(x.shape[-2]) if pad is None else pad
    offsets, flips = draw_crop_flip(len(x), gen, pad)
    return apply_crop_flip(x, offsets, flips, pad)
