"""Typed config fields and their checks: the machinery behind training/app/schema.py, with no config of its own.

`spec(...)` declares a field of a config section (its type, check, what is allowed, whether it enters the job hash);
`build_options(cls, data)` builds a group member's own options dataclass from its keys, checked against the
annotations (int, float, bool, str, Literal, `X | None`, lists, nested dataclasses) and a field's
`metadata={"check": ..., "allowed": ...}`. Every refusal is a `ConfigError`: one line naming the key, the value
and what is allowed.
"""

from __future__ import annotations

import collections.abc
import dataclasses
import json
import math
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

# the option checks of plain dataclasses, re-exported for the task modules (whose top level imports training.app only)
from training.common.option_checks import NONNEG as NONNEG
from training.common.option_checks import POSITIVE as POSITIVE
from training.common.option_checks import POSITIVE_NUMBER as POSITIVE_NUMBER
from training.errors import UserError

Check = Callable[[Any], bool]


class ConfigError(UserError, ValueError):
    """A config value that is not allowed; the message is one line: key, value, what is allowed."""


@dataclass(frozen=True)
class FieldSpec:
    """What a config field declares: its type (`kind`; a Section for a nested group), value check and how to describe
    what is allowed, its choices, whether None is allowed, whether it enters the job hash (`hash_default` False: only
    when not at its default, so a key added later leaves existing hashes as they were), whether an empty value is
    left out of the composed dict, and whether it is a typed view of other keys (not a key of its own)."""

    kind: type | tuple[type, ...] | None = None
    check: Check | None = None
    allowed: str = ""
    choices: tuple[Any, ...] = ()
    optional: bool = False
    hash: bool = True
    omit_empty: bool = False
    typed_view: bool = False
    hash_default: bool = True

    def describe(self, fallback: str) -> str:
        return self.allowed or fallback


SPEC = "spec"  # the metadata key of a field's FieldSpec
_SPEC_KEYS = frozenset(f.name for f in dataclasses.fields(FieldSpec))


def field_spec(f: dataclasses.Field[Any]) -> FieldSpec:
    """A field's FieldSpec: the one `spec(...)` stored, or read once from a plain `metadata={"check": ...,
    "allowed": ...}` (a member's options dataclass)."""
    meta = f.metadata
    if SPEC in meta:
        stored: FieldSpec = meta[SPEC]
        return stored
    return FieldSpec(**{k: meta[k] for k in _SPEC_KEYS if k in meta})


def spec(default: Any = dataclasses.MISSING, *, kind: type | tuple[type, ...] | None = None,
         check: Check | None = None, allowed: str = "", choices: tuple[Any, ...] = (), optional: bool = False,
         hash: bool = True, default_factory: Any = dataclasses.MISSING,  # noqa: A002 - mirrors the concept
         omit_empty: bool = False, typed_view: bool = False, hash_default: bool = True, **field_kw: Any) -> Any:
    """A config field declared by its FieldSpec (see there)."""
    meta = {SPEC: FieldSpec(kind, check, allowed, choices, optional, hash, omit_empty, typed_view, hash_default)}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta, **field_kw)
    return field(default=default, metadata=meta, **field_kw)


# ---- common checks ------------------------------------------------------------------------------------------
def positive_int(default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    return spec(default, kind=int, check=lambda v: v >= 1, allowed="an integer ≥ 1", **kw)


def nonneg_int(default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    return spec(default, kind=int, check=lambda v: v >= 0, allowed="an integer ≥ 0", **kw)


def positive_float(default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    return spec(default, kind=(int, float), check=lambda v: v > 0 and math.isfinite(v), allowed="a number > 0",
                **kw)


def unit_interval(default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    return spec(default, kind=(int, float), check=lambda v: 0 <= v < 1, allowed="a number in [0, 1)", **kw)


def flag(default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    return spec(default, kind=bool, allowed="true or false", **kw)


def one_of(default: Any, *choices: Any, **kw: Any) -> Any:
    return spec(default, choices=choices, **kw)


def auto_or_positive_int(default: Any = "auto", **kw: Any) -> Any:
    return spec(default, check=lambda v: v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1),
                allowed="auto or an integer ≥ 1", **kw)


def path_part(**kw: Any) -> Any:
    """A name that becomes one directory of the job's path (`dataset.tag`, `arch.tag`): see `path_refusal`."""
    return spec(kind=str, check=lambda v: path_refusal(v, single=True) is None, allowed=NAME_ALLOWED, **kw)


NAME_ALLOWED = "a non-empty name without /, \\ or .., not '.', at most 255 bytes (it names a directory)"
SUBPATH_ALLOWED = ("a relative path without .., '.' or empty parts, each at most 255 bytes (it names directories under "
                   "paths.out_dir)")
NAME_MAX = 255  # bytes of one name in a path (the limit of Linux file systems)


def path_refusal(value: str, single: bool) -> str | None:
    """Why `value` may not be a part of a job's path built from config, or None. The one check of every such part
    (`dataset.tag`, `arch.tag`, `paths.cell`: one name, `single`; `paths.job_subdir`, `paths.by_task.*`: a relative
    path): never empty, no NUL, no `..` (it would put the job outside paths.out_dir), no absolute part."""
    if not value.strip() or "\0" in value:
        return "empty" if not value.strip() else "a NUL character"
    if single and ("/" in value or "\\" in value):
        return "a separator where one name is expected"
    if ".." in value:
        return "'..' (it would leave paths.out_dir)"
    if value.startswith(("/", "\\")) or (len(value) > 1 and value[1] == ":"):
        return "an absolute path"
    parts = value.replace("\\", "/").split("/")
    if any(not part.strip() for part in parts):
        return "an empty part (//)"
    if "." in parts:
        return "'.' (the directory above: jobs would land in another layout)"
    if any(len(part.encode()) > NAME_MAX for part in parts):
        return f"a name over {NAME_MAX} bytes"
    return None


def kind_name(kinds: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a group of keys",
             list: "a list"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def build_options(cls: type[Any] | None, data: Mapping[str, Any], prefix: str = "", known: tuple[str, ...] = (),
                  owner: str = "") -> Any:
    """An options dataclass from its keys, checked against the annotations (int, float, bool, str, Literal,
    `X | None`, lists) and a field's `metadata={"check": ..., "allowed": ...}`; unknown keys are refused."""
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
            values[name] = check_typed(prefix + name, data[name], hints[name], field_spec(f))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            raise ConfigError(f"{prefix}{name} is missing: set it in its yaml or on the command line "
                              f"({prefix}{name}=...)")
    return cls(**values)


def check_typed(key: str, value: Any, tp: Any, declared: FieldSpec | None = None) -> Any:
    """`value` checked against the annotation `tp` (an int is accepted where a float is declared); ConfigError
    naming the key and what is allowed. Options dataclasses nest (a field typed by another dataclass)."""
    declared = declared or FieldSpec()
    out, ok = _conform(value, tp)
    if not ok:
        raise ConfigError(f"{key}={value!r} is not allowed: {key} must be {declared.describe(_describe(tp))}")
    if declared.check is not None and out is not None and not declared.check(out):
        raise ConfigError(f"{key}={value!r} is not allowed: {key} must be {declared.describe('another value')}")
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
