"""PLACEHOLDER (issue 12 branch): the lead's typed config schema (issue 11) replaces this module at merge.

It provides the interface the entrypoint and the multirun ledger code against: `load_config(cfg)` checks a
resolved job config and returns it (the real one returns a typed `JobConfig`, readable as a mapping), raising
`ConfigError` with ONE line naming the key, the value and what is allowed. Only the values issue 12 lists are
checked here.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from training.errors import UserError


class ConfigError(UserError, ValueError):
    """A config value that is not allowed; the message is one line: key, value, what is allowed."""


def _get(cfg: Mapping[str, Any], dotted: str) -> Any:
    node: Any = cfg
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


_CHECKS: tuple[tuple[str, Callable[[Any], bool], str, bool], ...] = (
    # key, allowed?, what is allowed, may it be null
    ("seed", lambda v: _int(v) and v >= 0, "an integer >= 0", False),
    ("arch.width", lambda v: _int(v) and v >= 1, "an integer >= 1", False),
    ("arch.depth", lambda v: _int(v) and v >= 1, "an integer >= 1", False),
    ("mdl.max_epochs", lambda v: _int(v) and v >= 1, "an integer >= 1", False),
    ("mdl.num_blocks", lambda v: _int(v) and v >= 2, "an integer >= 2", False),
    ("optim.lr", lambda v: _num(v) and v > 0, "a number > 0, or null for the paper's value", True),
)


def load_config(cfg: Mapping[str, Any]) -> Mapping[str, Any]:
    """`cfg` when its values are allowed; else ConfigError (one line)."""
    for key, ok, allowed, nullable in _CHECKS:
        value = _get(cfg, key)
        if value is None and (nullable or _get(cfg, key.rsplit(".", 1)[0]) is None and "." in key):
            continue  # null where allowed, or a group this task's config does not have
        if not ok(value):
            raise ConfigError(f"{key}={value!r} is not allowed: {key} must be {allowed}")
    return cfg
