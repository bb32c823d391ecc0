"""The one codec of result.json: `encode(result) -> dict` (what the job writes), `decode(dict) -> Result`, and
`upgrade(raw)`, the one function that reads results of an older schema version.

    result = decode(json.loads(path.read_text()), spec)  # upgrade() first, then the class of task `spec`
    atomic_write_json(path, encode(result))               # exactly the sections the job wrote, in its order

Older results (tests/fixtures/results/ holds real ones) lack `schema_version` (version 1), `numerics_version`
(numerics 1), `hash_version` (hash 1), `task` (the config's; before tasks: mdl); their config may lack the group
tags (their names), keys added since (their schema defaults) or spell `eraser.repeat` `eraser.fold`. `Result.config`
stays as recorded (the job hash is recomputed from exactly that); `config_view` is how older configs read today.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.app.result_types import (
    ENVELOPE_KEYS,
    RESULT_SCHEMA,
    TAIL_KEYS,
    DatasetInfo,
    Provenance,
    Result,
    Sections,
    at,
    mapping,
    text,
)
from training.app.schema import flatten as flatten  # re-exported: readers of results flatten configs
from training.app.schema import with_defaults
from training.app.task_spec import TaskSpec
from training.data.eraser_config import FIT_DEFAULTS, legacy_fold

RESULT_FILE = "result.json"


class MalformedResultError(ValueError):
    """A result.json that cannot be read as a result (the message says what is wrong with it)."""


class NewerSchemaError(MalformedResultError):
    """A result.json written by newer code (a schema_version above RESULT_SCHEMA) or with a schema_version that
    is not a version (`"3"`, 2.5, -1, true): a job never replaces it without force=true (training/app/results.py)."""


def upgrade(raw: Mapping[str, Any]) -> dict[str, Any]:
    """A stored result in today's schema (RESULT_SCHEMA): the envelope keys written before they existed get the
    values they stood for. The config is left as recorded (see `config_view`); a current result is returned
    unchanged (a copy)."""
    out = dict(raw)
    version = at(out, "schema_version", default=1)
    if isinstance(version, int) and not isinstance(version, bool) and version > RESULT_SCHEMA:
        raise NewerSchemaError(f"schema_version {version} is newer than this code's ({RESULT_SCHEMA})")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        # not one this code wrote: kept like a newer one's result, never read as a result nor recomputed over
        raise NewerSchemaError(f"schema_version {json.dumps(version)} is not one this code reads (1 to "
                               f"{RESULT_SCHEMA})")
    if version < 2:
        task = at(out, "config", "task")
        out.setdefault("numerics_version", 1)  # written before numerics versions: the first
        out.setdefault("hash_version", 1)  # written before hash v2 (declared per field)
        out.setdefault("task", task if isinstance(task, str) else "mdl")  # written before tasks: an MDL job
        out["schema_version"] = RESULT_SCHEMA
    return out


def config_view(config: Mapping[str, Any]) -> dict[str, Any]:
    """A recorded config as dotted key -> value, read as today's schema spells it: the schema's defaults for declared
    keys it lacks, a group's `tag` defaulting to its name, `eraser.fold` read as `eraser.repeat`, FIT_DEFAULTS for
    the fitting keys a result written before them lacks (training/data/eraser_config.py)."""
    view = flatten(with_defaults(config))
    for group in ("dataset", "arch"):
        if f"{group}.name" in view and view.get(f"{group}.tag") is None:
            view[f"{group}.tag"] = view[f"{group}.name"]
    view = legacy_fold(view)
    for key, default in FIT_DEFAULTS.items():
        view.setdefault(key, default)
    return view


def _int(value: Any, default: int) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) else default


def decode(raw: Any, spec: TaskSpec | None) -> Result:
    """The Result a stored result.json holds (any schema version: `upgrade` first), of task `spec`'s class (the
    plain envelope for a result of another task, or `spec` None: a task not declared here). MalformedResultError
    (one line) for a file that is not a result."""
    if not isinstance(raw, Mapping):
        raise MalformedResultError(f"not a JSON object (a {type(raw).__name__})")
    data = upgrade(raw)
    config, task = at(data, "config"), text(at(data, "task")) or "mdl"
    sections = {k: v for k, v in data.items() if k not in ENVELOPE_KEYS}
    tail = tuple(k for k in data if k in TAIL_KEYS)
    common: dict[str, Any] = dict(
        config_hash=text(at(data, "config_hash")) or "",
        hash_version=_int(at(data, "hash_version"), 1), numerics_version=_int(at(data, "numerics_version"), 1),
        schema_version=RESULT_SCHEMA, task=task, config=config if isinstance(config, Mapping) else None,
        job_dir=text(at(data, "job_dir")), device=text(at(data, "device")),
        timings=mapping(at(data, "timings")), provenance=Provenance.of(at(data, "provenance")),
        dataset=DatasetInfo.of(at(data, "dataset")), tail=tail)
    cls = spec.result_type if spec is not None and spec.name == task else Result
    try:
        body = cls.sections_type.read(sections)
    except ValueError as e:
        raise MalformedResultError(str(e)) from e
    return cls(**common, body=body)


def encode(result: Result) -> dict[str, Any]:
    """What result.json holds for `result`: the envelope, the task's sections in the order the task wrote them,
    then device, timings and provenance."""
    head: dict[str, Any] = {"config_hash": result.config_hash, "hash_version": result.hash_version,
                            "numerics_version": result.numerics_version, "schema_version": result.schema_version,
                            "job_dir": result.job_dir, "task": result.task, "config": result.config}
    if result.job_dir is None:
        del head["job_dir"]
    tail: dict[str, Any] = {"device": result.device, "timings": dict(result.timings),
                            "provenance": None if result.provenance is None else result.provenance.raw}
    return {**head, **result.body.written, **{k: tail[k] for k in result.tail}}


def new_result(sections: Sections, spec: TaskSpec, **envelope: Any) -> Result:
    """The Result of task `spec` (training/app/lifecycle.py writes it) around the sections its body returned;
    `envelope`: its other fields as result.json holds them (config_hash, hash_version, numerics_version, job_dir,
    task, config, device, timings, provenance)."""
    if type(sections) is not (cls := spec.result_type).sections_type:
        raise TypeError(f"task {spec.name}'s body returned {type(sections).__name__}, not {cls.sections_type.__name__}")
    if clash := [k for k in sections.written if k in ENVELOPE_KEYS]:
        raise ValueError(f"task {spec.name}'s sections {clash} are envelope keys (training/app/result_types.py)")
    return cls(**{**envelope, "provenance": Provenance.of(envelope["provenance"])}, schema_version=RESULT_SCHEMA,
               body=sections, dataset=DatasetInfo.of(at(sections.written, "dataset")), tail=TAIL_KEYS)


def read(path: Path, spec: TaskSpec | None) -> Result | None:
    """The Result stored at `path` (`decode`: of task `spec`'s class); None when the file is absent.
    MalformedResultError (one line) for a file that cannot be parsed or is not a result; a file this process may
    not read raises its OSError, for the caller to name."""
    raw = read_json(path)
    return None if raw is None else decode(raw, spec)


def read_json(path: Path) -> Any:
    """A result.json's parsed JSON (None when the file is absent; MalformedResultError when it is not JSON)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise MalformedResultError(f"not readable JSON ({type(e).__name__}: {e})") from e
