"""wandb: offline by default (no key, no network), deterministic run id, disabled by logger=none."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import ENV, REPO, TINY
from training.app.schema import group_config
from training.tasks.mdl.wandb_logger import RunLogger


def test_offline_run_with_deterministic_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "cfg"))
    for var in ("WANDB_CACHE_DIR", "WANDB_DATA_DIR"):
        monkeypatch.delenv(var, raising=False)
    logger = RunLogger(group_config("logger", "wandb"), {"seed": 3}, tmp_path, run_id="abc123-s3")
    assert logger._run is not None
    assert os.environ["WANDB_CACHE_DIR"] == str(tmp_path / "_wandb" / "cache")  # while the run is open
    assert os.environ["WANDB_CONFIG_DIR"] == str(tmp_path / "cfg")  # the user's own choice is kept
    logger.log({"loss": 1.0}, step=1)
    logger.finish()
    assert "WANDB_CACHE_DIR" not in os.environ and "WANDB_DATA_DIR" not in os.environ  # restored
    runs = list((tmp_path / "wandb").glob("offline-run-*-abc123-s3"))
    assert len(runs) == 1


def test_none_and_disabled_do_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert RunLogger(group_config("logger", "none"), {}, tmp_path, "x")._run is None
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert RunLogger(group_config("logger", "wandb"), {}, tmp_path, "x")._run is None
    assert not (tmp_path / "wandb").exists()


def test_a_wandb_job_writes_nothing_outside_out_dir(tmp_path: Path) -> None:
    """An offline wandb job with a fresh HOME: its service's debug logs (~/.cache/wandb/logs before), cache and
    settings land under paths.out_dir, and nothing in HOME or the working directory."""
    pytest.importorskip("wandb")
    home, cwd, out = tmp_path / "home", tmp_path / "cwd", tmp_path / "out"
    home.mkdir()
    cwd.mkdir()
    env = {k: v for k, v in ENV.items() if not k.startswith(("WANDB_", "XDG_"))}
    env.update(HOME=str(home), WANDB_MODE="offline", WANDB_SILENT="true")
    proc = subprocess.run([sys.executable, "-m", "training.run", f"paths.out_dir={out}", "logger=wandb",
                           "progress=false", "hydra.run.dir=" + str(out / "hydra"), *TINY],
                          cwd=cwd, env={**env, "PYTHONPATH": str(REPO)}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    outside = [str(p) for d in (home, cwd) for p in d.rglob("*")]
    assert outside == [], outside
    logs = list((out / "_wandb").rglob("core-debug-*.log"))
    assert logs, sorted(str(p) for p in out.rglob("*"))[:40]
    assert list(out.rglob("offline-run-*"))  # the run itself, in its job directory
