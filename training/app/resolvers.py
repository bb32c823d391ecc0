"""OmegaConf resolvers used by conf/ (registered when the `training` package is imported)."""

from __future__ import annotations

from omegaconf import OmegaConf


def _suffix(value: object, sep: str = "_") -> str:
    """`${suffix:${.size}}` -> "_atto" for a named size, "" when unset (keeps job dirs distinct per size)."""
    return "" if value in (None, "", "None", "null") else f"{sep}{value}"


def register() -> None:
    if not OmegaConf.has_resolver("suffix"):
        OmegaConf.register_new_resolver("suffix", _suffix)
