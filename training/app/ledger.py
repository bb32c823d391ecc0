"""Hydra callback: a multirun counts its jobs as done / skipped / failed and never hides a failure.

Registered in `conf/config.yaml` (`hydra.callbacks.job_status`). It works with every launcher: each job, in
whatever process or node runs it, writes one status file to `<sweep dir>/.multirun/<id>/`; every job then logs
the running tally (`[3/12] done ... | done 2, skipped 1, failed 0`), and the launching process writes
`summary.json` there and logs the final count.

Policy: one failed job does not stop the sweep. Hydra's basic sweeper lets every job of the batch run, then
re-raises the first failure, so the multirun exits non-zero; the summary (with each failed job's directory
and error) is printed on the way out. Rerunning the same command skips the finished jobs and resumes the rest.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

from hydra.core.utils import JobReturn, JobStatus
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf

from erasure.files import atomic_write_json
from training.app.results import RESULT_FILE

log = logging.getLogger("training.multirun")
LEDGER_ENV = "ERASURE_MDL_MULTIRUN_LEDGER"
TOTAL_ENV = "ERASURE_MDL_MULTIRUN_TOTAL"
STATUSES = ("done", "skipped", "failed")


def count_jobs(config: DictConfig) -> int | None:
    """How many jobs the basic sweeper will launch: its params x the command line's overrides."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    hc = config.hydra
    if "BasicSweeper" not in str(hc.sweeper.get("_target_", "")):
        return None
    params = OmegaConf.to_container(hc.sweeper.get("params") or {}, resolve=False)
    assert isinstance(params, dict)
    args = [f"{k}={v}" for k, v in params.items()] + list(hc.overrides.task)
    return len(BasicSweeper.split_arguments(OverridesParser.create().parse_overrides(args), None)[0])


def read_ledger(ledger: Path) -> list[dict[str, Any]]:
    entries = []
    for path in sorted(ledger.glob("job-*.json")):
        try:
            entries.append(json.loads(path.read_text()))
        except (OSError, json.JSONDecodeError):
            continue
    return entries


def tally(entries: list[dict[str, Any]]) -> dict[str, int]:
    counts = Counter(e["status"] for e in entries)
    return {s: counts.get(s, 0) for s in STATUSES}


def summary_line(entries: list[dict[str, Any]], total: int | None) -> str:
    t = tally(entries)
    line = f"multirun: {len(entries)}/{total if total is not None else '?'} jobs ran: " + ", ".join(
        f"{t[s]} {s}" for s in STATUSES)
    if total is not None and len(entries) < total:
        line += f", {total - len(entries)} not run"
    for e in entries:
        if e["status"] == "failed":
            line += f"\n  FAILED {e['job_dir']}: {e.get('error', '')}"
    return line


def _result_stamp(job_dir: Path) -> int | None:
    try:
        return (job_dir / RESULT_FILE).stat().st_mtime_ns
    except FileNotFoundError:
        return None


def _job_dir(config: DictConfig) -> Path:
    paths = config.get("paths")
    if paths is not None and paths.get("job_dir"):
        return Path(str(paths.job_dir))
    return Path(str(config.hydra.runtime.output_dir))


class JobStatusCallback(Callback):
    def __init__(self) -> None:
        self._stamps: dict[str, tuple[int | None, float]] = {}
        self._ledger: Path | None = None
        self._total: int | None = None
        self._reported = False

    # --- the launching process -------------------------------------------------------------------------
    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        run_id = f"{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
        self._ledger = Path(str(config.hydra.sweep.dir)) / ".multirun" / run_id
        self._ledger.mkdir(parents=True, exist_ok=True)
        self._total = count_jobs(config)
        os.environ[LEDGER_ENV] = str(self._ledger)  # inherited by joblib/submitit workers and sbatch jobs
        os.environ[TOTAL_ENV] = "" if self._total is None else str(self._total)
        log.info("multirun: %s jobs, job status in %s", self._total if self._total is not None else "?",
                 self._ledger)
        atexit.register(self._report_at_exit)

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        entries = self._finish()
        failed = tally(entries)["failed"]
        if failed:  # the basic sweeper raises before this point; other sweepers must not exit 0 either
            raise RuntimeError(f"{failed} job(s) failed (see {self._ledger})")

    def _finish(self) -> list[dict[str, Any]]:
        assert self._ledger is not None
        entries = read_ledger(self._ledger)
        atomic_write_json(self._ledger / "summary.json", {"total": self._total, **tally(entries),
                                                          "jobs": entries})
        if not self._reported:
            self._reported = True
            log.info("%s", summary_line(entries, self._total))
        return entries

    def _report_at_exit(self) -> None:
        """The sweep raised (a failed job) or was interrupted: still say what happened."""
        if self._reported or self._ledger is None:
            return
        entries = read_ledger(self._ledger)
        atomic_write_json(self._ledger / "summary.json", {"total": self._total, **tally(entries),
                                                          "jobs": entries})
        self._reported = True
        print(summary_line(entries, self._total), file=sys.stderr, flush=True)

    # --- wherever a job runs ---------------------------------------------------------------------------
    def on_job_start(self, config: DictConfig, **kwargs: Any) -> None:
        job_dir = _job_dir(config)
        self._stamps[str(job_dir)] = (_result_stamp(job_dir), time.time())

    def on_job_end(self, config: DictConfig, job_return: JobReturn, **kwargs: Any) -> None:
        ledger = os.environ.get(LEDGER_ENV)
        if not ledger:  # a single run, not part of a multirun
            return
        job_dir = _job_dir(config)
        before, t0 = self._stamps.pop(str(job_dir), (None, time.time()))
        entry: dict[str, Any] = {"num": int(config.hydra.job.get("num", 0) or 0), "job_dir": str(job_dir),
                                 "seconds": round(time.time() - t0, 3)}
        if job_return.status == JobStatus.FAILED:
            err = job_return._return_value
            entry.update(status="failed", error=f"{type(err).__name__}: {err}")
        else:
            skipped = before is not None and before == _result_stamp(job_dir)
            entry["status"] = "skipped" if skipped else "done"
        atomic_write_json(Path(ledger) / f"job-{entry['num']:05d}.json", entry)
        total = os.environ.get(TOTAL_ENV) or "?"
        t = tally(read_ledger(Path(ledger)))
        log.info("[%d/%s] %s %s | done %d, skipped %d, failed %d", sum(t.values()), total, entry["status"],
                 job_dir, t["done"], t["skipped"], t["failed"])
