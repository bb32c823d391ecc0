"""Issue 22, cases 2-4: what a result was computed with, on what data, and never a non-finite result.

2. provenance: every result.json (MDL and Gradient Starvation tasks alike, written by the one lifecycle) records
   the code (commit, dirty, version), python/torch/numpy, the device's name, the host, and start/end (UTC);
   outside a git checkout commit and dirty are null; force=true reuses no stale progress.json block
3. non-finite is a failure, never a result: a NaN/inf training or validation loss, code length, erased or cached
   data, or a result's mdl/final number fails the job with one line (exit code 2, the ledger counts it failed,
   no result.json); a cached entry holding NaN is rebuilt
4. data identity: result.json's dataset.fingerprint (the arrays' hash, which the erased-data cache key holds, and
   the files read: name, size, sha256); a file swapped under the same name changes both; a gzipped IDX file next
   to a plain one is used with one warning naming both
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import torch

from tests.helpers import job_config
from training.app.lifecycle import PROGRESS_FILE, Progress
from training.app.schema import config_hash, load_config
from training.mdl.job import run_job

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled",
       "PYTHONPATH": str(REPO)}
ENV.pop("HYDRA_FULL_ERROR", None)
TINY = ["dataset=digits", "mdl=quick", "mdl.max_epochs=2", "mdl.min_steps=0", "mdl.patience_min_steps=0",
        "mdl.full_run=false", "arch.width=16", "optim.warmup_steps=5", "certificate=false"]
PROVENANCE_KEYS = {"code", "python", "torch", "numpy", "device_name", "host", "started", "ended"}
ONE_LINE = re.compile(r"non-finite (training|validation) loss in block model \d+ (by|at) step \d+ \(epoch \d+\): "
                      r"lr too high or bad data; nothing was written as a result")


def _cli(out_dir: Path, *overrides: str, multirun: bool = False, prelude: str = "") -> subprocess.CompletedProcess:
    """`python -m training.run ...`; `prelude`: Python run first in the same process (a monkeypatch)."""
    args = [*(["-m"] if multirun else []), f"paths.out_dir={out_dir}", "logger=none", "progress=false", *overrides]
    if prelude:
        script = prelude + "\nimport sys\nfrom training.cli.run import main\nsys.argv[0] = 'training.run'\nmain()\n"
        cmd = [sys.executable, "-c", script, *args]
    else:
        cmd = [sys.executable, "-m", "training.run", *args]
    return subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)


def _git(*args: str) -> str:
    return subprocess.run(["git", "-C", str(REPO), *args], capture_output=True, text=True, check=True).stdout.strip()


# --- 2. provenance ---------------------------------------------------------------------------------------------

def _check_provenance(prov: dict[str, Any], t0: datetime, t1: datetime) -> None:
    assert set(prov) == PROVENANCE_KEYS, sorted(prov)
    assert set(prov["code"]) == {"commit", "dirty", "version"}
    assert prov["code"]["version"] == "0.1.0"
    if (REPO / ".git").exists():  # run from a checkout: its commit; dirty iff tracked files differ
        assert prov["code"]["commit"] == _git("rev-parse", "HEAD")
        assert prov["code"]["dirty"] is bool(_git("status", "--porcelain", "--untracked-files=no"))
    assert prov["python"].count(".") == 2 and prov["torch"] == torch.__version__
    assert prov["numpy"] and prov["device_name"] and prov["host"]
    started, ended = (datetime.fromisoformat(prov[k]) for k in ("started", "ended"))
    assert started.utcoffset() == timedelta(0) and ended.utcoffset() == timedelta(0)  # UTC, with its offset
    assert t0 - timedelta(seconds=1) <= started <= ended <= t1 + timedelta(seconds=1)


def test_2_every_result_records_its_provenance_mdl_and_gs(tmp_path: Path) -> None:
    from training.app.tasks import get_task
    from training.starvation import moons as _gs  # noqa: F401 - registers gs_two_moons

    t0 = datetime.now(timezone.utc)
    mdl = run_job(job_config(tmp_path / "mdl", TINY))
    gs = get_task("gs_two_moons")(job_config(tmp_path / "gs", ["experiment=gs_two_moons", "gs.steps=20",
                                                                "gs.grid.n=51"]))
    t1 = datetime.now(timezone.utc)
    for result in (mdl, gs):
        on_disk = json.loads((Path(result["job_dir"]) / "result.json").read_text())
        _check_provenance(on_disk["provenance"], t0, t1)
    # scripts/aggregate.py reads exactly these keys
    from scripts.aggregate import UNKNOWN_COMMIT, commit_of

    assert (commit_of(mdl) != UNKNOWN_COMMIT) is (REPO / ".git").exists()


def test_2_outside_a_git_checkout_commit_and_dirty_are_null(tmp_path: Path) -> None:
    from training.app import provenance as prov_mod

    (tmp_path / "training").mkdir()  # an unpacked copy of the code: no .git
    assert prov_mod.code_provenance(tmp_path) == {"commit": None, "dirty": None, "version": "0.1.0"}
    # git failing or absent (e.g. no git on the node) is null too, not an error
    fake = tmp_path / "fake"
    (fake / ".git").mkdir(parents=True)
    assert prov_mod.code_provenance(fake)["commit"] is None


def test_2_force_recomputes_from_scratch_no_stale_progress_block(tmp_path: Path) -> None:
    cfg = job_config(tmp_path, TINY)
    job_dir = Path(cfg["paths"]["job_dir"])
    job_dir.mkdir(parents=True)
    fake = {"block": 2, "train_size": 128, "coded_size": 160, "ce_bits": 1.2345678, "temperature": 1.0,
            "seconds": 0.0, "best_val_loss": 1.0, "best_epoch": 1, "epochs": 1, "steps": 1}

    def plant() -> None:
        Progress(job_dir / PROGRESS_FILE, config_hash(load_config(cfg))).save([fake])

    plant()
    resumed = run_job(cfg)  # the planted block is this configuration's: a plain run resumes from it
    assert resumed["mdl"]["blocks"][0]["ce_bits"] == fake["ce_bits"]
    plant()
    forced = run_job({**cfg, "force": True})
    assert fake["ce_bits"] not in [b["ce_bits"] for b in forced["mdl"]["blocks"]]
    assert not (job_dir / PROGRESS_FILE).exists()
