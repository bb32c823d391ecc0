"""Loss regularizers added to the cross-entropy during training (never to early stopping or coding)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from training.fit import Regularizer


def build_regularizer(cfg: Mapping[str, Any] | None, num_classes: int) -> Regularizer | None:
    name = "none" if cfg is None else cfg.get("name", "none")
    if name == "none":
        return None
    raise ValueError(f"unknown regularizer {name!r}")
