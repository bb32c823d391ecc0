"""Where the Hydra config lives (`CONF_DIR`), a composed node as the plain dict a job config is loaded from
(`resolved_dict`), and the plain resolvers conf/ uses (registered by training/app/resolvers.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from omegaconf import DictConfig, OmegaConf

from erasure.registry import ERASERS

CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def resolved_dict(node: Any, resolve: bool = True) -> dict[str, Any]:
    """A config node (DictConfig) as a plain dict, interpolations resolved (or not)."""
    plain = OmegaConf.to_container(node, resolve=resolve)
    if not isinstance(plain, dict):
        raise TypeError(f"expected a group of keys, got {type(plain).__name__}")
    return cast(dict[str, Any], plain)  # conf/'s groups have string keys


def suffix(value: object, sep: str = "_") -> str:
    """`${suffix:${.size}}` -> "_atto" for a named size, "" when unset (keeps job dirs distinct per size)."""
    return "" if value in (None, "", "None", "null") else f"{sep}{value}"


def eraser_family(name: str) -> str:
    """`${eraser_family:${eraser.name}}`: control | linear | quadratic, from the eraser's registry entry."""
    if str(name) not in ERASERS:  # composes, so that the job's config check refuses the name in one line (it would
        return "control"  # otherwise fail inside Hydra's interpolation, hundreds of lines)
    return str(ERASERS.meta(str(name))["family"])


def group_yaml(group: str, name: str, **overrides: Any) -> dict[str, Any]:
    """One config group as conf/<group>/<name>.yaml composes it (its defaults list, the keys conf/config.yaml gives
    every member of the group), with overrides, resolved: what training.app.schema.group_config loads typed."""

    def compose(member: str) -> Any:
        node = OmegaConf.load(CONF_DIR / group / f"{member}.yaml")
        assert isinstance(node, DictConfig)
        bases = [compose(str(d)) for d in node.pop("defaults", []) if d != "_self_"]
        return OmegaConf.merge(*bases, node)

    root = OmegaConf.load(CONF_DIR / "config.yaml")  # keys every member of the group has (eraser.fit_on, ...)
    assert isinstance(root, DictConfig)
    shared = root[group] if group in root else {}
    return resolved_dict(OmegaConf.merge(shared, compose(name), overrides))
