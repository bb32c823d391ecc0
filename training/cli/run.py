"""Hydra entrypoint: `python -m training.run [overrides]` runs one job; add `-m` for a multirun.

`training/run.py` is the shim users type; this is the entry itself. It runs `get_task(cfg.task)(cfg)`: the task's
declaration (training/tasks/<name>.py, discovered by training/app/tasks.py) imports its implementation when it runs.

A user error (bad config value, missing or corrupt data, unwritable path, a directory holding another
configuration's result) is one line on stderr and in the job's run.log, exit code 2 (`HYDRA_FULL_ERROR=1`
adds the traceback). Config values are checked before anything is made: by the `job_status` callback before
Hydra creates the run directory (and before any job of a multirun runs), and again here. A mistake Hydra finds on
the command line (an unknown option or key, a sweep without -m, an override that does not parse) is one such line
too (`main`), and a multirun's failed job is a line of the sweep's summary.
"""

from __future__ import annotations

import logging
import os
import signal
from pathlib import Path
from typing import Any

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from training.app.lifecycle import Outcome
from training.app.schema import CONF_DIR, ConfigError
from training.app.tasks import get_task, load_job
from training.cli.ledger import jobs_fail_alone
from training.cli.local_workers import exit_with_parent, orphaned, sigint_back_in_local_job
from training.cli.preemption import ignore_time_limit_signal, stop_on_sigterm
from training.cli.report import (
    SweepJobFailed,
    exit_interrupted,
    exit_user_error,
    hydra_error_line,
    quiet_log_file_errors,
    remove_if_unused,
    to_run_log,
    user_error_line,
)
from training.common import env, interrupt
from training.common.cells import seed_configs
from training.common.conf import resolved_dict
from training.common.hydra_private import raised_by_a_job, wrap_run_job
from training.errors import Refused
from training.inputs.store import Store

log = logging.getLogger("training.run")


def job(cfg: DictConfig) -> list[Outcome]:
    """Hydra's task function: one job of the (multi)run, a cell (training/common/cells.py: one configuration and its
    seeds), an Outcome per seed: Hydra's return value, which the multirun ledger (training/cli/ledger.py) reads."""
    hc = HydraConfig.get()
    multirun = hc.mode == RunMode.MULTIRUN
    quiet_log_file_errors()  # Hydra has set up this job's run.log
    sigint_back_in_local_job()
    exit_with_parent()  # a worker whose sweep's launching process dies stops and exits
    try:
        return _job(cfg, hc, multirun)
    finally:
        if orphaned():  # nobody reads this worker's results any more: exit now, not after loky's idle minutes
            logging.shutdown()
            os._exit(128 + int(signal.SIGTERM))


def _job(cfg: DictConfig, hc: Any, multirun: bool) -> list[Outcome]:
    start = Path(hc.runtime.cwd)
    resolved: dict[str, Any] = {}
    store: Store | None = None  # what the cell's seeds share: the loaded data, the fitted erasers, the erased data
    try:
        resolved = anchored(resolved_dict(cfg), start)
        cell = [load_job(anchored(c, start)) for c in seed_configs(cfg)]  # its TaskSpec, once per seed
        store = Store.of(cell[0].paths, memos=True)
        with stop_on_sigterm():  # SIGTERM (pre-emption, requeue): stop now, keep finished blocks (preemption.py)
            outcomes = get_task(cell[0].task).run_cell(cell, store)
        failures = [o for o in outcomes if o.status == "failed"]
        said = {user_error_line(o.exception) if o.exception is not None else None for o in failures}
        if len(failures) == len(outcomes) > 1 and len(said) == 1 and None not in said and not multirun:
            assert failures[0].exception is not None
            raise failures[0].exception  # the cell refused as a whole: one line, as a one-seed job is refused
        for o in failures if len(outcomes) > 1 else []:  # each seed's failure is its own; the cell's others stand
            line = user_error_line(o.exception) if o.exception is not None else None
            to_run_log(logging.ERROR, f"error: {o.job_dir}: {line or o.error}", None if line else o.exception)
        if failures and (len(outcomes) == 1 or not multirun):
            assert failures[0].exception is not None
            raise failures[0].exception  # as a one-seed job fails (a multirun's ledger records each seed's)
    except KeyboardInterrupt as err:  # Ctrl-C: the job's lock is released on the way here
        paths = resolved["paths"] if "paths" in resolved else {}
        exit_interrupted(Path(str(paths["job_dir"] if "job_dir" in paths else hc.runtime.output_dir)), err)
    except Exception as err:
        interrupt.stop_behind(err)  # a signal's stop that torch.save turned into a RuntimeError: a stop, not a failure
        line = user_error_line(err)
        if line is None:
            to_run_log(logging.ERROR, f"job failed: {type(err).__name__}: {err}", err)
            raise
        if isinstance(err, (ConfigError, Refused)) and not multirun and resolved and remove_if_unused(
                Path(hc.runtime.output_dir), Path(str(resolved["paths"]["out_dir"]))):
            exit_user_error(line, err)  # refused before it did anything: no directory left behind
        to_run_log(logging.ERROR, f"error: {line}")
        if multirun and not env.hydra_full_error():
            raise SweepJobFailed(line) from err  # the ledger records the line; the sweep goes on
        if multirun:
            raise
        exit_user_error(line, err)
    finally:
        if store is not None:
            store.clear()
    ignore_time_limit_signal()
    return outcomes


PATH_KEYS = (("paths", "out_dir"), ("paths", "data_dir"), ("paths", "cache_dir"), ("paths", "job_dir"),
             ("paths", "legacy_job_dir"), ("dataset", "root"))


def anchored(resolved: dict[str, Any], start: Path) -> dict[str, Any]:
    """The config with its relative paths made absolute against `start`, the directory the command was started in,
    when the job runs elsewhere (`hydra.job.chdir=true` moves it into its run directory, where a relative
    paths.out_dir would nest every output inside the job's own directory). Unchanged when it runs where it started."""
    if Path.cwd().resolve() == start.resolve():
        return resolved
    out = {k: dict(v) if isinstance(v, dict) else v for k, v in resolved.items()}
    for group, key in PATH_KEYS:
        value = out.get(group, {}).get(key) if isinstance(out.get(group), dict) else None
        if isinstance(value, str) and value and not Path(value).is_absolute():
            out[group][key] = str(start / value)
    return out


# Every launcher runs its jobs through ledger.jobs_fail_alone. Done at import, so in the launching process and in every
# worker (a worker imports this module to unpickle `job`).
wrap_run_job(jobs_fail_alone)

# The entry. `job` stays a plain module-level function so that a launcher running jobs in other processes (joblib,
# submitit) pickles it by reference: the worker imports this module and discovers the tasks again.
# An absolute config path: Hydra resolves a relative one against the module's package (pkg://training/...).
# The job's name (hence run.log) is this module's last part, `run`, as when the entry was training/run.py.
hydra_main = hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")(job)


def main() -> None:
    """Hydra's entry, whose errors are reported here: Hydra raises them (`env.hydra_raises`) instead of printing its
    multi-line story. A mistake on the command line is one line, exit code 2; a multirun whose jobs failed exits 1
    after its summary (the ledger's, at exit: each failed job's line); anything else, a bug, shows its traceback."""
    restore = env.hydra_raises()
    try:
        hydra_main()
    except SweepJobFailed:
        raise SystemExit(1) from None
    except Exception as err:
        if raised_by_a_job(err) or (line := hydra_error_line(err)) is None:  # a job ran: not the command line
            raise
        exit_user_error(line, err)
    finally:
        restore()


if __name__ == "__main__":
    main()
