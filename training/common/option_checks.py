"""Plain option dataclasses (a dataset's, an architecture's, a task's own options): `build_options(cls, data)` builds
one from its keys, checked against the annotations and a field's `metadata={"check": ..., "allowed": ...}` (the
common ones below); every refusal is a `ConfigError`, one line naming the key, the value and what is allowed."""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

from training.errors import ConfigError

POSITIVE: dict[str, Any] = {"check": lambda v: v >= 1, "allowed": "an integer ≥ 1"}
NONNEG: dict[str, Any] = {"check": lambda v: v >= 0, "allowed": "a number ≥ 0"}
POSITIVE_NUMBER: dict[str, Any] = {"check": lambda v: v > 0, "allowed": "a number > 0"}


_R = TypeVar("_R")
# a key a raw (semantic, unchecked or stored) config section lacks, in its typed view (`raw_view`)
ABSENT: Any = type("Absent", (), {"__repr__": lambda self: "ABSENT"})()


def raw_view(cls: type[_R], section: Mapping[str, Any]) -> _R:
    """The keys of a raw config section that the dataclass `cls` declares (those it lacks read as the field's
    default): tolerant, so any value may be of any type."""
    return cls(**{f.name: section[f.name] for f in dataclasses.fields(cls) if f.name in section})  # type: ignore[arg-type]


def shown(v: Any) -> str:
    """A value as it is written on the command line (true, null, swiglu)."""
    return v if isinstance(v, str) else json.dumps(v)


def build_options(cls: type[Any] | None, data: Mapping[str, Any], prefix: str = "", known: tuple[str, ...] = (),
                  owner: str = "") -> Any:
    """An options dataclass from its keys, checked against the annotations (int, float, bool, str, Literal,
    `X | None`, lists, nested dataclasses) and a field's `metadata`; unknown keys are refused."""
    fields = {f.name: f for f in dataclasses.fields(cls)} if cls is not None else {}
    unknown = sorted(k for k in data if k not in fields)
    if unknown:
        k = unknown[0]
        names = sorted([*known, *fields])
        raise ConfigError(f"{prefix}{k}={data[k]!r} is not allowed: not an option of {owner}; known: "
                          f"{', '.join(names)}")
    if cls is None:
        return None
    hints = typing.get_type_hints(cls)
    values = {}
    for name, f in fields.items():
        if name in data and dataclasses.is_dataclass(hints[name]):
            values[name] = build_options(hints[name], data[name] or {}, f"{prefix}{name}.", owner=owner)
        elif name in data:
            values[name] = check_typed(prefix + name, data[name], hints[name], f.metadata.get("check"),
                                       f.metadata.get("allowed", ""))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{prefix}{name} is missing: set it in its yaml or on the command line "
                              f"({prefix}{name}=...)")
    return cls(**values)


def check_typed(key: str, value: Any, tp: Any, check: Callable[[Any], bool] | None = None, allowed: str = "") -> Any:
    """`value` checked against the annotation `tp` (an int is accepted where a float is declared) and `check`
    (`allowed` says what it allows); ConfigError naming the key and what is allowed."""
    out, ok = _conform(value, tp)
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {key} must be {allowed or _describe(tp)}")
    if check is not None and out is not None and not check(out):
        raise ConfigError(f"{key}={value!r} is not allowed: {key} must be {allowed or 'another value'}")
    return out


def _conform(value: Any, tp: Any) -> tuple[Any, bool]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if tp is Any:
        return value, True
    if origin is typing.Literal:
        return value, any(value == a and type(value) is type(a) for a in args)
    if origin in (types.UnionType, typing.Union):
        for arg in args:
            out, ok = _conform(value, arg)
            if ok:
                return out, True
        return value, False
    if tp is type(None):
        return None, value is None
    if origin in (list, tuple, collections.abc.Sequence):
        if not isinstance(value, (list, tuple)):
            return value, False
        item = args[0] if args else Any
        items = [_conform(v, item) for v in value]
        return [v for v, _ in items], all(ok for _, ok in items)
    if origin is dict or tp is dict:
        return value, isinstance(value, Mapping)
    if tp is bool:
        return value, isinstance(value, bool)
    if tp is int:
        return value, isinstance(value, int) and not isinstance(value, bool)
    if tp is float:  # an int stays an int (as composed): it is a float wherever one is used
        return value, isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if tp is str:
        return value, isinstance(value, str)
    return value, isinstance(value, tp) if isinstance(tp, type) else True


def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin is typing.Literal:
        return "one of " + ", ".join(json.dumps(a) if isinstance(a, bool) else str(a) for a in args)
    if origin in (types.UnionType, typing.Union):
        return " or ".join("null" if a is type(None) else _describe(a) for a in args)
    if origin in (list, tuple, collections.abc.Sequence):
        return f"a list of {_describe(args[0]).removeprefix('a ').removeprefix('an ')}s" if args else "a list"
    names = {int: "an integer", float: "a finite number", str: "a string", bool: "true or false",
             dict: "a group of keys"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))
