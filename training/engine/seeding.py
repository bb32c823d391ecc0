"""One `seed` drives everything through explicit generators derived from (seed, purpose)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from contextlib import contextmanager

import torch


def derive_seed(seed: int, *purpose: object) -> int:
    """A 63-bit seed for one purpose ("split", ("block", 3), ...): independent streams, stable across runs."""
    digest = hashlib.sha256(repr((int(seed), *purpose)).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def generator(seed: int, *purpose: object, device: str | torch.device = "cpu") -> torch.Generator:
    return torch.Generator(device=device).manual_seed(derive_seed(seed, *purpose))


@contextmanager
def seeded_global_rng(seed: int, *purpose: object) -> Iterator[None]:
    """Seed torch's global RNG for code that only knows the global RNG (model init), then restore it."""
    devices = list(range(torch.cuda.device_count())) if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(derive_seed(seed, *purpose))
        yield
