"""The one job lifecycle every task runs in: check the config, lock the job directory, skip or resume, run the
task's body, write result.json last, clear the progress file.

    def run_job(config):                     # Task.__call__ (training/app/tasks.py) does this for every task
        return run_in_job_dir(load_config(config, spec), body)  # body(run: JobRun) -> the task's typed Sections

It returns an `Outcome`: done (computed now), skipped (this configuration's result was there), reused (found in
its pre-v2 directory) or failed (the ledger's record of an error). Every task shares it, so a fix here (a lock, a
resume rule) reaches all.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch

from training.app.result_codec import encode, new_result
from training.app.result_types import Fingerprint as FingerprintRecord
from training.app.result_types import Result, Sections, at
from training.app.results import JobDir, Stale, legacy_result, set_aside_name
from training.app.schema import HASH_VERSION, JobConfig, config_hash, numerics_of
from training.common import interrupt
from training.common.files import atomic_write_json, read_json
from training.common.provenance import device_name, now_utc, provenance
from training.engine.devices import resolve_device
from training.engine.numerics import JobNumerics, job_numerics
from training.errors import NonFiniteError, UserError

log = logging.getLogger(__name__)
PROGRESS_FILE = "progress.json"


@dataclass(frozen=True)
class SavedProgress:
    """What progress.json holds: the units finished (MDL block models) by a run of the configuration `config_hash`
    (read by the job to resume, by the Ctrl-C line and by the aggregate for its partial jobs)."""

    blocks: list[Any]
    config_hash: str | None = None

    @classmethod
    def from_json(cls, raw: Any) -> SavedProgress:
        """ValueError for what is not `{"config_hash", "blocks": [...]}`."""
        if not isinstance(raw, dict) or "blocks" not in raw or not isinstance(raw["blocks"], list):
            raise ValueError("no list of blocks")
        return cls(**{f.name: raw[f.name] for f in dataclasses.fields(cls) if f.name in raw})

    @classmethod
    def read(cls, path: Path) -> SavedProgress | None:
        """The file's content; None if absent; ValueError if it is not progress (unparsable files count as absent)."""
        raw = read_json(path)
        return None if raw is None else cls.from_json(raw)


@dataclass(frozen=True)
class Progress:
    """The job's resumable units (MDL block models), saved after each one finishes; cleared with the result."""

    path: Path
    cfg_hash: str

    def load(self) -> list[Any] | None:
        """The saved units of this configuration; None if absent or another configuration's; a file that is not
        `{"config_hash", "blocks": [...]}` is warned about and ignored."""
        try:
            saved = SavedProgress.read(self.path)
        except ValueError as err:
            log.warning("ignoring malformed %s (%s); starting the MDL blocks over", self.path, err)
            return None
        return saved.blocks if saved is not None and saved.config_hash == self.cfg_hash else None

    def save(self, units: list[Any]) -> None:
        atomic_write_json(self.path, {"config_hash": self.cfg_hash, "blocks": units})

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Outcome:
    """What a job came to (see the module docstring) and its result.json (None when it failed: `error` says why).
    `run_in_job_dir` raises a failure; the multirun ledger (training/cli/ledger.py) records it as `failed`."""

    status: Literal["done", "skipped", "reused", "failed"]
    job_dir: Path
    result: dict[str, Any] | None = None
    error: str | None = None
    exception: BaseException | None = dataclasses.field(default=None, compare=False, repr=False)  # failed: why


@dataclass(frozen=True)
class DataOnDisk:
    """What a `Fingerprint` hook read: the fingerprint of the job's data as it is on disk now (result.json's
    `dataset.fingerprint`) and the data itself, handed to the body if the job runs again (None: the body loads it)."""

    fingerprint: Any
    loaded: Any = None


@dataclass(frozen=True)
class JobRun:
    """What a task's body gets: its typed config, directory, device and progress file, what its precheck (or
    fingerprint) loaded (None: the body loads its data itself), what the seeds of its cell share (`store`) and its
    numerics (training/engine/numerics.py: passed to what trains; result.json's signature is read from it)."""

    cfg: JobConfig
    job: JobDir
    device: torch.device
    progress: Progress
    loaded: Any = None
    store: Any = None  # what the seeds of its cell share (training/inputs/store.py; None: nothing)
    numerics: JobNumerics | None = None
    timings: dict[str, float] = dataclasses.field(default_factory=dict)  # the body's stages: result.json timings
    t0: float = dataclasses.field(default_factory=time.perf_counter)  # when it was opened (timings.total_s)
    started: str = dataclasses.field(default_factory=now_utc)  # (provenance)

    @property
    def path(self) -> Path:
        return self.job.path

    @property
    def cfg_hash(self) -> str:
        return self.job.cfg_hash


Body = Callable[[JobRun], Sections]  # the task's sections, of its result type's `sections_type`
# a cell's body: its seeds' jobs run together -> each one's sections, or the exception that seed failed with
CellBody = Callable[[list[JobRun]], Sequence["Sections | BaseException"]]
# Refuses bad runtime options before anything is made; returns what it loaded for the body. Not called for a job
# that looks finished; called then (in the lock) when that result is stale, with the data its fingerprint check read
# again (None: not read), so a job that runs is always checked.
Precheck = Callable[[JobConfig, torch.device, Any, Any], Any]  # (config, device, data read, store)
# the identity of the data a job would read now (and that data)
Fingerprint = Callable[[JobConfig, Any], DataOnDisk]  # (config, store)


@dataclass(frozen=True)
class Hooks:
    """A task's hooks into the lifecycle (`Task.lifecycle()`, keyword arguments of `run_in_job_dir`): `precheck`
    (above; what it loaded is `JobRun.loaded`); `finite`: the sections whose every number must be finite (else
    NonFiniteError, no result); `complete`, `fingerprint`: see `stale_reason`; `describe`: the done line's summary."""

    precheck: Precheck | None = None
    describe: Callable[[dict[str, Any]], str] | None = None
    finite: tuple[str, ...] = ()
    complete: tuple[str, ...] = ()
    fingerprint: Fingerprint | None = None


def stale_reason(done: Result, cfg: JobConfig, complete: tuple[str, ...],
                 fingerprint: Callable[[JobConfig], Any] | None) -> Stale | None:
    """Why a finished result of this configuration must not be reused (None: reuse it): a section the task always
    writes is missing (`complete`), or its `dataset.fingerprint` differs from `fingerprint(cfg)`, the data now on disk:
    that result is a finished measurement of other data, kept aside (`Stale.keep_as`) before the job runs again."""
    for section in complete:
        if done.section(section) is None:
            return Stale(f"it has no {section} section (incomplete)")
    stored = done.dataset.fingerprint
    if fingerprint is None or stored is None:
        return None  # a result written before fingerprints: nothing to compare
    try:
        now = FingerprintRecord.of(json.loads(json.dumps(fingerprint(cfg), default=str)))  # as result.json holds it
    except UserError as err:  # missing or unreadable now: the result stands for the data it was computed on
        log.warning("cannot check the data of %s against its result (%s); reusing the result", cfg.paths.job_dir,
                    err)
        return None
    if now is not None and now.identity() == stored.identity():
        return None
    where = cfg.dataset.root or cfg.paths.data_dir
    return Stale(f"its data fingerprint ({stored.short()}) differs from the {cfg.dataset.name} data now read from "
                 f"{where} ({'none' if now is None else now.short()}): the data files changed",
                 keep_as=set_aside_name(stored), restore=None if now is None else set_aside_name(now))


def nonfinite_leaves(value: Any, path: str) -> Iterator[tuple[str, float]]:
    """(dotted path, value) of every NaN/inf number in `value` (nested dicts and lists; None is not a number)."""
    if isinstance(value, Mapping):
        for k, v in value.items():
            yield from nonfinite_leaves(v, f"{path}.{k}")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            yield from nonfinite_leaves(v, f"{path}[{i}]")
    elif isinstance(value, float) and not math.isfinite(value):
        yield path, value


def run_in_job_dir(cfg: JobConfig, body: Body, store: Any = None, **hooks: Any) -> Outcome:
    """Run `body`, the job of `cfg` (loaded with its task's spec), in its directory under its lock; its Outcome: done
    with the new result (with its `provenance`), or skipped/reused with an earlier result of this configuration.
    `hooks`: the fields of `Hooks`. `store`: what the seeds of a cell share (loaded data, fitted erasers, erased
    data: training/inputs/store.py), handed to the hooks and the body."""
    if (outcome := run_cell([cfg], lambda runs: [body(runs[0])], store, **hooks)[0]).exception is not None:
        raise outcome.exception
    return outcome


def run_cell(cfgs: list[JobConfig], body: CellBody, store: Any = None, **hooks: Any) -> list[Outcome]:
    """The jobs of a cell's seeds (`cfgs`, one configuration) run together: each opened in its directory under its
    lock (skipped or reused as alone), then `body` runs the jobs not done at once (one numerics) and returns each
    one's sections or the exception it failed with; each writes its result.json. An Outcome per seed, in order: a
    seed that failed (`failed`) never stops the others. Interrupts pass through, every lock released."""
    outcomes: dict[int, Outcome] = {}
    given = Hooks(**hooks)
    with ExitStack() as stack:
        runs: list[tuple[int, JobRun]] = []
        for i, cfg in enumerate(cfgs):
            try:
                got = stack.enter_context(opened(cfg, given, store))
            except Exception as err:  # noqa: BLE001 - this seed's: recorded, the others go on
                outcomes[i] = failed(cfg, err)
                continue
            if isinstance(got, Outcome):
                outcomes[i] = got
            else:
                runs.append((i, got))
        if runs:
            t = runs[0][1].cfg.training
            with job_numerics(t.precision, t.deterministic, t.channels_last) as job_num:
                ready = [(i, dataclasses.replace(run, numerics=job_num)) for i, run in runs]
                for (i, run), made in zip(ready, body([run for _, run in ready]), strict=True):
                    try:
                        if isinstance(made, BaseException):
                            raise made
                        outcomes[i] = finish(run, made, given)
                    except Exception as err:  # noqa: BLE001 - this seed's: recorded, the others go on
                        outcomes[i] = failed(run.cfg, err)
    return [outcomes[i] for i in range(len(cfgs))]


def failed(cfg: JobConfig, err: Exception) -> Outcome:
    """The Outcome of a seed that failed with `err` (a signal's stop is raised instead: it is no failure); the
    command line reports it (training/cli/run.py)."""
    interrupt.stop_behind(err)
    return Outcome("failed", Path(cfg.paths.job_dir), error=f"{type(err).__name__}: {err}", exception=err)


@contextmanager
def opened(cfg: JobConfig, hooks: Hooks, store: Any = None) -> Iterator[Outcome | JobRun]:
    """The job of `cfg` opened: its directory locked inside; yields its Outcome when an earlier result stands
    (skipped, reused), else the JobRun its body runs (see `run_in_job_dir`)."""
    spec, precheck, fingerprint = cfg.task_spec, hooks.precheck, hooks.fingerprint
    job = JobDir(Path(cfg.paths.job_dir), config_hash(cfg), spec, cfg.force)
    device = resolve_device(cfg.device)
    # a job that looks finished loads nothing (the lifecycle skips it, unless its result is stale: checked below)
    loaded = precheck(cfg, device, None, store) if precheck is not None and not job.looks_finished() else None
    read_now: list[DataOnDisk] = []  # what the fingerprint hook read, if the stale check called it

    def now_on_disk(c: JobConfig) -> Any:
        assert fingerprint is not None
        read_now.append(fingerprint(c, store))
        return read_now[-1].fingerprint

    check = now_on_disk if fingerprint is not None else None
    with job.locked():
        if (done := job.finished(lambda d: stale_reason(d, cfg, hooks.complete, check))) is not None:
            yield Outcome("skipped", job.path, encode(done))
            return
        if not cfg.force and cfg.paths.legacy_job_dir and (done := legacy_result(cfg, job.path)) is not None:
            yield Outcome("reused", job.path, encode(done))
            return
        fresh = read_now[-1].loaded if read_now else None  # the stale check read the data again: the newest copy
        if precheck is not None and loaded is None:  # the precheck took the job for finished: checked now
            loaded = precheck(cfg, device, fresh, store)
        elif fresh is not None:
            loaded = fresh
        progress = Progress(job.path / PROGRESS_FILE, job.cfg_hash)
        if cfg.force:
            progress.clear()  # force=true recomputes from scratch
        yield JobRun(cfg, job, device, progress, loaded, store)


def finish(run: JobRun, sections: Sections, hooks: Hooks) -> Outcome:
    """The job's result.json written (its last act: its presence means "done") and its progress file cleared."""
    cfg, job, device = run.cfg, run.job, run.device
    numerics = None if run.numerics is None else run.numerics.signature(device, device_name(str(device)))
    timings = {**run.timings, "total_s": time.perf_counter() - run.t0}
    typed = new_result(config_hash=job.cfg_hash, hash_version=HASH_VERSION, numerics_version=numerics_of(cfg.task_spec),
                       job_dir=str(job.path), task=cfg.task, config=cfg.to_dict(), sections=sections,
                       device=str(device), timings=timings,
                       provenance={**provenance(device, run.started, now_utc()), "numerics": numerics},
                       spec=cfg.task_spec)
    for section in hooks.finite:  # a result with a NaN/inf there is never written (it would read as finished)
        for path, value in nonfinite_leaves(at(typed.body.written, section), section):
            raise NonFiniteError(f"non-finite {path} ({value}) in the result of {job.path}: lr too high or bad data; "
                                 "nothing was written as a result")
    job.write_result(typed)
    result = encode(typed)
    run.progress.clear()
    log.info("done %s: %s, %.1fs", job.path, hooks.describe(result) if hooks.describe else cfg.task, timings["total_s"])
    return Outcome("done", job.path, result)
