"""Typed job configs: one frozen dataclass per config group, checked right after Hydra composes the config.

`load_config(resolved)` turns the composed config into a `JobConfig` or raises `ConfigError` with one line naming
the key, the value and what is allowed. The job reads attributes (`cfg.mdl.patience`); every default is written
once, here or in the group's yaml. A group member's own options (a dataset's `n`, an MLP's `activation`, SD's
`lam`, a task's `gs.*`) are a small dataclass declared next to the module that registers it (`options=` in its
registry entry): it validates them, unknown keys are refused, and `cfg.arch.options.activation` reads them typed.
An eraser's options are its fitter's keyword arguments, checked against their annotations.

Which keys enter the job hash (and so the job directory) is declared next to the field: `hash=False` for what
only says where things go or how fast or visibly they run. Eraser options that do not change the erased data are
declared by the eraser itself (`runtime_options` in its registry entry).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from training.app.typed import (
    NAME_ALLOWED,
    SUBPATH_ALLOWED,
    ConfigError,
    auto_or_positive_int,
    build_options,
    check_typed,
    flag,
    kind_name,
    nonneg_int,
    one_of,
    path_part,
    path_refusal,
    positive_float,
    positive_int,
    spec,
    unit_interval,
)

if TYPE_CHECKING:
    from erasure.registry import Registry


def _device_name(v: str) -> bool:
    kind, _, index = v.partition(":")
    return v in ("auto", "cpu", "cuda") or (kind == "cuda" and index.isdigit())


# ---- the sections -------------------------------------------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class Section:
    """A config group: frozen, typed fields read as attributes. `to_dict()` gives it back as composed (what
    result.json stores and the job hash covers)."""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name.startswith("_") or f.metadata.get("typed_view"):
                continue
            v = getattr(self, f.name)
            if f.metadata.get("omit_empty") and not v:
                continue  # as composed: only the groups that carry it (dataset.paper_lr)
            out[f.name] = v.to_dict() if isinstance(v, Section) else _plain(v)
        return {**out, **_plain(self._given_options())}

    def _given_options(self) -> dict[str, Any]:
        return {}


def _options_view() -> Any:
    """The group member's own options (a dataclass declared next to the module that registers it), typed."""
    return field(default=None, compare=False, repr=False, metadata={"typed_view": True, "hash": False})


def _given() -> Any:
    return field(default_factory=dict, repr=False, metadata={"hash": True})


@dataclass(frozen=True, kw_only=True)
class OptionsSection(Section):
    """A group whose members declare their own options (flat keys in the yaml, e.g. `arch.activation`): the
    registered options dataclass validates them and `.options` reads them typed."""

    options: Any = _options_view()
    _options: dict[str, Any] = _given()  # the option keys as composed

    def _given_options(self) -> dict[str, Any]:
        return dict(self._options)


@dataclass(frozen=True, kw_only=True)
class DatasetConfig(OptionsSection):
    name: str = spec(kind=str, check=lambda v: v in _datasets(), allowed="a registered dataset")
    tag: str = path_part(hash=False)  # names the job directory
    augment: bool = flag(False)
    zscore: bool = flag(False)
    limit: int | None = positive_int(None, optional=True)
    zscore_order: str = one_of("before", "before", "after")  # standardise before erasure (ours) or after (paper code)
    root: str | None = spec(None, kind=str, optional=True, hash=False)  # where the files are, not what they are
    download: bool = flag(True, hash=False)
    # the paper's lr per arch: a table conf/optim interpolates into optim.lr (hashed itself), so not hashed
    paper_lr: dict[str, Any] = spec(default_factory=dict, kind=dict, omit_empty=True, hash=False)
    permute_labels: bool = spec(kind=bool, allowed="true or false")  # default: conf/config.yaml


FIT_ON = ("all", "self", "holdout", "oracle")  # eraser.fit_on (INTERFACE: how an eraser is fitted)


@dataclass(frozen=True, kw_only=True)
class EraserConfig(Section):
    """An eraser and how it is fitted; the fitting keys' defaults are in conf/config.yaml."""

    name: str = spec(kind=str, check=lambda v: v in _erasers(), allowed="a registered eraser")
    options: dict[str, Any] = spec(default_factory=dict, kind=dict)  # the fitter's keyword options (checked)
    fit_on: str = spec(choices=FIT_ON)
    fit_source: str = spec(choices=("split", "pool"))
    fit_fraction: float = spec(kind=(int, float), check=lambda v: 0 < v < 1, allowed="a number in (0, 1)")
    repeat: int = spec(kind=int, check=lambda v: v >= 0, allowed="an integer ≥ 0")
    n_fit: int | None = positive_int(None, optional=True)
    after_augment: bool = spec(kind=bool, allowed="true or false")


def fit_keys_used(fit_on: Any, fit_source: Any) -> tuple[str, ...]:
    """The eraser fitting keys a mode reads (conf/config.yaml); the others do not enter the job hash."""
    if fit_on == "oracle":
        return ("n_fit",)
    if fit_on in ("self", "holdout"):
        return ("fit_source", "n_fit", "repeat") if fit_source == "pool" else ("fit_source", "fit_fraction", "repeat")
    return ()


FIT_KEYS = ("fit_source", "fit_fraction", "repeat", "n_fit")


@dataclass(frozen=True, kw_only=True)
class ArchConfig(OptionsSection):
    name: str = spec(kind=str, check=lambda v: v in _archs(), allowed="a registered architecture")
    tag: str = path_part(hash=False)
    width: int = positive_int()
    depth: int = positive_int()
    base_width: int | None = positive_int(None, optional=True)
    base_depth: int = positive_int(2)
    parametrization: str = one_of("mup", "mup", "sp")
    # read by conf/optim (lr per eraser family): a table interpolated into optim.* (hashed themselves), so not hashed
    paper_optim: dict[str, Any] = spec(default_factory=dict, kind=dict, hash=False)


@dataclass(frozen=True, kw_only=True)
class OptimConfig(Section):
    lr: float = positive_float()
    beta1: float = unit_interval()
    beta2: float = unit_interval(0.999)
    weight_decay: float = spec(0.0, kind=(int, float), check=lambda v: v >= 0 and math.isfinite(v),
                               allowed="a finite number ≥ 0")
    warmup_steps: int = nonneg_int(0)
    batch_size: int = positive_int(128)
    depth_lr_rule: bool = flag(True)


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


@dataclass(frozen=True, kw_only=True)
class RegularizerConfig(OptionsSection):
    name: str = spec(kind=str, check=lambda v: v in _regularizers(), allowed="a registered regularizer")


@dataclass(frozen=True, kw_only=True)
class LoggerConfig(Section):
    name: str = one_of("none", "none", "wandb")
    project: str = spec("erasure-mdl", kind=str)
    entity: str | None = spec(None, kind=str, optional=True)
    mode: str = one_of("offline", "offline", "online", "disabled")


@dataclass(frozen=True, kw_only=True)
class TrainingConfig(Section):
    """Speed only: every option gives the numbers of one-at-a-time training (tests/test_vectorized.py)."""

    parallel_models: Any = auto_or_positive_int()
    engine: str = one_of("auto", "auto", "loop", "stacked")
    workers: Any = auto_or_positive_int()
    storage: str = one_of("auto", "auto", "float32", "float16", "uint8")
    compile: Any = one_of(False, False, True, "default", "reduce-overhead", "max-autotune")
    fused_optimizer: Any = one_of(False, False, True, "numba", "compile", "eager")
    # hydra/launcher=packed: at most this many jobs (of one cell, differing in seed) run in one process (null: all)
    pack_size: int | None = positive_int(None, optional=True)


@dataclass(frozen=True, kw_only=True)
class PathsConfig(Section):
    out_dir: str = spec("outputs", kind=str)
    data_dir: str = spec("data", kind=str)
    cache_dir: str = spec("outputs/cache", kind=str)
    job_dir: str = spec("outputs/job", kind=str)
    legacy_job_dir: str | None = spec(None, kind=str, optional=True)
    # the parts of a job's path built from config: checked by typed.path_refusal, as dataset.tag and arch.tag
    cell: str | None = spec(None, kind=str, optional=True, check=lambda v: path_refusal(v, single=True) is None,
                            allowed=NAME_ALLOWED)
    job_subdir: str | None = spec(None, kind=str, optional=True, check=lambda v: path_refusal(v, single=False) is None,
                                  allowed=SUBPATH_ALLOWED)
    by_task: dict[str, Any] = spec(default_factory=dict, kind=dict, omit_empty=True,  # a job_subdir per task
                                   check=lambda v: all(isinstance(p, str) and path_refusal(p, single=False) is None
                                                       for p in v.values()),
                                   allowed=f"a group of task: job_subdir, each {SUBPATH_ALLOWED}")


@dataclass(frozen=True, kw_only=True)
class JobConfig(Section):
    task: str = spec("mdl", kind=str, check=lambda v: v in _tasks(), allowed="a registered task")
    seed: int = nonneg_int(0)
    # where the job runs checks that the device is there (training/engine/devices.py), not the schema: a sweep for
    # GPUs may be composed on a login node without one
    device: str = spec("auto", kind=str, check=_device_name, allowed="auto, cpu, cuda or cuda:N (N a GPU index)",
                       hash=False)
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
    logger: LoggerConfig = spec(kind=LoggerConfig, hash=False)
    paths: PathsConfig = spec(kind=PathsConfig, hash=False)
    task_options: Any = _options_view()  # the task's own group (gs), typed by the task's registry entry
    _task_group: dict[str, Any] = _given()  # that group as composed, under its name

    def _given_options(self) -> dict[str, Any]:
        return dict(self._task_group)


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


def _member_options(kind: str, name: str) -> type[Any] | None:
    """The options dataclass a dataset, architecture or regularizer declares in its registry entry (None: it
    takes no options of its own)."""
    from models.registry import ARCHS
    from training.data.registry import DATASETS
    from training.engine.regularizers import REGULARIZERS

    reg: Registry[Any] = DATASETS if kind == "dataset" else ARCHS if kind == "arch" else REGULARIZERS
    return reg.meta(name).get("options")


def _task_groups() -> set[str]:
    """The groups tasks read of their own (`gs`): what their declared `uses` names beyond the job's groups."""
    from training.app.tasks import DECLARED

    own = {f.name for f in dataclasses.fields(JobConfig)}
    groups = {entry.partition(".")[0] for uses in DECLARED.values() for entry in (uses or ())}
    return groups - own


def _task_options(task: str) -> tuple[str | None, type[Any] | None]:
    """The config group a task reads of its own (`gs`) and the dataclass that declares it, from the task's
    registry entry; (None, None) where its implementation is not imported (hashing a stored config in the core:
    the CLI imports every task, so a job's config is always checked)."""
    from training.app.tasks import TASKS

    if task not in TASKS:
        return None, None
    meta = TASKS.meta(task)
    return meta.get("group"), meta.get("options")


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
    _check_task_reads(job)
    _check_inside_out_dir(job)
    _check_storage(job)
    _check_fit_data(job)
    return job


def _check_fit_data(job: JobConfig) -> None:
    """The fitting modes that need a kind of dataset: oracle a generator (fresh draws), pool a `dataset.limit`."""
    from training.data.registry import DATASETS

    e, name = job.eraser, job.dataset.name
    if e.fit_on == "oracle" and not DATASETS.meta(name).get("generator"):
        generators = ", ".join(n for n in DATASETS.names() if DATASETS.meta(n).get("generator"))
        raise ConfigError(f"eraser.fit_on=oracle is not allowed: dataset {name} is not a generator (fresh draws need "
                          f"one: {generators}); use eraser.fit_on=holdout or all")
    if e.fit_on == "oracle" and job.dataset.permute_labels:
        raise ConfigError("dataset.permute_labels=true is not allowed with eraser.fit_on=oracle (the fresh draws keep "
                          "their true labels, so the null would fit one law and code another); use "
                          "eraser.fit_on=holdout or all for the null")
    if e.fit_on in ("self", "holdout") and e.fit_source == "pool" and job.dataset.limit is None:
        raise ConfigError("eraser.fit_source=pool is not allowed: the pool is the rows beyond dataset.limit, which is "
                          "not set; set dataset.limit (e.g. dataset.limit=20000) or use eraser.fit_source=split")


def _check_inside_out_dir(job: JobConfig) -> None:
    """A job directory built under paths.out_dir (as conf/paths/default.yaml builds it) must stay there, whatever
    its parts resolved to (each part is checked by typed.path_refusal; this is the backstop)."""
    p = job.paths
    out = os.path.abspath(p.out_dir)
    for key, path in (("paths.job_dir", p.job_dir), ("paths.legacy_job_dir", p.legacy_job_dir)):
        if path is None or not path.startswith(p.out_dir.rstrip("/") + "/"):
            continue  # given explicitly, not built from paths.out_dir
        norm = os.path.abspath(path)
        if os.path.commonpath([out, norm]) != out or norm == out:
            raise ConfigError(f"{key}={path!r} is not allowed: it resolves to {norm}, outside paths.out_dir={out}; "
                              "the parts built from config (paths.cell, paths.job_subdir, tags) must stay inside it")


# Keys read only when another key has a given value: (key, that key, its value, the one value accepted otherwise).
READ_ONLY_WITH: tuple[tuple[str, str, Any, Any], ...] = (
    ("dataset.zscore_order", "dataset.zscore", True, "before"),
    ("arch.swiglu_ratio", "arch.activation", "swiglu", None),
    ("mdl.eval_every_steps", "mdl.full_run", True, None),  # MDL: the full run's validation cadence only
)


def _task_reads(task: str, key: str) -> bool:
    """Whether `key` enters task `task`'s hash (its declared `uses`: every group, a group, or the key itself)."""
    uses = _task_uses(task)
    return uses is None or key in uses or key.split(".", 1)[0] in uses


def _value(job: JobConfig, key: str) -> Any:
    group, name = key.split(".", 1)
    return getattr(job, group).to_dict().get(name, dataclasses.MISSING)


def _shown(v: Any) -> str:
    """A value as it is written on the command line (true, null, swiglu)."""
    return v if isinstance(v, str) else json.dumps(v)


def _same(a: Any, b: Any) -> bool:
    return a == b and type(a) is type(b)


def _check_task_reads(job: JobConfig) -> None:
    """A hashed key the job's task does not read (training/app/tasks.py FIXED), or that is read only with another
    key's value (READ_ONLY_WITH), must keep the one value it accepts: otherwise it would change the job's hash (and
    directory) but not its numbers."""
    from training.app.tasks import fixed_keys

    for key, accepted in fixed_keys(job.task).items():
        value = _value(job, key)
        if value is not dataclasses.MISSING and not _same(value, accepted):
            raise ConfigError(f"{key}={_shown(value)} is not allowed with task={job.task}: the task does not read "
                              f"{key} (it would change the job's hash, not its numbers); leave it at "
                              f"{_shown(accepted)} or use another task")
    for key, when, needed, accepted in READ_ONLY_WITH:
        if not (_task_reads(job.task, key) and _task_reads(job.task, when)):
            continue  # e.g. gs_erased_eval reads mdl.eval_every_steps and has no full run
        value = _value(job, key)
        if value is not dataclasses.MISSING and not _same(value, accepted) and not _same(_value(job, when), needed):
            raise ConfigError(f"{key}={_shown(value)} is not allowed: {key} is read only with {when}={_shown(needed)} "
                              f"(here {_shown(_value(job, when))}); leave it at {_shown(accepted)} or set "
                              f"{when}={_shown(needed)}")


def _check_storage(job: JobConfig) -> None:
    """`training.storage=uint8|float16` keeps the data exactly or not at all (training/engine/batches.py): the data of
    an eraser that maps it to arbitrary floats (LEACE, QLEACE, random, ...) or of `dataset.zscore` never fits, so such
    a job is refused up front instead of after its erasure. (Control data and gradient erasure's quantized edits may
    fit: the job checks the data itself.)"""
    storage = job.training.storage
    if storage not in ("uint8", "float16"):
        return
    from erasure.registry import ERASERS

    meta = ERASERS.meta(job.eraser.name)
    if job.dataset.zscore:
        why = "with dataset.zscore=true (standardised data"
    elif meta["kind"] == "map" and meta["family"] != "control":
        why = f"with eraser={job.eraser.name} (its erased data"
    else:
        return
    raise ConfigError(f"training.storage={storage!r} is not allowed: training.storage must be auto or float32 {why} is "
                      f"not exactly representable as {storage}, so storing it so would change the numbers; auto "
                      "keeps the smallest exact storage)")


def load_section(cls: type[S], data: Mapping[str, Any], prefix: str = "") -> S:
    """One group's typed config from its composed mapping (e.g. `load_section(ArchConfig, arch_yaml)`)."""
    section = _build(cls, data, prefix)
    assert isinstance(section, cls)
    return section


S = TypeVar("S", bound=Section)
GROUPS: dict[str, type[Section]] = {"dataset": DatasetConfig, "eraser": EraserConfig, "arch": ArchConfig,
                                    "optim": OptimConfig, "mdl": MdlConfig, "regularizer": RegularizerConfig,
                                    "logger": LoggerConfig, "paths": PathsConfig}


def _build(cls: type[Section], data: Any, prefix: str) -> Section:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}={data!r} is not allowed: it must be a group of keys")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or f.metadata.get("typed_view"):
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
    rest = {k: v for k, v in data.items() if k not in values}
    if cls is EraserConfig:
        _check_eraser_options(values["name"], values["options"])
        _check_eraser_fitting(values)
    if issubclass(cls, OptionsSection):
        kind, owner = _options_owner(cls)
        options_cls = _member_options(kind, values["name"])
        view = build_options(options_cls, rest, prefix, known=tuple(values), owner=f"{owner} {values['name']}")
        return cls(**values, options=view, _options=rest)
    if cls is JobConfig:
        return cls(**values, **_task_group(str(values["task"]), rest))
    if rest:
        k = sorted(rest)[0]
        raise ConfigError(f"{prefix}{k}={rest[k]!r} is not allowed: unknown key; known: {', '.join(values)}")
    return cls(**values)


def _options_owner(cls: type[OptionsSection]) -> tuple[str, str]:
    return {DatasetConfig: ("dataset", "dataset"), ArchConfig: ("arch", "architecture"),
            RegularizerConfig: ("regularizer", "regularizer")}[cls]


def _task_group(task: str, rest: Mapping[str, Any]) -> dict[str, Any]:
    """The task's own group (e.g. `gs` for the Gradient Starvation tasks), checked by its options dataclass."""
    group, options_cls = _task_options(task)
    others = _task_groups()  # a sweep over tasks (gs_sd_erasure) composes every task's group into each job
    unknown = sorted(k for k in rest if k != group and k not in others)
    if unknown:
        raise ConfigError(f"{unknown[0]}={rest[unknown[0]]!r} is not allowed: unknown key (task {task} reads "
                          f"{group or 'no group of its own'})")
    view = None
    if group is not None and options_cls is not None:
        view = build_options(options_cls, rest.get(group, {}), f"{group}.", owner=f"task {task}")
    return {"task_options": view, "_task_group": dict(rest)}


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
            allowed = meta.get("allowed") or kind_name(kinds)
            raise ConfigError(f"{key}={value!r} is not allowed: {key} must be {allowed}")
    check = meta.get("check")
    if check is not None and not check(value):
        raise ConfigError(f"{key}={value!r} is not allowed: {key} must be {meta.get('allowed') or 'another value'}")
    return value


CONF_DIR = Path(__file__).resolve().parents[2] / "conf"


def group_config(group: str, name: str, **overrides: Any) -> Any:
    """One config group as conf/<group>/<name>.yaml composes it, with overrides, typed and checked (library use
    and tests: `build_model(group_config("arch", "mlp", width=64), ...)`)."""
    from omegaconf import DictConfig, OmegaConf

    from training.app.resolvers import resolved_dict

    def compose(member: str) -> Any:
        node = OmegaConf.load(CONF_DIR / group / f"{member}.yaml")
        assert isinstance(node, DictConfig)
        bases = [compose(str(d)) for d in node.pop("defaults", []) if d != "_self_"]
        return OmegaConf.merge(*bases, node)

    root = OmegaConf.load(CONF_DIR / "config.yaml")  # keys every member of the group has (eraser.fit_on, ...)
    assert isinstance(root, DictConfig)
    shared = root[group] if group in root else {}
    node = OmegaConf.merge(shared, compose(name), overrides)
    return load_section(GROUPS[group], resolved_dict(node), f"{group}.")


def _check_eraser_options(name: str, options: Mapping[str, Any]) -> None:
    """Eraser options are the fitter's keyword arguments: checked against their annotations (or, for an eraser
    that declares `defaults`, against the defaults' types)."""
    from erasure import default_options
    from erasure.registry import ERASERS

    known = default_options(name)
    for k in options:
        if k not in known:
            raise ConfigError(f"eraser.options.{k} is not allowed: not an option of eraser {name}; known: "
                              f"{', '.join(sorted(known))}")
    hints = _eraser_hints(ERASERS.get(name))
    for k, v in options.items():
        tp = hints.get(k)
        if tp is None and known[k] is not None:
            tp = float if isinstance(known[k], float) else type(known[k])
        if tp is not None:
            check_typed(f"eraser.options.{k}", v, tp)


def _check_eraser_fitting(values: Mapping[str, Any]) -> None:
    from erasure.registry import ERASERS

    name, fit_on = values["name"], values["fit_on"]
    meta = ERASERS.meta(name)
    if meta["kind"] == "edit" and fit_on != "all":
        raise ConfigError(f"eraser.fit_on={fit_on} is not allowed: eraser {name} edits each sample and has no map "
                          "to apply to other data; use eraser.fit_on=all")
    if fit_on == "self" and values["fit_source"] == "pool":
        raise ConfigError("eraser.fit_source=pool is not allowed with eraser.fit_on=self: self fits on the coded rows, "
                          "which pool does not shrink (that is eraser.fit_on=all); use eraser.fit_source=split")
    if fit_on == "oracle" and "from_moments" not in meta:
        able = ", ".join(e.name for e in ERASERS if "from_moments" in e.meta)
        raise ConfigError(f"eraser.fit_on=oracle is not allowed: eraser {name} cannot be fitted from streamed "
                          f"moments; use one of {able}")
    if fit_on == "oracle" and values["after_augment"]:
        raise ConfigError("eraser.after_augment=true is not allowed with eraser.fit_on=oracle (generator data is "
                          "not augmented); use eraser.after_augment=false")


def _eraser_hints(fitter: Any) -> dict[str, Any]:
    try:
        return typing.get_type_hints(fitter)
    except (NameError, TypeError):  # an annotation that does not resolve: checked by name only
        return {}


# ---- the job hash -------------------------------------------------------------------------------------------
HASH_VERSION = 2  # 1: every key but a fixed list of groups (before the typed configs); 2: declared per field
# The numerics version: bumped by every change that alters a job's numbers (README, "Numerics versions"). It enters
# the job hash, so results of older numerics are never reused; result.json records it (absent: 1).
# 1: before the version existed. 2: optim.beta2 reaches the optimizer (it was always 0.999); gs_erased_eval stops
# with mdl's step-aware rule. 3: QLEACE coupling noise applied to rows the eraser was not fitted on (holdout, the
# gs_erased_eval validation/test rows) is drawn i.i.d. N(0, R_k), not with exact moments on those rows.
NUMERICS = 3


def semantic(cfg: Mapping[str, Any] | Section, fill_defaults: bool = True) -> dict[str, Any]:
    """The part of a (resolved) job config that determines its numbers: what the job hash covers.

    Tolerant of bad values (used to name directories before the config is checked). Declared fields the config
    lacks count with their defaults (so a plain dict and its typed config hash alike), unless `fill_defaults` is
    false (reading a result written before the field existed). A task whose registry entry lists `uses` (e.g.
    Gradient Starvation tasks) is hashed on those groups only, so unrelated defaults do not move its results.
    """
    plain = cfg.to_dict() if isinstance(cfg, Section) else cfg
    data = {k: v for k, v in plain.items() if k not in NON_CONFIG_KEYS}
    out = _semantic(JobConfig, data, fill_defaults)
    uses = _task_uses(str(data.get("task", "mdl")))
    if uses is not None:
        out = _only(out, ("task", "seed", *uses))
    eraser = out.get("eraser")
    if isinstance(eraser, dict) and isinstance(eraser.get("options"), dict):
        eraser["options"] = _data_options(str(eraser.get("name")), eraser["options"])
    if isinstance(eraser, dict) and "fit_on" in eraser:  # keys the fitting mode does not read: not hashed
        used = fit_keys_used(eraser["fit_on"], eraser.get("fit_source"))
        out["eraser"] = {k: v for k, v in eraser.items() if k not in FIT_KEYS or k in used}
    if isinstance(out.get("eraser"), dict) and not _batch_erasing(out["eraser"], out.get("dataset")):
        out["eraser"].pop("after_augment", None)  # nothing is erased per batch: the key changes nothing
    return out


def _batch_erasing(eraser: Mapping[str, Any], dataset: Any) -> bool:
    """Whether `eraser.after_augment` can change a job's numbers: not for an eraser that edits the dataset once (the
    job then ignores it) nor for the identity control, unless a z-score follows it per batch
    (`dataset.zscore_order=after`)."""
    from erasure.registry import ERASERS

    name = str(eraser.get("name"))
    if name not in ERASERS:
        return True
    meta = ERASERS.meta(name)
    if meta["kind"] == "edit":
        return False
    if meta["family"] != "control":
        return True
    return isinstance(dataset, Mapping) and bool(dataset.get("zscore")) and dataset.get("zscore_order") == "after"


def _only(out: Mapping[str, Any], uses: tuple[str, ...]) -> dict[str, Any]:
    """The part of a semantic config a task reads: whole groups (`dataset`) and single keys (`mdl.patience`)."""
    kept: dict[str, Any] = {k: v for k, v in out.items() if k in uses}
    for entry in uses:
        group, _, key = entry.partition(".")
        if key and isinstance(out.get(group), Mapping) and key in out[group]:
            kept.setdefault(group, {})[key] = out[group][key]
    return kept


def _semantic(cls: type[Section], data: Mapping[str, Any], fill_defaults: bool) -> dict[str, Any]:
    fields = {f.name: f for f in dataclasses.fields(cls)}
    out: dict[str, Any] = {}
    items = dict(data)
    if fill_defaults:
        for name, declared in fields.items():
            if name not in items and not name.startswith("_") and declared.default is not dataclasses.MISSING:
                items[name] = declared.default
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


def with_defaults(data: Mapping[str, Any], cls: type[Section] = JobConfig) -> dict[str, Any]:
    """A stored (or hand-written) config with the schema's default for every declared key it lacks, groups
    included: how reports read configs written before a key existed, with the one default the schema declares."""
    out = dict(data)
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or f.metadata.get("typed_view"):
            continue
        kind = f.metadata.get("kind")
        if f.name not in out and f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif isinstance(kind, type) and issubclass(kind, Section) and isinstance(out.get(f.name), Mapping):
            out[f.name] = with_defaults(out[f.name], kind)
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


def config_hash(cfg: Mapping[str, Any] | Section, numerics: int = NUMERICS) -> str:
    """The job's identity in result.json / progress.json (16 hex digits): its semantic config under a numerics
    version (a stored result's own, `numerics_version`, when rehashing it)."""
    return _digest({**semantic(cfg), "numerics": numerics}, 16)


def cell_hash(cfg: Mapping[str, Any] | Section) -> str:
    """8 hex digits naming the job directory: the semantic config without the seed, under this numerics version
    (seeds of one configuration sit side by side: <...>/c<cell hash>/seed<seed>)."""
    return _digest({**{k: v for k, v in semantic(cfg).items() if k != "seed"}, "numerics": NUMERICS}, 8)
