"""Typed job configs: one dataclass per config group, checked right after Hydra composes the config.

`load_config(resolved)` turns the composed config into a `JobConfig` or raises `ConfigError` with one line naming
the key, the value and what is allowed; the job receives the typed object (`cfg.mdl.patience`; it also reads as
a mapping, `cfg["mdl"]["patience"]`, for code written against plain dicts). Each group's yaml may carry keys a
schema does not declare (dataset- or architecture-specific ones, `gs.*`): they pass through as extras and are
semantic. Hydra itself rejects overrides of keys that exist nowhere.

Which keys enter the job hash (and so the job directory) is declared next to the field: `hash=False` for what
only says where things go or how fast or visibly they run. Eraser options that do not change the erased data are
declared by the eraser itself (`runtime_options` in its registry entry).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from training.errors import UserError

Check = Callable[[Any], bool]


class ConfigError(UserError, ValueError):
    """A config value that is not allowed; the message is one line: key, value, what is allowed."""


def spec(default: Any = dataclasses.MISSING, *, kind: type | tuple[type, ...] | None = None,
         check: Check | None = None, allowed: str = "", choices: tuple[Any, ...] = (), optional: bool = False,
         hash: bool = True, default_factory: Any = dataclasses.MISSING) -> Any:  # noqa: A002 - mirrors the concept
    """A config field: its type (`kind`), value check and how to describe what is allowed, whether None is
    allowed, and whether it enters the job hash."""
    meta = {"kind": kind, "check": check, "allowed": allowed, "choices": choices, "optional": optional,
            "hash": hash}
    if default_factory is not dataclasses.MISSING:
        return field(default_factory=default_factory, metadata=meta)
    return field(default=default, metadata=meta)


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


# ---- the sections -------------------------------------------------------------------------------------------
class Section(Mapping[str, Any]):
    """A config group: typed fields, plus the yaml's undeclared keys as extras; reads as a mapping too."""

    open: ClassVar[bool] = True  # undeclared keys allowed (they pass through, semantic)
    _extra: dict[str, Any]

    def __getitem__(self, key: str) -> Any:
        if key in self._declared():
            return getattr(self, key)
        return self._extra[key]

    def __iter__(self) -> Iterator[str]:
        yield from self._declared()
        yield from self._extra

    def __len__(self) -> int:
        return len(self._declared()) + len(self._extra)

    def __getattr__(self, key: str) -> Any:  # extras as attributes (only called when normal lookup fails)
        extra = self.__dict__.get("_extra", {})
        if key in extra:
            return extra[key]
        raise AttributeError(f"{type(self).__name__} has no key {key!r}")

    @classmethod
    def _declared(cls) -> tuple[str, ...]:
        return tuple(f.name for f in dataclasses.fields(cls) if f.name != "_extra")  # type: ignore[arg-type]


def _extra_field() -> Any:
    return field(default_factory=dict, repr=False, compare=True, metadata={"hash": True})


@dataclass(frozen=True, kw_only=True)
class DatasetConfig(Section):
    name: str = spec(kind=str, check=lambda v: v in _datasets(), allowed="a registered dataset")
    tag: str = spec(kind=str, hash=False)  # names the job directory
    augment: bool = flag(False)
    zscore: bool = flag(False)
    limit: int | None = positive_int(None, optional=True)
    zscore_order: str = one_of("before", "before", "after")  # standardise before erasure (ours) or after (paper code)
    root: str | None = spec(None, kind=str, optional=True, hash=False)  # where the files are, not what they are
    download: bool = flag(True, hash=False)
    _extra: dict[str, Any] = _extra_field()


@dataclass(frozen=True, kw_only=True)
class EraserConfig(Section):
    open: ClassVar[bool] = False
    name: str = spec(kind=str, check=lambda v: v in _erasers(), allowed="a registered eraser")
    options: dict[str, Any] = spec(default_factory=dict, kind=dict)
    _extra: dict[str, Any] = _extra_field()


@dataclass(frozen=True, kw_only=True)
class ArchConfig(Section):
    name: str = spec(kind=str, check=lambda v: v in _archs(), allowed="a registered architecture")
    tag: str = spec(kind=str, hash=False)
    width: int = positive_int()
    depth: int = positive_int()
    base_width: int | None = positive_int(None, optional=True)
    base_depth: int = positive_int(2)
    parametrization: str = one_of("mup", "mup", "sp")
    _extra: dict[str, Any] = _extra_field()


@dataclass(frozen=True, kw_only=True)
class OptimConfig(Section):
    open: ClassVar[bool] = False
    lr: float = positive_float()
    beta1: float = unit_interval()
    beta2: float = unit_interval(0.999)
    weight_decay: float = spec(0.0, kind=(int, float), check=lambda v: v >= 0, allowed="a number ≥ 0")
    warmup_steps: int = nonneg_int(0)
    batch_size: int = positive_int(128)
    depth_lr_rule: bool = flag(True)
    _extra: dict[str, Any] = _extra_field()


@dataclass(frozen=True, kw_only=True)
class MdlConfig(Section):
    protocol: str = one_of("prequential", "prequential", "paper")
    num_blocks: int = spec(10, kind=int, check=lambda v: v >= 2, allowed="an integer ≥ 2")
    min_block: int = positive_int(1024)
    val_size: int = positive_int(2048)
    val_frac: float = spec(0.2, kind=(int, float), check=lambda v: 0 < v < 1, allowed="a number in (0, 1)")
    patience: int = positive_int(100)
    max_epochs: int = positive_int(30000)
    eval_every_steps: int | None = positive_int(None, optional=True)
    full_run: bool = flag(True)
    calibrate_temperature: bool = flag(False)
    stop_after_warmup: bool = flag(True)  # step-aware early stopping (training/engine/stopping.py)
    min_steps: int = nonneg_int(0)
    patience_min_steps: int = nonneg_int(0)
    _extra: dict[str, Any] = _extra_field()


@dataclass(frozen=True, kw_only=True)
class RegularizerConfig(Section):
    name: str = spec(kind=str, check=lambda v: v in _regularizers(), allowed="a registered regularizer")
    _extra: dict[str, Any] = _extra_field()


@dataclass(frozen=True, kw_only=True)
class TrainingConfig(Section):
    """Speed only: every option gives the numbers of one-at-a-time training (tests/test_vectorized.py)."""

    open: ClassVar[bool] = False
    parallel_models: Any = auto_or_positive_int()
    engine: str = one_of("auto", "auto", "loop", "stacked")
    workers: Any = auto_or_positive_int()
    storage: str = one_of("auto", "auto", "float32", "float16", "uint8")
    compile: Any = one_of(False, False, True, "default", "reduce-overhead", "max-autotune")
    fused_optimizer: Any = one_of(False, False, True, "numba", "compile", "eager")
    _extra: dict[str, Any] = _extra_field()


@dataclass(frozen=True, kw_only=True)
class JobConfig(Section):
    task: str = spec("mdl", kind=str, check=lambda v: v in _tasks(), allowed="a registered task")
    seed: int = nonneg_int(0)
    device: str = spec("auto", kind=str, check=lambda v: v in ("auto", "cpu", "cuda") or v.startswith("cuda:"),
                       allowed="auto, cpu, cuda or cuda:N", hash=False)
    force: bool = flag(False, hash=False)
    experiment_name: str | None = spec(None, kind=str, optional=True, hash=False)
    progress: bool = flag(True, hash=False)
    certificate: bool = flag(True)
    claims: list[str] | None = spec(None, kind=list, optional=True, hash=False)  # what scripts/claims.py tests
    dataset: DatasetConfig = spec(kind=DatasetConfig)
    eraser: EraserConfig = spec(kind=EraserConfig)
    arch: ArchConfig = spec(kind=ArchConfig)
    optim: OptimConfig = spec(kind=OptimConfig)
    mdl: MdlConfig = spec(kind=MdlConfig)
    regularizer: RegularizerConfig = spec(kind=RegularizerConfig)
    training: TrainingConfig = spec(kind=TrainingConfig, hash=False)
    logger: dict[str, Any] = spec(default_factory=dict, kind=dict, hash=False)
    paths: dict[str, Any] = spec(default_factory=dict, kind=dict, hash=False)
    _extra: dict[str, Any] = _extra_field()  # task-specific groups (gs) — semantic


# ---- registries, looked up lazily (conf composition should not import every model) --------------------------
def _datasets() -> list[str]:
    from training.data.registry import DATASETS

    return DATASETS.names()


def _erasers() -> list[str]:
    from erasure.registry import ERASERS

    return ERASERS.names()


def _archs() -> list[str]:
    from models.registry import ARCHS

    return ARCHS.names()


def _regularizers() -> list[str]:
    from training.engine.regularizers import REGULARIZERS

    return REGULARIZERS.names()


def _tasks() -> list[str]:
    from training.app.tasks import task_names  # the static declaration: no task's code is imported

    return task_names()


# ---- building and checking ----------------------------------------------------------------------------------
NON_CONFIG_KEYS = ("hydra",)  # composed alongside the job's config, not part of it


def load_config(cfg: Mapping[str, Any] | JobConfig) -> JobConfig:
    """The typed config of a composed, resolved job config; ConfigError (one line) for a bad value."""
    if isinstance(cfg, JobConfig):
        return cfg
    data = {k: v for k, v in cfg.items() if k not in NON_CONFIG_KEYS}
    job = _build(JobConfig, data, "")
    assert isinstance(job, JobConfig)
    _check_eraser_options(job.eraser)
    return job


def _build(cls: type[Section], data: Any, prefix: str) -> Section:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}={data!r} is not allowed: it must be a group of keys")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):  # type: ignore[arg-type]
        if f.name == "_extra":
            continue
        key = prefix + f.name
        if f.name in data:
            value = data[f.name]
        elif f.default is not dataclasses.MISSING:
            value = f.default
        elif f.default_factory is not dataclasses.MISSING:
            value = f.default_factory()
        else:
            raise ConfigError(f"{key} is missing: set it in its yaml or on the command line ({key}=...)")
        values[f.name] = _check(key, value, f.metadata)
    extra = {k: v for k, v in data.items() if k not in values}
    if extra and not cls.open:
        k = sorted(extra)[0]
        raise ConfigError(f"{prefix}{k}={extra[k]!r} is not allowed: unknown key; known: {', '.join(values)}")
    return cls(**values, _extra=extra)


def _check(key: str, value: Any, meta: Mapping[str, Any]) -> Any:
    kind = meta.get("kind")
    if value is None:
        if meta.get("optional") or (meta.get("choices") and None in meta["choices"]):
            return None
        raise ConfigError(f"{key}=null is not allowed: {key} must be {meta.get('allowed') or 'set'}")
    if isinstance(kind, type) and issubclass(kind, Section):
        return _build(kind, value, key + ".")
    if meta.get("choices"):
        if not any(value == c and type(value) is type(c) for c in meta["choices"]):
            shown = ", ".join(json.dumps(c) if isinstance(c, bool) else str(c) for c in meta["choices"])
            raise ConfigError(f"{key}={value!r} is not allowed: {key} must be one of {shown}")
        return value
    if kind is not None:
        kinds = kind if isinstance(kind, tuple) else (kind,)
        bad_bool = isinstance(value, bool) and bool not in kinds
        if bad_bool or not isinstance(value, kinds):
            allowed = meta.get("allowed") or _kind_name(kinds)
            raise ConfigError(f"{key}={value!r} is not allowed: {key} must be {allowed}")
    check = meta.get("check")
    if check is not None and not check(value):
        raise ConfigError(f"{key}={value!r} is not allowed: {key} must be {meta.get('allowed') or 'another value'}")
    return value


def _kind_name(kinds: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "a group of keys"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def _check_eraser_options(eraser: EraserConfig) -> None:
    from erasure import default_options

    known = default_options(eraser.name)
    for k in eraser.options:
        if k not in known:
            raise ConfigError(f"eraser.options.{k} is not allowed: not an option of eraser {eraser.name}; known: "
                              f"{', '.join(sorted(known))}")


# ---- the job hash -------------------------------------------------------------------------------------------
HASH_VERSION = 2  # 1: every key but a fixed list of groups (before the typed configs); 2: declared per field


def semantic(cfg: Mapping[str, Any], fill_defaults: bool = True) -> dict[str, Any]:
    """The part of a (resolved) job config that determines its numbers: what the job hash covers.

    Tolerant of bad values (used to name directories before the config is checked). Declared fields the config
    lacks count with their defaults (so a plain dict and its typed config hash alike), unless `fill_defaults` is
    false (reading a result written before the field existed). A task whose registry entry lists `uses` (e.g.
    Gradient Starvation tasks) is hashed on those groups only, so unrelated defaults do not move its results.
    """
    data = {k: v for k, v in cfg.items() if k not in NON_CONFIG_KEYS}
    out = _semantic(JobConfig, data, fill_defaults)
    uses = _task_uses(str(data.get("task", "mdl")))
    if uses is not None:
        out = {k: v for k, v in out.items() if k in ("task", "seed", *uses)}
    eraser = out.get("eraser")
    if isinstance(eraser, dict) and isinstance(eraser.get("options"), dict):
        eraser["options"] = _data_options(str(eraser.get("name")), eraser["options"])
    return out


def _semantic(cls: type[Section], data: Mapping[str, Any], fill_defaults: bool) -> dict[str, Any]:
    fields = {f.name: f for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    out: dict[str, Any] = {}
    items = dict(data)
    if fill_defaults:
        for name, f in fields.items():
            if name not in items and name != "_extra" and f.default is not dataclasses.MISSING:
                items[name] = f.default
    for k, v in items.items():
        f = fields.get(k)
        if f is None:
            out[k] = _plain(v)  # an extra: semantic
            continue
        if not f.metadata.get("hash", True):
            continue
        kind = f.metadata.get("kind")
        if isinstance(kind, type) and issubclass(kind, Section) and isinstance(v, Mapping):
            out[k] = _semantic(kind, v, fill_defaults)
        else:
            out[k] = _plain(v)
    return out


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


def _data_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    from erasure.registry import ERASERS

    if name not in ERASERS:
        return dict(options)
    runtime = set(ERASERS.meta(name).get("runtime_options", ()))
    return {k: v for k, v in options.items() if k not in runtime}


def _task_uses(task: str) -> tuple[str, ...] | None:
    from training.app.tasks import task_uses  # the static declaration: no task's code is imported

    return task_uses(task)


def _digest(obj: Any, length: int) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def config_hash(cfg: Mapping[str, Any]) -> str:
    """The job's identity in result.json / progress.json (16 hex digits)."""
    return _digest(semantic(cfg), 16)


def cell_hash(cfg: Mapping[str, Any]) -> str:
    """8 hex digits naming the job directory: the semantic config without the seed (seeds of one
    configuration sit side by side: <...>/c<cell hash>/seed<seed>)."""
    return _digest({k: v for k, v in semantic(cfg).items() if k != "seed"}, 8)
