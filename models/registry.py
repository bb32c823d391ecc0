"""The architecture registry: each model module registers its Spec class with the metadata the harness needs.

    @ARCHS.register("mlp", vectorises=True, base_width=128, depth_exponent=1.5, init=kaiming_uniform_init)
    class MLPSpec: ...

- vectorises: its lockstep groups (the block models of a cell's seeds) train on the stacked engine on a GPU
  (`training.engine=auto`: launch-bound small models); one that does not vectorise groups on the loop engine (each
  member's own kernels, its numbers those of one model alone);
- base_width: the μP base model's width when `arch.base_width` is null;
- depth_exponent: the depth learning-rate rule lr·(L_base/L)^exponent (3/2 for MLPs, the paper's 1/2 otherwise);
- init: the initialiser μP re-initialises ≥2-D weights with.
- options: the dataclass of the architecture's own keys in its yaml (`arch.activation`, ...), read typed as
  `arch.options.<key>`;
- coord: how the μP coordinate check runs it (`CoordSettings`; the defaults suit an MLP-sized model).
A Spec class is a frozen dataclass with a `width` field (the μP base and delta models are its variants), and has
`from_arch(arch, input_shape, num_classes)`, `build()`, `info()` and `stage_depths(arch, depth=None)` (blocks per
stage, which the depth rule counts).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import Field, dataclass, field
from typing import Any, ClassVar, Protocol

from erasure.registry import Registry


class Arch(Protocol):
    """The typed `arch` config group (training/app/schema.py ArchConfig) as models read it: a frozen dataclass
    (`dataclasses.replace` makes variants of it)."""

    __dataclass_fields__: ClassVar[dict[str, Field[Any]]]

    @property
    def name(self) -> str: ...
    @property
    def width(self) -> int: ...
    @property
    def depth(self) -> int: ...
    @property
    def base_width(self) -> int | None: ...
    @property
    def base_depth(self) -> int: ...
    @property
    def parametrization(self) -> str: ...
    @property
    def options(self) -> Any: ...  # the architecture's own options dataclass


@dataclass(frozen=True)
class CoordSettings:
    """The μP coordinate check of an architecture (models/coord.py; scripts/coord_check.py and
    tests/test_coord_check.py run it for every registered one): its yaml with `arch` overridden, built at each of
    `widths` and trained `nsteps` steps at `lr` on one batch of 8×8 digits. Small models, so it runs on a CPU."""

    arch: Mapping[str, Any] = field(default_factory=lambda: {"depth": 2})
    widths: tuple[int, ...] = (64, 128, 256, 512, 1024)
    lr: float = 1e-2
    nsteps: int = 3


@dataclass(frozen=True)
class ArchTraits:
    """What an architecture declares where it registers (see above)."""

    vectorises: bool
    base_width: int
    depth_exponent: float
    init: Callable[..., Any]
    options: type[Any] | None = None
    coord: CoordSettings = CoordSettings()


# The architecture modules that fill it are listed in models/__init__.py.
ARCHS: Registry[Any] = Registry("architecture", declares=ArchTraits)


def arch_traits(name: str) -> ArchTraits:
    """What architecture `name` declared at registration (UnknownNameError for one not registered)."""
    declared: ArchTraits = ARCHS.declared(name)
    return declared
