"""Where the Hydra config lives (`CONF_DIR`) and a composed node as the plain dict a job config is loaded from."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from omegaconf import OmegaConf

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def resolved_dict(node: Any, resolve: bool = True) -> dict[str, Any]:
    """A config node (DictConfig) as a plain dict, interpolations resolved (or not)."""
    plain = OmegaConf.to_container(node, resolve=resolve)
    if not isinstance(plain, dict):
        raise TypeError(f"expected a group of keys, got {type(plain).__name__}")
    return cast(dict[str, Any], plain)  # conf/'s groups have string keys
