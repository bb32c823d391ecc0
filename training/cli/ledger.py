"""Hydra callback: a multirun counts its jobs as done / skipped / failed and never hides a failure.

Registered in `conf/config.yaml` (`hydra.callbacks.job_status`). It works with every launcher: each job, in
whatever process or node runs it, writes one status file to `<sweep dir>/.multirun/<id>/`; every job then logs
the running tally (`[3/12] done ... | done 2, skipped 1, failed 0`), and the launching process writes
`summary.json` there and logs the final count.

Policy: one failed job does not stop the sweep. Hydra's basic sweeper lets every job of the batch run, then
re-raises the first failure, so the multirun exits non-zero; the summary (with each failed job's directory
and error) is printed on the way out. Rerunning the same command skips the finished jobs and resumes the rest.

Before anything runs, the launching process composes every job of the sweep (with or without a preset) and
refuses the whole sweep, with one line and exit code 2, when a job's config has a bad value, when two jobs would
share a directory with different configurations (naming the keys that differ), or when a job's directory holds a
result of another configuration (unless force=true). A single run's config is checked the same way before Hydra
creates its directory.
"""

from __future__ import annotations

import atexit
import copy
import dataclasses
import functools
import json
import logging
import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from training.app.lifecycle import Outcome
from training.app.result_codec import flatten
from training.app.results import RESULT_FILE, NewerResultError, mismatch_message, read_result, same_config
from training.app.schema import config_hash, duplicate_jobs
from training.app.tasks import TaskSpec, job_semantic, load_job
from training.cli.local_workers import controllers_ignore_sigint
from training.cli.preemption import runs_jobs_in_workers, stop_workers_on_signal
from training.cli.report import SweepJobFailed, exit_user_error, hydra_error_line, make_run_dir, user_error_line
from training.common import env
from training.common.cells import cell_seeds, seed_configs, seed_job_dirs
from training.common.conf import resolved_dict
from training.common.files import atomic_write_json
from training.common.ledger_entry import DONE_BY_ANOTHER_RUN, STATUSES, LedgerEntry, read_ledger
from training.common.sweeps import split_sweep
from training.engine.devices import device_problem, resolve_device
from training.errors import ConfigError, UserError, first_line

log = logging.getLogger("training.multirun")
LEDGER_ENV = env.MULTIRUN_LEDGER


def sweep_combos(config: DictConfig) -> list[list[str]] | None:
    """The override list of every job the basic sweeper will launch, in order: its params (a preset's
    `hydra.sweeper.params`, or none) x the command line's overrides. None for another sweeper."""
    from hydra.core.global_hydra import GlobalHydra

    hc = config.hydra
    if "BasicSweeper" not in str(hc.sweeper.get("_target_", "")):
        return None
    params = hc.sweeper.get("params")
    params = OmegaConf.to_container(params, resolve=False) if params is not None else {}
    assert isinstance(params, dict)
    args = [f"{k}={v}" for k, v in params.items()] + list(hc.overrides.task)
    loader = GlobalHydra.instance().config_loader() if GlobalHydra.instance().is_initialized() else None
    try:
        return split_sweep(args, loader)
    except ConfigError as err:
        exit_user_error(f"multirun refused (nothing ran): {err}", err)


def differing_keys(cfgs: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """Semantic keys (dotted) whose values differ between the configs, with their distinct values."""
    flats = [flatten(job_semantic(c)) for c in cfgs]
    out: dict[str, list[Any]] = {}
    for k in sorted(set().union(*flats)):
        if len(distinct := list(dict.fromkeys(json.dumps(f.get(k), sort_keys=True, default=str) for f in flats))) > 1:
            out[k] = [json.loads(v) for v in distinct]
    return out


def _split_seed(combo: list[str]) -> tuple[tuple[str, ...], Any]:
    """(the overrides other than a plain `seed=<value>`, that value or None)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    rest, seed = [], None
    for item in combo:
        if item.startswith("seed="):
            (override,) = OverridesParser.create().parse_overrides([item])  # the job's own parse of the value
            seed = override.value()
        else:
            rest.append(item)
    return tuple(rest), seed


def check_sweep(config: DictConfig) -> int | None:
    """Compose and check every job of the sweep before any runs; refuse the sweep (one line, exit 2) on a bad
    value, on jobs sharing a directory with different configurations, or on a directory holding another
    configuration's result (unless force=true). Returns the number of seed jobs of its cells (None for another
    sweeper)."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    check_launcher(config)
    # every launcher but SLURM's (whose jobs run on its nodes) runs the jobs here: their device is checked up front
    here = "SlurmLauncher" not in launcher_target(config)
    combos = sweep_combos(config)
    if combos is None or not GlobalHydra.instance().is_initialized():
        return None if combos is None else len(combos)
    loader = GlobalHydra.instance().config_loader()
    t0 = time.time()
    # num, combo, cfg, hash, force, task
    by_dir: dict[str, list[tuple[int, list[str], dict[str, Any], str, bool, TaskSpec]]] = {}
    composed: dict[tuple[str, ...], DictConfig] = {}
    for num, combo in enumerate(combos):
        where = f"job {num} ({' '.join(combo) or 'no overrides'})"
        # Composing is the slow part (~0.1 s a job): jobs that differ only in the seed share one composition.
        rest, seed = _split_seed(combo)
        try:
            if rest not in composed:
                base = loader.load_sweep_config(config, list(rest))
                with open_dict(base):
                    del base["hydra"]
                composed[rest] = base
            job_cfg = composed[rest]
            if seed is not None:
                job_cfg.seed = seed  # resolved right below, before the next job sets its own
        except Exception as err:  # noqa: BLE001 - the sweeper would fail on it too, with a longer story
            exit_user_error(f"multirun refused (nothing ran): {where} cannot be composed: "
                            f"{hydra_error_line(err) or first_line(err)}", err)
        try:
            cfgs = seed_configs(job_cfg)  # each seed of the job's cell
        except Exception as err:  # noqa: BLE001 - e.g. ${hydra:...} in a path: the job itself will tell
            line = user_error_line(err) if isinstance(err, UserError) else None
            if line is not None:  # a bad `seeds`
                exit_user_error(f"multirun refused (nothing ran): {where}: {line}", err)
            log.debug("multirun: %s not checked (%s)", where, first_line(err))
            continue
        for cfg in cfgs:
            try:
                job = load_job(cfg)  # the edge: the config's task -> its TaskSpec
                h = config_hash(job)
            except Exception as err:
                line = user_error_line(err)
                if line is None:  # not the user's mistake to fix up front: the job itself will fail and say so
                    log.warning("multirun: %s not checked (%s: %s)", where, type(err).__name__, first_line(err))
                    continue
                exit_user_error(f"multirun refused (nothing ran): {where}: {line}", err)
            if here and (problem := device_problem(job.device)) is not None:
                exit_user_error(f"multirun refused (nothing ran): {where}: {problem}")
            by_dir.setdefault(job.paths.job_dir, []).append((num, combo, cfg, h, job.force, job.task_spec))
    for job_dir, jobs in by_dir.items():
        if len({j[3] for j in jobs}) > 1:
            diff = differing_keys([j[2] for j in jobs])
            shown = "; ".join(f"{k}: {', '.join(map(str, v))}" for k, v in list(diff.items())[:4])
            exit_user_error(
                f"multirun refused (nothing ran): jobs {', '.join(str(j[0]) for j in jobs)} would share the "
                f"directory {job_dir} with different configurations (they differ in {shown or 'unknown keys'}); "
                "run them with different paths.out_dir, or put those keys into paths.job_subdir")
        if len(jobs) > 1:  # the same job twice (seed=0,0): a slip; the second would only wait for the first and skip
            task = OverridesParser.create().parse_overrides(list(config.hydra.overrides.task))
            swept = [str(o.input_line) for o in task if o.is_sweep_override()]
            exit_user_error(f"multirun refused (nothing ran): jobs {jobs[0][0]} and {jobs[1][0]} of {' '.join(swept)} "
                            f"are the same job ({job_dir}): a sweep runs each job once, so give each value once "
                            "(seed=0,1, not seed=0,0)")
    checked = sorted(((num, cfg, spec) for jobs in by_dir.values() for num, _, cfg, _, _, spec in jobs),
                     key=lambda job: job[0])
    if (same := duplicate_jobs(checked)) is not None:  # two hashes, the same numbers (HASHED_UNREAD)
        exit_user_error(f"multirun refused (nothing ran): {same}")
    mismatched = []
    for job_dir, jobs in by_dir.items():
        num, _, cfg, h, force, spec = jobs[0]
        if force:
            continue
        try:
            done = read_result(Path(job_dir) / RESULT_FILE, spec, refuse_newer=True)
        except NewerResultError as err:  # written by newer code: never replaced without force=true
            mismatched.append(str(err))
            continue
        if done is not None and not same_config(done, h, spec):
            mismatched.append(mismatch_message(Path(job_dir), done.config_hash, h))
    if mismatched:
        more = f" ({len(mismatched) - 1} more job directories hold other configurations)" if len(mismatched) > 1 else ""
        exit_user_error(f"multirun refused (nothing ran): {mismatched[0]}{more}")
    seeds = sum(map(len, by_dir.values()))  # the seed jobs of every cell: what the ledger counts
    log.info("multirun: checked %d cells (%d seed jobs) in %.1fs", len(combos), seeds, time.time() - t0)
    return seeds


def launcher_target(config: DictConfig) -> str:
    return str(OmegaConf.select(config, "hydra.launcher._target_", default="") or "")


def register_launcher(config: DictConfig) -> None:
    """`hydra/launcher=slurm` (hydra_plugins/erasure_mdl_slurm) from any working directory, before Hydra makes the
    launcher. Hydra finds plugins by listing `hydra_plugins.__path__` with pkgutil, which a setuptools editable
    install (PEP 660) maps through an import finder pkgutil cannot list: importable, but found only from the
    checkout's root. Imported here, after Hydra's own scan (which loads the plugins' modules again)."""
    if not launcher_target(config).startswith("hydra_plugins.erasure_mdl_slurm."):
        return
    from hydra.core.plugins import Plugins

    from hydra_plugins.erasure_mdl_slurm.slurm_launcher import SlurmLauncher

    Plugins.instance().register(SlurmLauncher)


def check_launcher(config: DictConfig) -> None:
    """Launcher settings that would fail only once the sweep starts: refused up front (one line, exit 2)."""
    if (removed := OmegaConf.select(config, "hydra.launcher.removed", default=None)) is not None:
        exit_user_error(f"multirun refused (nothing ran): {removed}")  # conf/hydra/launcher/packed.yaml
    if "SlurmLauncher" in launcher_target(config):
        from hydra_plugins.erasure_mdl_slurm.slurm_launcher import unreachable

        if (why := unreachable()) is not None:
            exit_user_error(f"multirun refused (nothing ran): no SLURM cluster answered ({why}): use a machine whose "
                            "sbatch reaches one (a login node) or set SLURM_CONF to its slurm.conf (`make slurm-up` "
                            "starts one on this machine), or drop hydra/launcher=slurm to run the sweep here")
    if "JoblibLauncher" in launcher_target(config):
        if OmegaConf.select(config, "hydra.launcher.n_jobs", default=None) == 0:
            exit_user_error("multirun refused (nothing ran): hydra.launcher.n_jobs=0 is not allowed: "
                            "hydra.launcher.n_jobs must be an integer ≥ 1 (jobs at once) or negative (-1: one per "
                            "CPU, -2: all CPUs but one, ...)")


def tally(entries: list[LedgerEntry]) -> dict[str, int]:
    counts = Counter(e.status for e in entries)
    return {s: counts[s] for s in STATUSES}


def summary_line(entries: list[LedgerEntry], total: int | None) -> str:
    t = tally(entries)
    by_other = sum(e.done_by_another_run for e in entries)
    shown = {s: f"{t[s]} {s}" for s in STATUSES}
    if by_other:
        shown["skipped"] += f" ({by_other} {DONE_BY_ANOTHER_RUN})"
    line = f"multirun: {len(entries)}/{total if total is not None else '?'} jobs ran: " + ", ".join(shown.values())
    if total is not None and len(entries) < total:
        line += f", {total - len(entries)} not run"
    for e in entries:
        if e.status == "failed":
            line += f"\n  FAILED {e.job_dir}: {e.error or ''}"
    return line


def _result_stamp(job_dir: Path) -> int | None:
    try:
        return (job_dir / RESULT_FILE).stat().st_mtime_ns
    except FileNotFoundError:
        return None


def _say_unwritable(path: Path, err: OSError, kept: str) -> None:
    """One line on stderr: the ledger could not write `path` (a full disk, ...); what is kept instead."""
    why = user_error_line(err) or f"cannot write {path}: {err.strerror or err}"
    print(f"multirun ledger: {why}; {kept}", file=sys.stderr, flush=True)


class JobStatusCallback(Callback):
    def __init__(self) -> None:
        self._stamps: dict[str, tuple[int | None, float]] = {}
        self._ledger: Path | None = None
        self._total: int | None = None
        self._reported = False
        self._unwritten: dict[str, LedgerEntry] = {}  # ledger entries a full disk kept off it (by file name)
        self._restore_signals: Callable[[], object] = lambda: None

    # --- the launching process -------------------------------------------------------------------------
    def on_run_start(self, config: DictConfig, **kwargs: Any) -> None:
        """A single run: check its config and that its directory can be made, before Hydra makes it."""
        if (removed := OmegaConf.select(config, "hydra.launcher.removed", default=None)) is not None:
            exit_user_error(str(removed))  # conf/hydra/launcher/packed.yaml
        job_cfg = copy.deepcopy(config)
        with open_dict(job_cfg):
            del job_cfg["hydra"]
        try:
            cfg = resolved_dict(job_cfg)
        except Exception:  # noqa: BLE001 - an interpolation error: Hydra and the job report it
            return
        try:
            cell_seeds(job_cfg)  # a bad `seeds`: refused before the directory
            resolve_device(load_job(cfg).device)  # a device that is not here: refused before the directory
            make_run_dir(Path(str(config.hydra.run.dir)))
        except Exception as err:
            line = user_error_line(err)
            if line is None and isinstance(err, OSError) and err.filename:  # /proc: no directory can be made there
                line = (f"paths.out_dir={cfg['paths']['out_dir']} is not allowed: cannot create {err.filename} "
                        f"({(err.strerror or '').lower()}); point paths.out_dir at a directory this user can write")
            if line is None:
                raise
            exit_user_error(line, err)

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        register_launcher(config)
        try:
            self._total = check_sweep(config)  # refuses the sweep (SystemExit, code 2) before anything is made
        except Exception as err:  # noqa: BLE001 - a failed check must not cost the sweep its ledger
            log.warning("multirun: the job configs could not be checked up front (%s: %s)", type(err).__name__, err)
            combos = sweep_combos(config)  # how many jobs the basic sweeper will launch (None: another sweeper)
            self._total = None if combos is None else len(combos)
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self._ledger = Path(str(config.hydra.sweep.dir)).absolute() / ".multirun" / run_id  # jobs may chdir
        try:
            self._ledger.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            exit_user_error(user_error_line(err) or f"cannot create {self._ledger}: {err}", err)
        env.set_multirun(self._ledger, self._total)  # inherited by joblib/submitit workers and sbatch jobs
        log.info("multirun: %s jobs, job status in %s", self._total if self._total is not None else "?",
                 self._ledger)
        atexit.register(self._report_at_exit)
        if runs_jobs_in_workers(launcher_target(config)):  # SIGTERM/SIGINT here must stop them (preemption.py)
            env.set_sweep_parent(os.getpid())  # and its workers stop when it dies (local_workers.exit_with_parent)
            restore, unshield = stop_workers_on_signal(), controllers_ignore_sigint()
            self._restore_signals = lambda: (unshield(), restore())

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        self._restore_signals()
        failed = tally(self._finish(at_exit=False))["failed"]
        if failed:  # the basic sweeper raises before this point; other sweepers must not exit 0 either
            raise RuntimeError(f"{failed} job(s) failed (see {self._ledger})")

    def _report_at_exit(self) -> None:
        """The sweep raised (a failed job) or was interrupted: still say what happened."""
        if not self._reported and self._ledger is not None:
            self._finish(at_exit=True)

    def _finish(self, at_exit: bool) -> list[LedgerEntry]:
        """Write summary.json from the ledger's entries; say the summary line once (logged, or on stderr at exit)."""
        assert self._ledger is not None
        entries = sorted(_entries(self._ledger, self._unwritten), key=lambda e: (e.num, e.part or 0))
        path = self._ledger / "summary.json"
        try:
            atomic_write_json(path, {"total": self._total, **tally(entries), "jobs": [e.to_json() for e in entries]})
        except OSError as err:  # the summary line still says what happened
            _say_unwritable(path, err, "the summary line is all there is of it")
        if not self._reported:
            self._reported = True
            if at_exit:
                print(summary_line(entries, self._total), file=sys.stderr, flush=True)
            else:
                log.info("%s", summary_line(entries, self._total))
        return entries

    # --- wherever a job runs ---------------------------------------------------------------------------
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        for job_dir in _job_dirs(config):
            self._stamps[str(job_dir)] = (_result_stamp(job_dir), time.time())

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        ledger = env.multirun_ledger()
        if ledger is None:  # a single run, not part of a multirun
            return
        num = int(OmegaConf.select(config, "hydra.job.num", default=0) or 0)
        dirs = _job_dirs(config)
        for part, (job_dir, outcome) in enumerate(zip(dirs, job_outcomes(dirs, job_return), strict=True)):
            self._record(ledger, num, part if len(dirs) > 1 else None, job_dir, outcome)

    def _record(self, ledger: Path, num: int, part: int | None, job_dir: Path, outcome: Outcome) -> None:
        before, t0 = self._stamps.pop(str(job_dir), (None, time.time()))
        seconds = round(time.time() - t0, 3)
        if outcome.status == "failed":
            entry = LedgerEntry(num, str(job_dir), "failed", seconds, error=outcome.error, part=part)
        else:  # skipped (or reused): a stored result instead of a computed one; with a result.json new since the
            # job started, another run of the same job (a concurrent identical sweep) finished it while this one
            # waited on the directory's lock
            by_other = outcome.status == "skipped" and _result_stamp(job_dir) != before
            entry = LedgerEntry(num, str(job_dir), "done" if outcome.status == "done" else "skipped", seconds,
                                reason=DONE_BY_ANOTHER_RUN if by_other else None, part=part)
        record(ledger, entry, self._unwritten)


def record(ledger: Path, entry: LedgerEntry, unwritten: dict[str, LedgerEntry]) -> None:
    """Write a seed's ledger entry and log the running tally; an entry a full disk keeps off the ledger goes into
    `unwritten` (by file name: counted in this process's summary)."""
    path = ledger / entry.file_name
    try:
        atomic_write_json(path, entry.to_json())
    except OSError as err:  # a full disk must not cost the sweep its count: kept here for the summary
        unwritten[entry.file_name] = entry
        _say_unwritable(path, err, f"job {entry.num} ({entry.status}) is counted in memory")
    t = tally(_entries(ledger, unwritten))
    detail = f": {entry.error}" if entry.status == "failed" else ""
    detail += f" ({entry.reason})" if entry.reason is not None else ""
    log.info("[%d/%s] %s %s%s | done %d, skipped %d, failed %d", sum(t.values()), env.multirun_total(),
             entry.status, entry.job_dir, detail, t["done"], t["skipped"], t["failed"])


def _entries(ledger: Path, unwritten: dict[str, LedgerEntry]) -> list[LedgerEntry]:
    """The ledger's entries (every process's), with those this process could not write (a full disk)."""
    by_file = {e.file_name: e for e in read_ledger(ledger)}
    for name, e in unwritten.items():
        by_file.setdefault(name, e)
    return list(by_file.values())


def jobs_fail_alone(run_job: Callable[..., JobReturn]) -> Callable[..., JobReturn]:
    """Hydra's `run_job` for a launcher (training/cli/run.py installs it in each): a cell whose directories cannot be
    made (a colleague's directory in a shared paths.out_dir, a read-only file system) fails alone, one line per seed
    in the ledger, where Hydra's own run_job raises out of the launcher and ends the whole sweep."""
    @functools.wraps(run_job)
    def run(*, config: DictConfig, job_dir_key: str, job_subdir_key: str | None, **kwargs: Any) -> JobReturn:
        if (ledger := env.multirun_ledger()) is not None:
            from hydra.core.hydra_config import HydraConfig

            HydraConfig.instance().set_config(config)  # as run_job does: the subdir may read hydra:job.num
            job_dir = Path(str(OmegaConf.select(config, job_dir_key)))
            if job_subdir_key is not None:
                job_dir = job_dir / str(OmegaConf.select(config, job_subdir_key))
            seeds = _job_dirs(config)
            try:
                for d in [job_dir, *seeds]:
                    d.mkdir(parents=True, exist_ok=True)
            except OSError as err:
                line = user_error_line(err) or f"cannot create the job directory {err.filename or job_dir}: {err}"
                num = int(OmegaConf.select(config, "hydra.job.num", default=0) or 0)
                for part, d in enumerate(seeds):
                    record(ledger, LedgerEntry(num, str(d.absolute()), "failed", 0.0, error=line,
                                               part=part if len(seeds) > 1 else None), {})
                failed = LedgerFailure(status=JobStatus.FAILED, _return_value=SweepJobFailed(line))
                failed.overrides = list(OmegaConf.to_container(config.hydra.overrides.task) or [])  # type: ignore
                return failed
        ret = run_job(config=config, job_dir_key=job_dir_key, job_subdir_key=job_subdir_key, **kwargs)
        if isinstance(ret._return_value, SweepJobFailed):
            return LedgerFailure(**{f.name: getattr(ret, f.name) for f in dataclasses.fields(ret)})
        return ret

    return run


class LedgerFailure(JobReturn):
    """A job's failure that the ledger has recorded with its line: the sweeper re-raises it (the multirun exits
    non-zero after its summary) without Hydra's "Error executing job with overrides" block before it."""

    @property
    def return_value(self) -> Any:
        if self.status == JobStatus.FAILED:
            raise self._return_value
        return self._return_value

    @return_value.setter
    def return_value(self, value: Any) -> None:
        self._return_value = value


def _job_dirs(config: DictConfig) -> list[Path]:
    """The directory of every seed's job of the cell (training/common/cells.py); a relative one is where the command
    started (`hydra.runtime.cwd`): with hydra.job.chdir=true the job's callbacks run inside its own directory."""
    start = OmegaConf.select(config, "hydra.runtime.cwd", default=None)
    try:
        dirs = [Path(d) for d in seed_job_dirs(config)]
    except Exception:  # noqa: BLE001 - a bad `seeds` or path: the job itself says why
        dirs = [Path(str(OmegaConf.select(config, "paths.job_dir", default=None) or config.hydra.runtime.output_dir))]
    return [d if d.is_absolute() or not start else Path(str(start)) / d for d in dirs]


def job_outcomes(job_dirs: list[Path], job_return: JobReturn) -> list[Outcome]:
    """Each seed's Outcome: what the cell's task returned (training/app/lifecycle.py), or, for a cell that failed
    as a whole, `failed` with the error's line for each."""
    if job_return.status == JobStatus.FAILED:
        err = job_return._return_value
        line = user_error_line(err) if isinstance(err, BaseException) else None
        return [Outcome("failed", d, error=line or f"{type(err).__name__}: {err}") for d in job_dirs]
    value = job_return._return_value
    if not isinstance(value, list) or not all(isinstance(o, Outcome) for o in value):
        raise TypeError(f"the job of {job_dirs[0]} returned {type(value).__name__}, not a list of Outcomes: the task "
                        "function returns run_cell's (training/app/lifecycle.py)")
    return [o if o.status != "failed" or o.exception is None
            else dataclasses.replace(o, error=user_error_line(o.exception) or o.error) for o in value]
