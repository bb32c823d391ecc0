"""What an eraser is, declared where it registers, so that no code elsewhere checks an eraser's name.

    ERASERS.add("random", fit_random, family="linear", kind="map", rank_hint=RankHint("rank", "alf_qleace"))
    eraser_traits("random").rank_hint            # RankHint(option='rank', source='alf_qleace')
    eraser_traits("leace").options()             # LeaceOptions(method='leace', rtol=None): the defaults

The registry entry's metadata is the declaration (`family` and `kind` required, the rest optional with the defaults
below); `eraser_traits` reads it into a frozen `EraserTraits`. An eraser's options are a frozen dataclass: the one it
declares (`options=QleaceOptions`), else one made from its fitter's typed keyword-only parameters (or its `defaults`),
so every default and type is written once, in the declaration or the fitter.
`needs_labels` is the fitted class's own `Eraser.needs_labels` (the fitter's return annotation), else declared.
"""

from __future__ import annotations

import dataclasses
import inspect
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from .registry import ERASERS


@dataclass(frozen=True)
class RankHint:
    """The eraser removes as many directions as eraser `source` (default options) removes on the same data, when its
    option `option` is None (a rank-matched baseline)."""

    option: str
    source: str

    def wanted(self, resolved: Mapping[str, Any]) -> bool:
        return self.option in resolved and resolved[self.option] is None


@dataclass(frozen=True)
class BatchNoise:
    """The fit may add noise with exact moments on whole classes (QLEACE's coupling), so it cannot be applied per
    training batch: `applies(options)` says whether these options can add it, `ranks(x, y, **options)` predicts the
    noise rank per class without fitting."""

    applies: Callable[[Mapping[str, Any]], bool]
    ranks: Callable[..., list[int]]


@dataclass(frozen=True)
class EraserTraits:
    name: str
    family: str  # control | linear | quadratic: picks the paper's learning rate (conf/optim)
    has_map: bool  # kind=map: a fitted eraser applied to any rows; False (kind=edit): edits one dataset once
    options: type  # frozen dataclass: every option with its default
    needs_labels: bool  # the map takes each row's label (a map per class); an edit that uses the labels
    identity: bool = False  # the unerased control: nothing to fit, the data unchanged
    holdout_options: Mapping[str, Any] = field(default_factory=dict)  # applied to unset options out of sample
    rank_hint: RankHint | None = None
    batch_noise: BatchNoise | None = None
    runtime_options: frozenset[str] = frozenset()  # options that do not change the erased data (not hashed)
    from_moments: Callable[..., Any] | None = None  # a fit from accumulated class moments (erasure/streaming.py)
    # options read only with another option's value: {option: (that option, the values it is read with)} (QLEACE's
    # ridge: rank_deficient=ridge only); elsewhere they must keep their default (the harness refuses another value)
    read_only_with: Mapping[str, tuple[str, tuple[Any, ...]]] = field(default_factory=dict)
    input_range: tuple[float, float] | None = None  # the values it can take (gradient erasure: [0, 1], a sigmoid)

    def __post_init__(self) -> None:  # the declaration's values, whatever container they came in, frozen
        object.__setattr__(self, "identity", bool(self.identity))
        object.__setattr__(self, "holdout_options", MappingProxyType(dict(self.holdout_options)))
        object.__setattr__(self, "runtime_options", frozenset(self.runtime_options))
        object.__setattr__(self, "read_only_with", MappingProxyType(dict(self.read_only_with)))

    def defaults(self) -> dict[str, Any]:
        return {f.name: getattr(self.options(), f.name) for f in dataclasses.fields(self.options)}

    def unread_option(self, options: Mapping[str, Any]) -> tuple[str, str, tuple[Any, ...]] | None:
        """(an option of `options` away from its default that these options do not read (`read_only_with`), the
        option it needs, the values it is read with), or None."""
        resolved = {**self.defaults(), **options}
        for key, (when, values) in self.read_only_with.items():
            if key in options and options[key] != self.defaults()[key] and resolved[when] not in values:
                return key, when, values
        return None


_READ_HERE = {"family", "kind", "defaults", "options", "needs_labels"}  # the rest is passed to EraserTraits as declared
_DECLARED = {f.name for f in dataclasses.fields(EraserTraits) if f.default is not dataclasses.MISSING
             or f.default_factory is not dataclasses.MISSING}
_KNOWN_META = _READ_HERE | _DECLARED


_READ: dict[str, tuple[Any, EraserTraits]] = {}  # name -> (the entry read, its traits)


def eraser_traits(name: str) -> EraserTraits:
    """The declared properties of eraser `name` (UnknownNameError, listing the names, for one not registered)."""
    entry = ERASERS.entry(name)
    read = _READ.get(name)
    if read is None or read[0] is not entry:  # a re-registered name is read again
        read = _READ[name] = (entry, _traits(name, entry.obj, entry.meta))
    return read[1]


def _traits(name: str, fitter: Callable[..., Any], meta: Mapping[str, Any]) -> EraserTraits:
    unknown = set(meta) - _KNOWN_META
    if unknown:
        raise TypeError(f"eraser {name!r}: unknown metadata {sorted(unknown)}; known: {sorted(_KNOWN_META)}")
    if meta["kind"] not in ("map", "edit"):
        raise TypeError(f"eraser {name!r}: kind must be map or edit; got {meta['kind']!r}")
    declared = {k: v for k, v in meta.items() if k in _DECLARED}  # the optional properties: defaults in EraserTraits
    return EraserTraits(
        name=name, family=str(meta["family"]), has_map=meta["kind"] == "map",
        options=meta.get("options") or _options_class(name, fitter, meta),
        needs_labels=_needs_labels(name, fitter, meta), **declared)


def _options_class(name: str, fitter: Callable[..., Any], meta: Mapping[str, Any]) -> type:
    """The options dataclass of the fitter's keyword-only parameters (or of the declared `defaults`), each typed by
    its annotation, else by its default's type (Any for a None default)."""
    if "defaults" in meta:
        defaults, hints = dict(meta["defaults"]), {}
    else:
        params = inspect.signature(fitter).parameters.values()
        defaults = {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY and p.name != "rank_hint"}
        try:
            hints = typing.get_type_hints(fitter)
        except (NameError, TypeError):  # an annotation that does not resolve: typed by the defaults
            hints = {}
    title = "".join(part.title() for part in name.split("_"))
    fields = [(k, hints.get(k, Any if v is None else float if isinstance(v, float) else type(v)), field(default=v))
              for k, v in defaults.items()]
    cls = dataclasses.make_dataclass(f"{title}Options", fields, frozen=True, kw_only=True)
    cls.__module__ = __name__
    return cls


def _needs_labels(name: str, fitter: Callable[..., Any], meta: Mapping[str, Any]) -> bool:
    if "needs_labels" in meta:
        return bool(meta["needs_labels"])
    from .base import Eraser

    returned = typing.get_type_hints(fitter).get("return")
    if isinstance(returned, type) and issubclass(returned, Eraser):
        return bool(returned.needs_labels)
    raise TypeError(f"eraser {name!r}: declare needs_labels= at registration, or annotate the fitter's return "
                    "with its Eraser class")
