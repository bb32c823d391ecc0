"""Per-sample crop + flip on the device (training/engine/augment.py): shapes, independence, mirror, padding."""

from __future__ import annotations

import torch

from training.engine.augment import PAD_VALUE, apply_crop_flip, crop_flip, default_pad, draw_crop_flip


def _reference(img: torch.Tensor, dy: int, dx: int, flip: bool, pad: int) -> torch.Tensor:
    """torchvision's RandomCrop(padding=pad, fill=0) then HorizontalFlip, for one image."""
    h, w = img.shape[-2:]
    crop = torch.nn.functional.pad(img, (pad, pad, pad, pad), value=PAD_VALUE)[:, dy: dy + h, dx: dx + w]
    return crop.flip(-1) if flip else crop


def test_shapes_dtype_and_pad_size() -> None:
    g = torch.Generator().manual_seed(0)
    for shape in [(5, 3, 32, 32), (4, 1, 28, 28), (2, 1, 8, 8)]:
        x = torch.rand(shape)
        out = crop_flip(x, g)
        assert out.shape == x.shape and out.dtype == x.dtype
    assert default_pad(32) == 4 and default_pad(28) == 3 and default_pad(8) == 1 and default_pad(4) == 1
    u8 = torch.randint(0, 256, (6, 3, 16, 16), dtype=torch.uint8)
    assert crop_flip(u8, g).dtype == torch.uint8
    # the same generator, the same draws: uint8 commutes with the decode
    x8 = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8)
    a = crop_flip(x8, torch.Generator().manual_seed(5))
    b = crop_flip(x8.float() / 255, torch.Generator().manual_seed(5))
    assert torch.equal(a.float() / 255, b)


def test_matches_reference_per_sample() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.rand(40, 3, 16, 16) + 0.1
    offsets, flips = draw_crop_flip(40, g, 2)
    out = apply_crop_flip(x, offsets, flips, 2)
    for i in range(40):
        ref = _reference(x[i], int(offsets[i, 0]), int(offsets[i, 1]), bool(flips[i]), 2)
        assert torch.equal(out[i], ref)
    assert torch.equal(crop_flip(x, torch.Generator().manual_seed(1)), out)  # crop_flip: this draw, its default pad


def test_per_sample_independence() -> None:
    """Two samples of one batch get different transforms with high probability (1/50 per pair here)."""
    g = torch.Generator().manual_seed(2)
    offsets, flips = draw_crop_flip(256, g, 2)
    keys = {(int(a), int(b), bool(f)) for (a, b), f in zip(offsets, flips, strict=True)}
    assert len(keys) > 40  # 50 possible (5 × 5 offsets × 2 flips); one batch-wide draw would give 1
    x = torch.rand(1, 3, 16, 16).expand(64, -1, -1, -1)  # the same image 64 times
    out = crop_flip(x, g)
    distinct = {out[i].numpy().tobytes() for i in range(64)}
    assert len(distinct) > 20


def test_flip_is_exact_mirror_centre_crop_is_identity_and_padding_is_zero() -> None:
    x = torch.rand(3, 2, 8, 8) + 1.0  # no zeros in the image
    pad = default_pad(8)
    assert pad == 1
    centre = torch.full((3, 2), pad)
    same = apply_crop_flip(x, centre, torch.zeros(3, dtype=torch.bool), pad)
    mirror = apply_crop_flip(x, centre, torch.ones(3, dtype=torch.bool), pad)
    assert torch.equal(same, x)
    assert torch.equal(mirror, x.flip(-1))
    corner = torch.zeros(3, 2, dtype=torch.long)  # shift down-right by pad: top row and left column are padding
    out = apply_crop_flip(x, corner, torch.zeros(3, dtype=torch.bool), pad)
    assert (out[:, :, 0, :] == PAD_VALUE).all() and (out[:, :, :, 0] == PAD_VALUE).all()
    assert (out[:, :, 1:, 1:] > 0).all() and torch.equal(out[:, :, 1:, 1:], x[:, :, :-1, :-1])
