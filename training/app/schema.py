"""Typed job configs: one frozen dataclass per config group, checked right after Hydra composes the config.

`load_config(resolved)` turns the composed config into a `JobConfig` or raises `ConfigError` with one line naming
the key, the value and what is allowed; the job reads attributes (`cfg.mdl.patience`), every default written once,
here or in the group's yaml. A group member's own options (a dataset's `n`, an MLP's `activation`, a task's `gs.*`)
are a small dataclass declared where it registers (`options=` in its registry entry), which validates them and reads
them typed (`cfg.arch.options.activation`); an eraser's options are the fields of its options dataclass
(erasure/traits.py). Which keys enter the job hash (and so the job directory) is declared next to the field
(`hash=False`: where things go, how fast or visibly they run), and by an eraser for its options (`runtime_options`).
The modules: training/app/sections.py (the dataclasses), training/app/loading.py (`load_config`), this one (the job
hash: `semantic`, `config_hash`, `cell_hash`, `NUMERICS`); every name is imported from here.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from training.app.loading import group_config, load_config, load_section, same_numbers
from training.app.sections import (
    FIT_ON,
    NON_CONFIG_KEYS,
    ArchConfig,
    DatasetConfig,
    EraserConfig,
    JobConfig,
    LoggerConfig,
    MdlConfig,
    OptimConfig,
    OptionsSection,
    PathsConfig,
    RegularizerConfig,
    Section,
    TrainingConfig,
    _plain,
)
from training.app.task_spec import TaskSpec
from training.app.typed import ConfigError, field_spec
from training.common.conf import CONF_DIR
from training.common.option_checks import ABSENT, raw_view
from training.data.eraser_config import hashed_eraser

# What callers import from here (the sections and their loading live in sections.py and loading.py).
__all__ = ["CONF_DIR", "FIT_ON", "HASH_VERSION", "NON_CONFIG_KEYS", "NUMERICS", "numerics_of",
           "ArchConfig", "ConfigError", "DatasetConfig", "EraserConfig", "JobConfig", "LoggerConfig", "MdlConfig",
           "OptimConfig", "OptionsSection", "PathsConfig", "RegularizerConfig", "Section", "TrainingConfig",
           "cell_hash", "config_hash", "duplicate_jobs", "group_config", "load_config", "load_section",
           "same_numbers", "semantic", "with_defaults"]


HASH_VERSION = 2  # 1: every key but a fixed list of groups (before the typed configs); 2: declared per field
# The numerics version: bumped by every change that alters a job's numbers (docs/running.md, "Numerics versions").
# It enters the job hash, so results of older numerics are never reused; result.json records it (absent: 1).
# 1: before the version existed. 2: optim.beta2 reaches the optimizer (it was always 0.999); gs_erased_eval stops
# with mdl's step-aware rule. 3: QLEACE coupling noise applied to rows the eraser was not fitted on (holdout, the
# gs_erased_eval validation/test rows) is drawn i.i.d. N(0, R_k), not with exact moments on those rows.
# 4: gs_erased_eval erases through MDL's erase path: its test rows get the eraser's holdout options (LEACE's rtol).
# A job is hashed under its task's own version (`Task.numerics`, the last version that changed that task's numbers;
# by default this latest one), so a change to one task's numbers does not invalidate the others' results.
NUMERICS = 4


def numerics_of(spec: TaskSpec) -> int:
    """The numerics version jobs of task `spec` are computed (and hashed) under: its declared `Task.numerics`, else
    the latest (NUMERICS)."""
    return NUMERICS if spec.numerics is None else spec.numerics


def semantic(cfg: Mapping[str, Any] | JobConfig, spec: TaskSpec | None = None,
             fill_defaults: bool = True) -> dict[str, Any]:
    """The part of a (resolved) job config that determines its numbers: what the job hash covers. Tolerant of bad
    values (it names directories before the config is checked). Declared fields the config lacks count with their
    defaults (a plain dict and its typed config hash alike), unless `fill_defaults` is false (a result written before
    the field existed). A task that declares `uses` is hashed on those groups only. `spec`: the config's task (a
    JobConfig carries its own)."""
    spec = _spec(spec, cfg.task_spec if isinstance(cfg, JobConfig) else None)
    plain = cfg.to_dict() if isinstance(cfg, Section) else cfg
    data = same_numbers({k: v for k, v in plain.items() if k not in NON_CONFIG_KEYS})
    out = _semantic(JobConfig, data, fill_defaults)
    if _task(out) != spec.name:
        raise ValueError(f"a config of task {_task(out)} hashed as task {spec.name}")
    uses = spec.uses
    if uses is not None:
        # `training` is in `out` only away from its defaults (training.precision): it moves numbers of every task
        out = _only(out, ("task", "seed", "training", *uses))
    raw = raw_view(_RawJob, out)
    if isinstance(raw.eraser, dict):  # what of it changes the erased data (training/data/eraser_config.py)
        out["eraser"] = hashed_eraser(raw.eraser, raw.dataset)
    return out


@dataclass(frozen=True)
class _RawJob:  # a typed view of a raw (semantic, unchecked or stored) config: any value may be of any type
    eraser: Any = ABSENT
    dataset: Any = ABSENT


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
        for name, f in fields.items():
            if name not in items and not name.startswith("_") and f.default is not dataclasses.MISSING:
                items[name] = f.default
    for k, v in items.items():
        if k not in fields:
            out[k] = _plain(v)  # an extra: semantic
            continue
        declared = field_spec(fields[k])
        if not declared.hash:
            continue
        kind = declared.kind
        if isinstance(kind, type) and issubclass(kind, Section) and isinstance(v, Mapping):
            out[k] = _semantic(kind, v, fill_defaults)
            if not out[k] and not declared.hash_default:
                del out[k]  # a group whose keys are all at their defaults (training: precision fp32)
        elif declared.hash_default or _plain(v) != _plain(fields[k].default):
            out[k] = _plain(v)
    return out


def with_defaults(data: Mapping[str, Any], cls: type[Section] = JobConfig) -> dict[str, Any]:
    """A stored (or hand-written) config with the schema's default for every declared key it lacks, groups
    included: how reports read configs written before a key existed, with the one default the schema declares."""
    out = dict(data)
    for f in dataclasses.fields(cls):
        if f.name.startswith("_") or field_spec(f).typed_view:
            continue
        kind = field_spec(f).kind
        if f.name not in out and f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif isinstance(kind, type) and issubclass(kind, Section) and isinstance(out.get(f.name), Mapping):
            out[f.name] = with_defaults(out[f.name], kind)
    return out


# Keys hashed although they change nothing for some jobs: (key, the key it needs, the value it needs). They stay in
# those jobs' hash so that the presets' job hashes stay (paper_fig8 sets eraser.after_augment=true on SVHN without
# augmentation); a sweep over two of their values is refused instead (`duplicate_jobs`).
HASHED_UNREAD: tuple[tuple[str, str, Any], ...] = (
    ("eraser.after_augment", "dataset.augment", True),  # without augmentation, erasing each batch is erasing once
)


def duplicate_jobs(jobs: Sequence[tuple[Any, Mapping[str, Any] | JobConfig, TaskSpec]]) -> str | None:
    """Why two of `jobs` (a sweep's resolved job configs, each with the job's number and its task) would compute the
    same numbers under two hashes: they differ only in keys that change nothing for them (HASHED_UNREAD), e.g.
    `eraser.after_augment=true,false` without augmentation; None if no two do."""
    seen: dict[str, tuple[Any, str, dict[str, Any]]] = {}
    for i, cfg, spec in jobs:
        plain = cfg.to_dict() if isinstance(cfg, Section) else cfg
        nested = semantic(plain, spec)
        sem, full = flatten(nested), _digest({**nested, "numerics": numerics_of(spec)}, 16)  # == config_hash
        unread = {key: (when, needed) for key, when, needed in HASHED_UNREAD
                  if key in sem and flatten(plain).get(when, False) != needed}
        same = _digest({k: v for k, v in sem.items() if k not in unread}, 16)
        if same not in seen:
            seen[same] = (i, full, sem)
            continue
        j, other, first = seen[same]
        if other == full:
            continue  # the same job twice: the sweep runs it once
        keys = sorted(k for k in unread if first.get(k) != sem.get(k))
        why = "; ".join(f"{k} is read only with {unread[k][0]}={json.dumps(unread[k][1])}" for k in keys)
        values = ", ".join(f"{k}={json.dumps(first.get(k))},{json.dumps(sem.get(k))}" for k in keys)
        return (f"jobs {j} and {i} differ only in {values}, which changes nothing here ({why}): their numbers would be "
                f"equal under two hashes; sweep one value of {', '.join(keys)}")
    return None


def flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """Dotted key -> value of a nested config (an empty group is a value of its own, e.g. `eraser.options: {}`)."""
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and v:
            out.update(flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _digest(obj: Any, length: int) -> str:
    blob = json.dumps(obj, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:length]


def config_hash(cfg: Mapping[str, Any] | JobConfig, spec: TaskSpec | None = None, numerics: int | None = None) -> str:
    """The job's identity in result.json / progress.json (16 hex digits): its semantic config under a numerics
    version (a stored result's own, `numerics_version`, when rehashing it; by default its task's: numerics_of)."""
    spec = _spec(spec, cfg.task_spec if isinstance(cfg, JobConfig) else None)
    return _digest({**semantic(cfg, spec), "numerics": numerics_of(spec) if numerics is None else numerics}, 16)


def cell_hash(cfg: Mapping[str, Any] | JobConfig, spec: TaskSpec | None = None) -> str:
    """8 hex digits naming the job directory: the semantic config without the seed, under this numerics version
    (seeds of one configuration sit side by side: <...>/c<cell hash>/seed<seed>)."""
    spec = _spec(spec, cfg.task_spec if isinstance(cfg, JobConfig) else None)
    sem = semantic(cfg, spec)
    return _digest({**{k: v for k, v in sem.items() if k != "seed"}, "numerics": numerics_of(spec)}, 8)


def _spec(spec: TaskSpec | None, own: TaskSpec | None) -> TaskSpec:
    """The task a config is hashed as: `spec`, which a plain mapping needs; a JobConfig carries its own (`own`)."""
    if spec is not None:
        return spec
    if own is not None:
        return own
    raise TypeError("hashing a plain config needs its TaskSpec (training.app.tasks.spec_of(config) at the edge)")


def _task(sem: Mapping[str, Any]) -> str:
    return str(sem["task"]) if "task" in sem else "mdl"
