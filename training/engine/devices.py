"""`device=auto|cpu|cuda|cuda:N` -> torch.device, with one clear error when CUDA is asked for but absent."""

from __future__ import annotations

import torch


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device={name} requested but CUDA is not available")
    return torch.device(name)
