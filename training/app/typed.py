"""Typed config fields and their checks: the machinery behind training/app/schema.py, with no config of its own.
`spec(...)` declares a field of a config section (its type, check, what is allowed, whether it enters the job hash);
a group member's own options dataclass is built by training/common/option_checks.py `build_options`. Every refusal
is a `ConfigError`: one line naming the key, the value and what is allowed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

# the option checks of plain dataclasses, re-exported for the task modules (whose top level imports training.app only)
from training.common.option_checks import NONNEG as NONNEG
from training.common.option_checks import POSITIVE as POSITIVE
from training.common.option_checks import POSITIVE_NUMBER as POSITIVE_NUMBER
from training.errors import ConfigError as ConfigError  # a bad config value (one line), raised here and by the checks

Check = Callable[[Any], bool]


@dataclass(frozen=True)
class FieldSpec:
    """What a config field declares: its type (`kind`; a Section for a nested group), check, what is allowed, its
    choices, whether None is allowed, whether it enters the job hash (`hash_default` False: only away from its
    default, so a key added later leaves existing hashes as they were), whether an empty value is left out of the
    composed dict (`omit_empty`), and whether it is a typed view of other keys (not a key of its own)."""

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


def spec(default: Any = dataclasses.MISSING, **kw: Any) -> Any:
    """A config field declared by its FieldSpec: the keywords named as FieldSpec's fields (kind, check, allowed,
    ...) make it, the others go to `dataclasses.field` (default_factory, compare, repr)."""
    meta = {SPEC: FieldSpec(**{k: kw.pop(k) for k in _SPEC_KEYS & kw.keys()})}
    return field(default=default, metadata=meta, **kw)


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
    """Why `value` may not be a part of a job's path built from config (one name, `single`: the tags, `paths.cell`;
    else a relative path), or None: never empty, no NUL, no `..` (outside paths.out_dir), no absolute part."""
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
