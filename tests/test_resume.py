"""Resume and skip: a killed multirun, rerun with the same command, skips finished jobs, resumes the killed one
after its last finished MDL block, and ends with exactly the numbers of an uninterrupted run (same seed, CPU).

No RNG state is saved: every block model draws init, batch order, augmentation and dropout from generators
derived from (seed, block), so block i does not depend on what ran before it in the process.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import ENV, REPO, job_config, kill_once_one_done_one_partial, result_of
from training.app.lifecycle import PROGRESS_FILE
from training.common.sweeps import expand
from training.tasks.mdl.job import run_job
from training.tasks.mdl.splits import MdlSplit
from training.tasks.mdl.trainer import Trainer


def smoke_command(out_dir: Path) -> list[str]:
    # seed=0,1: four one-seed cells, one launched job each (a cell of seeds finishes its seeds together)
    return [sys.executable, "-m", "training.run", "-m", "experiment=smoke", f"paths.out_dir={out_dir}",
            "logger=none", "progress=false", "seed=0,1"]


def _numbers(result: dict[str, Any]) -> dict[str, Any]:
    """What must not change between an interrupted and an uninterrupted run (timings may)."""
    mdl = result["mdl"]
    return {"hash": result["config_hash"], "ce": mdl["block_ce_bits"], "bits": mdl["bits_per_sample"],
            "legacy": mdl["legacy"], "epochs": [b["epochs"] for b in mdl["blocks"]],
            "curve": (result["final"] or {}).get("val_loss_curve")}


def test_killed_multirun_skips_finished_and_resumes_the_killed_job(tmp_path: Path) -> None:
    out = tmp_path / "killed"
    runs = out / "runs"
    finished, partial = kill_once_one_done_one_partial(smoke_command(out), runs, tmp_path / "first.log", REPO, ENV)
    assert len(partial) == 1, (finished, partial)
    killed = next(iter(partial))
    blocks_done = len(json.loads((killed / PROGRESS_FILE).read_text())["blocks"])
    assert blocks_done >= 1
    stamps = {d: (d / "result.json").stat().st_mtime_ns for d in finished}

    rerun = subprocess.run(smoke_command(out), cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    text = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, text[-3000:]
    for d in finished:
        assert f"SKIP {d}" in text
        assert (d / "result.json").stat().st_mtime_ns == stamps[d]  # untouched
    assert f"resuming after block model {blocks_done}/" in text, text[-4000:]
    assert f"4/4 jobs ran: {4 - len(finished)} done, {len(finished)} skipped, 0 failed" in text
    assert not list(runs.rglob(PROGRESS_FILE))

    # The same sweep, uninterrupted, in another out_dir (in this process: also checks CPU determinism).
    for cfg in expand("smoke", [f"paths.out_dir={tmp_path / 'clean'}", "logger=none", "progress=false"]):
        clean = result_of(run_job(cfg))
        again = json.loads((out / "runs" / cfg["paths"]["job_subdir"] / "result.json").read_text())
        assert _numbers(again) == _numbers(clean), (cfg["paths"]["job_subdir"], _numbers(again), _numbers(clean))


QUICK = ["dataset=digits", "mdl=quick", "mdl.max_epochs=6", "optim.warmup_steps=10", "certificate=false",
         "arch.width=32"]


def test_resume_after_a_crash_in_block_k_equals_an_uninterrupted_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    reference = result_of(run_job(job_config(tmp_path / "ref", QUICK)))
    cfg = job_config(tmp_path / "crash", QUICK)
    real, calls = Trainer.code_bits, {"n": 0}

    def crash_on_third(self: Trainer, model: torch.nn.Module, idx: torch.Tensor, split: MdlSplit
                       ) -> tuple[float, float]:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("simulated crash")
        return real(self, model, idx, split)

    monkeypatch.setattr(Trainer, "code_bits", crash_on_third)
    with pytest.raises(RuntimeError, match="simulated crash"):
        run_job(cfg)
    progress = json.loads((Path(cfg["paths"]["job_dir"]) / PROGRESS_FILE).read_text())
    assert progress["config_hash"] == reference["config_hash"] and len(progress["blocks"]) == 2
    monkeypatch.setattr(Trainer, "code_bits", real)
    torch.manual_seed(12345)  # the global RNG state at resume time must not matter
    with caplog.at_level("INFO"):
        resumed = result_of(run_job(cfg))
    assert "resuming after block model 2/5" in caplog.text
    assert _numbers(resumed) == _numbers(reference)


def test_progress_of_another_config_is_ignored_and_a_skip_survives_a_new_hash_definition(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = job_config(tmp_path, QUICK)
    job_dir = Path(cfg["paths"]["job_dir"])
    job_dir.mkdir(parents=True)
    fake = {"block": 2, "ce_bits": 0.0, "train_size": 1, "coded_size": 1, "epochs": 1}
    (job_dir / PROGRESS_FILE).write_text(json.dumps({"config_hash": "another", "blocks": [fake]}))
    with caplog.at_level("INFO"):
        result = result_of(run_job(cfg))
    assert "resuming" not in caplog.text
    assert result["mdl"]["block_ce_bits"][1] > 0
    # a result whose stored hash was computed before the hash covered other keys is still this config's result
    (job_dir / "result.json").write_text(json.dumps({**result, "config_hash": "old-definition"}))
    caplog.clear()
    with caplog.at_level("INFO"):
        again = result_of(run_job(cfg))
    assert "SKIP" in caplog.text and again["config_hash"] == "old-definition"


def test_dropout_streams_do_not_depend_on_the_process_history(tmp_path: Path) -> None:
    """SwinV2 uses drop-path (global RNG): the numbers must not depend on the global RNG state at the start,
    or a resumed job (a fresh process) would differ from an uninterrupted one."""
    overrides = ["dataset=digits", "dataset.limit=400", "arch=swin", "arch.width=8", "arch.depth=1", "mdl=quick",
                 "mdl.max_epochs=2", "mdl.min_steps=0", "mdl.patience_min_steps=0", "mdl.full_run=false",
                 "certificate=false"]  # two epochs per block are enough to draw drop-path masks
    torch.manual_seed(1)
    a = result_of(run_job(job_config(tmp_path / "a", overrides)))
    torch.manual_seed(2)
    torch.rand(17)
    b = result_of(run_job(job_config(tmp_path / "b", overrides)))
    assert a["model"]["drop_path_rate"] > 0
    assert a["mdl"]["block_ce_bits"] == b["mdl"]["block_ce_bits"]
