"""One small registry for everything chosen by name: erasers, datasets, architectures, tasks, regularizers.

    ERASERS = Registry("eraser", meta=("family", "kind"))

    @ERASERS.register("leace", family="linear", kind="map")
    def fit_leace(x, y, *, rtol=None): ...

    ERASERS.get("leace")            # the registered object (UnknownNameError for a name not registered)
    ERASERS.meta("leace")["family"] # its metadata

A registry may declare its metadata as a frozen dataclass (`Registry("dataset", declares=DatasetTraits)`): each
entry's metadata is then built into it at registration (an unknown or missing key is refused there), and
`declared(name)` returns it, read as attributes.

An entry registers itself where it is defined, when its module is imported. Nothing is discovered: each registry's
package imports its member modules by an explicit list in its `__init__.py` (erasure/, models/, training/data/), so
every edge is an import statement, and importing any module of the package (this one included) registers them all.
Adding an entry is one module, its line in that list, and its yaml.
It lives in erasure/ because that is the bottom layer: models/ and training/ may import it, it imports nothing.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class UnknownNameError(ValueError):
    """A name no entry of the registry has; the message lists the names that exist."""


@dataclass(frozen=True)
class Entry(Generic[T]):
    name: str
    obj: T
    meta: Mapping[str, Any] = field(default_factory=dict)
    declared: Any = None  # the metadata as the registry's declaration dataclass (None: it declares none)


class Registry(Generic[T]):
    def __init__(self, kind: str, meta: Sequence[str] = (), declares: type[Any] | None = None) -> None:
        """`meta`: the metadata keys every entry must give; `declares`: a frozen dataclass of the metadata (its
        fields without a default are then the required keys)."""
        self.kind = kind
        self._declares = declares
        fields = dataclasses.fields(declares) if declares is not None else ()
        required = [f.name for f in fields if f.default is dataclasses.MISSING
                    and f.default_factory is dataclasses.MISSING]
        self._required = tuple(meta) + tuple(required)
        self._entries: dict[str, Entry[T]] = {}

    def register(self, name: str, **meta: Any) -> Callable[[T], T]:
        """Decorator: register the decorated object under `name` with its metadata."""
        def deco(obj: T) -> T:
            self.add(name, obj, **meta)
            return obj

        return deco

    def add(self, name: str, obj: T, **meta: Any) -> None:
        missing = [k for k in self._required if k not in meta]
        if missing:
            raise TypeError(f"{self.kind} {name!r}: metadata {missing} is required")
        old = self._entries.get(name)
        if old is not None and old.obj is not obj and _origin(old.obj) != _origin(obj):
            raise ValueError(f"{self.kind} {name!r} is registered twice ({_origin(old.obj)} and {_origin(obj)})")
        declared = None
        if self._declares is not None:
            unknown = sorted(set(meta) - {f.name for f in dataclasses.fields(self._declares)})
            if unknown:
                raise TypeError(f"{self.kind} {name!r}: unknown metadata {unknown}; declared: "
                                f"{[f.name for f in dataclasses.fields(self._declares)]}")
            declared = self._declares(**meta)
        self._entries[name] = Entry(name, obj, MappingProxyType(dict(meta)), declared)

    def entry(self, name: str) -> Entry[T]:
        if name not in self._entries:
            raise UnknownNameError(f"unknown {self.kind} {name!r}; choose one of {self.names()}")
        return self._entries[name]

    def get(self, name: str) -> T:
        return self.entry(name).obj

    def meta(self, name: str) -> Mapping[str, Any]:
        return self.entry(name).meta

    def declared(self, name: str) -> Any:
        """The entry's metadata as the registry's declaration dataclass (`declares`)."""
        if self._declares is None:
            raise TypeError(f"the {self.kind} registry declares no metadata dataclass")
        return self.entry(name).declared

    def names(self) -> list[str]:
        return sorted(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries

    def __iter__(self) -> Iterator[Entry[T]]:
        return iter([self._entries[k] for k in sorted(self._entries)])


def _origin(obj: object) -> str:
    return f"{getattr(obj, '__module__', '?')}.{getattr(obj, '__qualname__', type(obj).__name__)}"


# Erasers: family (control | linear | quadratic: picks the paper's learning rate) and kind (map: a fitted eraser
# applied to x; edit: edits a dataset, like gradient erasure), and optionally the other properties erasure/traits.py
# reads into `EraserTraits` (identity, holdout options, rank hint, ...): code elsewhere asks those, never a name.
# The eraser modules that fill it are listed in erasure/__init__.py.
ERASERS: Registry[Any] = Registry("eraser", meta=("family", "kind"))
