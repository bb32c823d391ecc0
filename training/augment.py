"""Per-sample random crop (zero padding of 1/8 of the side) + horizontal flip, batched on the device."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def crop_flip(x: Tensor, gen: torch.Generator, pad: int | None = None) -> Tensor:
    """Each image gets its own crop offset and flip. Padding value is 0 (as torchvision's RandomCrop).

    Random draws come from `gen` (a CPU generator keeps CPU and GPU runs on the same stream).
    """
    b, _, h, w = x.shape
    pad = max(1, h // 8) if pad is None else pad
    offsets = torch.randint(0, 2 * pad + 1, (b, 2), generator=gen).to(x.device)
    flips = (torch.rand(b, generator=gen) < 0.5).to(x.device)
    padded = F.pad(x, (pad, pad, pad, pad))
    rows = offsets[:, 0, None] + torch.arange(h, device=x.device)  # (b, h)
    cols = offsets[:, 1, None] + torch.arange(w, device=x.device)  # (b, w)
    cols = torch.where(flips[:, None], cols.flip(1), cols)
    batch = torch.arange(b, device=x.device)[:, None, None]
    out = padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]]  # (b, h, w, c)
    return out.permute(0, 3, 1, 2).contiguous()
