"""Building and checking the typed config: `load_config` turns a composed config into a `JobConfig` (or one
`ConfigError` line), `load_section` / `group_config` one group, with the cross-field checks (what a task reads,
storage, fitting data; an eraser's options and fitting modes: training/data/eraser_config.py)."""

from __future__ import annotations

import dataclasses
import errno
import json
import os
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import Any

from erasure.traits import eraser_traits
from training.app.sections import (
    GROUPS,
    NON_CONFIG_KEYS,
    ArchConfig,
    DatasetConfig,
    EraserConfig,
    JobConfig,
    OptionsSection,
    PathsConfig,
    RegularizerConfig,
    S,
    Section,
    _member_options,
)
from training.app.task_spec import TaskSpec
from training.app.typed import NAME_MAX, ConfigError, FieldSpec, field_spec, kind_name
from training.common.conf import group_yaml
from training.common.option_checks import build_options, shown
from training.data.eraser_config import check_eraser_fitting, check_eraser_options, check_fit_data
from training.engine.numerics import effective_precision


def same_numbers(data: Mapping[str, Any]) -> dict[str, Any]:
    """A config with the keys that cannot change a number on its device written as the job they are (its hash, its
    directory, its record): `training.precision=tf32` off CUDA is fp32 (training/engine/numerics.py)."""
    out = dict(data)
    training = out.get("training")
    if isinstance(training, Mapping) and "precision" in training:
        precision = effective_precision(training["precision"], out.get("device", "auto"))
        if precision != training["precision"]:
            out["training"] = {**training, "precision": precision}
    return out


def load_config(cfg: Mapping[str, Any] | JobConfig, spec: TaskSpec, others: Collection[str] = ()) -> JobConfig:
    """The typed config of a composed, resolved job config of task `spec`; ConfigError (one line) for a bad value.
    `others`: the groups other tasks read of their own (a sweep over tasks composes each into every job)."""
    if isinstance(cfg, JobConfig):
        if cfg.task_spec != spec:
            raise ValueError(f"a config of task {cfg.task} loaded as task {spec.name}")
        return cfg
    data = same_numbers({k: v for k, v in cfg.items() if k not in NON_CONFIG_KEYS})
    job = _build(JobConfig, data, "")
    assert isinstance(job, JobConfig)
    if job.task != spec.name:
        raise ConfigError(f"task={job.task} is not allowed here: this config is loaded as task {spec.name}")
    job = dataclasses.replace(job, task_spec=spec, **_task_group(spec, job._task_group, others))
    _check_task_reads(job)
    _check_inside_out_dir(job.paths)
    _check_storage(job.training.storage, job.eraser.name, job.dataset.zscore)
    e = job.eraser
    check_fit_data(e.fit_on, e.fit_source, e.n_fit, job.dataset, job.dataset.permute_labels)
    return job


def _check_inside_out_dir(p: PathsConfig) -> None:
    """A job directory built under paths.out_dir (as conf/paths/default.yaml builds it) must stay there, whatever
    its parts resolved to (each part is checked by typed.path_refusal; this is the backstop)."""
    out = os.path.abspath(p.out_dir)
    for key, given in (("paths.out_dir", p.out_dir), ("paths.job_dir", p.job_dir)):
        if given is not None and (long := [part for part in Path(given).parts if len(part.encode()) > NAME_MAX]):
            raise ConfigError(f"{key}={given[:60]!r}... is not allowed: its part {long[0][:40]!r}... is "
                              f"{len(long[0].encode())} bytes, over the file system's {NAME_MAX} (a tag, paths.cell "
                              "or paths.out_dir too long); shorten it")
    for above in (Path(out), *Path(out).parents):
        if above.is_symlink() and not above.exists():
            try:
                above.resolve(strict=True)
                why = "which does not exist; create it"
            except RuntimeError:  # Python < 3.13 names a loop so
                why = "a loop of symbolic links that never reaches a directory; fix the links"
            except OSError as err:
                why = ("a loop of symbolic links that never reaches a directory; fix the links"
                       if err.errno == errno.ELOOP else "which does not exist; create it")
            raise ConfigError(f"paths.out_dir={p.out_dir} is not allowed: {above} is a symbolic link to "
                              f"{os.readlink(above)}, {why} or point paths.out_dir elsewhere")
        if above.exists() and not above.is_dir():
            raise ConfigError(f"paths.out_dir={p.out_dir} is not allowed: {above} is a file, not a directory; "
                              "point paths.out_dir at a directory (or a path that does not exist yet)")
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
    ("optim.schedule", "optim.name", "adamw", "constant"),  # schedule-free AdamW has no schedule but its warm-up
    ("optim.warmup_steps", "optim.name", "schedulefree", 0),  # schedule-free's warm-up: AdamW has none
    ("mdl.split", "mdl.protocol", "paper", "once"),  # a prequential code sends each row once, in one order
)
# Keys a dataset declares but a task does not read: (key, dataset, the one value accepted, the tasks (None: all)).
UNREAD_BY_DATASET: tuple[tuple[str, str, Any, tuple[str, ...] | None], ...] = (
    ("dataset.cov_gap", "mixture", 0.0, None),  # its class covariance comes from dataset.separation
    ("dataset.n_test", "two_moons", 1000, ("mdl",)),  # the test draw of task=gs_two_moons; MDL codes the n rows
    # the test environment of task=gs_colored_mnist; the other tasks read the pooled training environments
    ("dataset.test_color_flip", "colored_mnist", 0.9, ("mdl", "gs_erased_eval")),
)


def _task_reads(spec: TaskSpec, key: str) -> bool:
    """Whether `key` enters task `spec`'s hash (its declared `uses`: every group, a group, or the key itself)."""
    uses = spec.uses
    return uses is None or key in uses or key.split(".", 1)[0] in uses


def _same(a: Any, b: Any) -> bool:
    return a == b and type(a) is type(b)


def _check_task_reads(job: JobConfig) -> None:
    """A hashed key the job's task does not read (its declaration's `fixed`), or that is read only with another
    key's value (READ_ONLY_WITH), must keep the one value it accepts: otherwise it would change the job's hash (and
    directory) but not its numbers. Then what the task itself refuses (`Task.refusal`)."""
    spec = job.task_spec

    def _value(key: str) -> Any:  # the value of a key (group.name) as composed
        group, name = key.split(".", 1)
        return getattr(job, group).to_dict().get(name, dataclasses.MISSING)

    for key, accepted in spec.fixed.items():
        value = _value(key)
        if value is not dataclasses.MISSING and not _same(value, accepted):
            raise ConfigError(f"{key}={shown(value)} is not allowed with task={job.task}: the task does not read "
                              f"{key} (it would change the job's hash, not its numbers); leave it at "
                              f"{shown(accepted)} or use another task")
    for key, when, needed, accepted in READ_ONLY_WITH:
        if not (_task_reads(spec, key) and _task_reads(spec, when)):
            continue  # e.g. gs_erased_eval reads mdl.eval_every_steps and has no full run
        value = _value(key)
        if value is not dataclasses.MISSING and not _same(value, accepted) and not _same(_value(when), needed):
            raise ConfigError(f"{key}={shown(value)} is not allowed: {key} is read only with {when}={shown(needed)} "
                              f"(here {shown(_value(when))}); leave it at {shown(accepted)} or set "
                              f"{when}={shown(needed)}")
    for key, dataset, accepted, tasks in UNREAD_BY_DATASET:
        value = _value(key)
        if (job.dataset.name == dataset and (tasks is None or job.task in tasks) and value is not dataclasses.MISSING
                and value != accepted):
            who = f"dataset={dataset}" + (f" with task={job.task}" if tasks is not None else "")
            raise ConfigError(f"{key}={shown(value)} is not allowed with {who}: {key} is not read there (it "
                              f"would change the job's hash, not its numbers); leave it at {shown(accepted)}")
    if spec.refusal is not None and (refusal := spec.refusal(job)) is not None:
        raise ConfigError(refusal)


def _check_storage(storage: str, eraser: str, zscore: bool) -> None:
    """`training.storage=uint8|float16` keeps the data exactly or not at all: the data of an eraser that maps it to
    arbitrary floats (LEACE, QLEACE, ...) or of `dataset.zscore` never fits, so such a job is refused up front (control
    data and gradient erasure's quantized edits may fit: the job checks the data itself)."""
    if storage not in ("uint8", "float16"):
        return
    traits = eraser_traits(eraser)
    if zscore:
        why = "with dataset.zscore=true (standardised data"
    elif traits.has_map and not traits.identity:
        why = f"with eraser={eraser} (its erased data"
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


def _build(cls: type[Section], data: Any, prefix: str) -> Section:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{prefix.rstrip('.') or 'config'}={data!r} is not allowed: it must be a group of keys")
    values: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or field_spec(f).typed_view:
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
        values[f.name] = _check(key, value, field_spec(f))
    rest = {k: v for k, v in data.items() if k not in values}
    if cls is EraserConfig:
        check_eraser_options(values["name"], values["options"])
        check_eraser_fitting(values)
    if issubclass(cls, OptionsSection):
        kind, owner = {DatasetConfig: ("dataset", "dataset"), ArchConfig: ("arch", "architecture"),
                       RegularizerConfig: ("regularizer", "regularizer")}[cls]
        options_cls = _member_options(kind, values["name"])
        view = build_options(options_cls, rest, prefix, known=tuple(values), owner=f"{owner} {values['name']}")
        return cls(**values, options=view, _options=rest)
    if cls is JobConfig:
        return cls(**values, _task_group=dict(rest))  # checked by the task's options (load_config)
    if rest:
        k = sorted(rest)[0]
        raise ConfigError(f"{prefix}{k}={rest[k]!r} is not allowed: unknown key; known: {', '.join(values)}")
    return cls(**values)


def _task_group(spec: TaskSpec, rest: Mapping[str, Any], others: Collection[str]) -> dict[str, Any]:
    """The task's own group (e.g. `gs` for the Gradient Starvation tasks), checked by its options dataclass."""
    group, options_cls, task = spec.group, spec.options, spec.name
    unknown = sorted(k for k in rest if k != group and k not in others)
    if unknown:
        raise ConfigError(f"{unknown[0]}={rest[unknown[0]]!r} is not allowed: unknown key (task {task} reads "
                          f"{group or 'no group of its own'})")
    view = None
    if group is not None and options_cls is not None:
        view = build_options(options_cls, rest.get(group, {}), f"{group}.", owner=f"task {task}")
    return {"task_options": view, "_task_group": dict(rest)}


def _check(key: str, value: Any, declared: FieldSpec) -> Any:
    kind, choices = declared.kind, declared.choices
    if value is None:
        if declared.optional or (choices and None in choices):
            return None
        raise ConfigError(f"{key}=null is not allowed: {key} must be {declared.describe('set')}")
    if isinstance(kind, type) and issubclass(kind, Section):
        return _build(kind, value, key + ".")
    if choices:
        if not any(value == c and type(value) is type(c) for c in choices):
            shown = ", ".join(json.dumps(c) if isinstance(c, bool) else str(c) for c in choices)
            raise ConfigError(f"{key}={value!r} is not allowed: {key} must be one of {shown}")
        return value
    if kind is not None:
        kinds = kind if isinstance(kind, tuple) else (kind,)
        bad_bool = isinstance(value, bool) and bool not in kinds
        if bad_bool or not isinstance(value, kinds):
            raise ConfigError(f"{key}={value!r} is not allowed: {key} must be {declared.describe(kind_name(kinds))}")
    if declared.check is not None and not declared.check(value):
        raise ConfigError(f"{key}={value!r} is not allowed: {key} must be {declared.describe('another value')}")
    return value


def group_config(group: str, name: str, **overrides: Any) -> Any:
    """One config group as conf/<group>/<name>.yaml composes it, with overrides, typed and checked (library use
    and tests: `build_model(group_config("arch", "mlp", width=64), ...)`)."""
    return load_section(GROUPS[group], group_yaml(group, name, **overrides), f"{group}.")
