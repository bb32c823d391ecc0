"""A real job on sklearn digits end to end: result.json complete, skip on rerun, deterministic."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import job_config, result_of
from training.app.lifecycle import PROGRESS_FILE
from training.app.results import ConfigMismatchError
from training.app.tasks import load_job
from training.data import load_dataset, registry
from training.data.cache import key_hash
from training.data.registry import LoadedData
from training.inputs import store as store_mod
from training.inputs.erase import apply_eraser, cache_key, source_rank
from training.inputs.pipeline import erase_maybe_zscored
from training.inputs.store import Store
from training.tasks.mdl.job import run_job

QUICK = ["dataset=digits", "mdl=quick", "mdl.max_epochs=8", "mdl.min_steps=0", "mdl.patience_min_steps=0",
         "optim.warmup_steps=10"]  # no step floor: 8 epochs are the budget


def test_digits_job_writes_complete_result(tmp_path: Path) -> None:
    cfg = job_config(tmp_path, QUICK)
    result = result_of(run_job(cfg))
    path = Path(cfg["paths"]["job_dir"]) / "result.json"
    on_disk = json.loads(path.read_text())
    assert on_disk["config_hash"] == result["config_hash"]
    mdl = on_disk["mdl"]
    assert mdl["protocol"] == "prequential"
    assert sum(mdl["block_sizes"]) == mdl["n_coded"] == 1797 - 359
    assert mdl["block_ce_bits"][0] == pytest.approx(math.log2(10))  # uniform first block
    coded = zip(mdl["block_sizes"], mdl["block_ce_bits"], strict=True)
    assert mdl["total_bits"] == pytest.approx(sum(s * c for s, c in coded))
    assert mdl["bits_per_sample"] < math.log2(10)  # the models learned something
    assert len(mdl["blocks"]) == len(mdl["block_sizes"]) - 1
    assert on_disk["final"]["val_loss_curve"] and on_disk["final"]["val_loss"] > 0
    assert on_disk["config"]["seed"] == 0 and "total_s" in on_disk["timings"]
    assert not (path.parent / PROGRESS_FILE).exists()
    cert = on_disk["certificate"]
    assert cert["before"]["linear_probe_acc"] > 0.5 and cert["after"] == cert["before"]  # control: unchanged


def test_rerun_skips_same_seed_identical_other_hash_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """The precheck returns the data it loaded and the lifecycle hands it to the body (no module state): one load
    for a job that runs; a rerun is `skipped` and loads only what its fingerprint check reads."""
    loads: list[str] = []
    real = registry.load_dataset

    def counted(*a: Any, **k: Any) -> LoadedData:
        loads.append("load")
        return real(*a, **k)

    monkeypatch.setattr(store_mod, "load_dataset", counted)
    cfg = job_config(tmp_path / "a", QUICK)
    done = run_job(cfg)
    first = result_of(done)
    assert (done.status, len(loads)) == ("done", 1)
    mtime = (Path(cfg["paths"]["job_dir"]) / "result.json").stat().st_mtime_ns
    with caplog.at_level("INFO"):
        outcome = run_job(cfg)
    again = result_of(outcome)
    assert "SKIP" in caplog.text and outcome.status == "skipped" and again == first
    assert len(loads) == 2  # the fingerprint's
    assert (Path(cfg["paths"]["job_dir"]) / "result.json").stat().st_mtime_ns == mtime
    assert again["mdl"] == first["mdl"]
    # Same seed in a fresh directory: identical numbers.
    fresh = result_of(run_job(job_config(tmp_path / "b", QUICK)))
    assert fresh["mdl"]["block_ce_bits"] == first["mdl"]["block_ce_bits"]
    assert fresh["final"]["val_loss_curve"] == first["final"]["val_loss_curve"]
    other_seed = result_of(run_job(job_config(tmp_path / "b", [*QUICK, "seed=1"])))
    assert other_seed["mdl"]["block_ce_bits"] != first["mdl"]["block_ce_bits"]
    # Another config gets its own directory (the c<hash> part of paths.job_dir) ...
    changed = job_config(tmp_path / "a", [*QUICK, "optim.lr=0.001"])
    assert changed["paths"]["job_dir"] != cfg["paths"]["job_dir"]
    # ... and one forced into this directory is refused unless force=true.
    same_dir = f"paths.job_dir={cfg['paths']['job_dir']}"
    with pytest.raises(ConfigMismatchError, match="force=true"):
        run_job(job_config(tmp_path / "a", [*QUICK, "optim.lr=0.001", same_dir]))
    forced = result_of(run_job(job_config(tmp_path / "a", [*QUICK, "optim.lr=0.001", same_dir, "force=true"])))
    assert forced["config_hash"] != first["config_hash"]


def test_leace_job_certificate_and_cache_hit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = result_of(run_job(job_config(tmp_path, [*QUICK, "eraser=leace", "mdl.full_run=false"])))
    cert = first["certificate"]
    assert cert["after"]["max_mean_gap"] < 1e-6 < cert["before"]["max_mean_gap"]
    assert first["eraser"]["cache_hit"] is False
    with caplog.at_level("INFO"):
        second = result_of(run_job(job_config(tmp_path, [*QUICK, "eraser=leace", "mdl.full_run=false", "seed=1"])))
    assert second["eraser"]["cache_hit"] is True and "cache hit" in caplog.text


def test_cli_single_job(tmp_path: Path) -> None:
    cmd = [sys.executable, "-m", "training.run", *QUICK, f"paths.out_dir={tmp_path}", "logger=none",
           "progress=false", "mdl.max_epochs=3", "mdl.full_run=false"]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1], timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (path,) = (tmp_path / "runs/digits/control/mlp_relu-w128-d2").glob("c*/seed0/result.json")
    result = json.loads(path.read_text())
    assert result["final"] is None and result["mdl"]["bits_per_sample"] > 0


def test_zscore_is_per_coordinate_before_or_after_erasure(tmp_path: Path) -> None:
    def zscored(*overrides: str) -> tuple[torch.Tensor, dict[str, Any]]:
        cfg = load_job(job_config(tmp_path, [*QUICK, "dataset.zscore=true", *overrides]))
        return erase_maybe_zscored(data, cfg, Store.of(cfg.paths))  # the data, the job's config and its store

    data = load_dataset(load_job(job_config(tmp_path, [*QUICK, "dataset.zscore=true"])).dataset)
    before, info = zscored("eraser=leace")
    assert info["zscore"] == "before erasure"
    flat = before.reshape(len(before), -1).double()
    varying = data.x.reshape(len(before), -1).std(0) > 1e-8
    assert flat.mean(0).abs().max() < 1e-5  # LEACE keeps the global mean of standardised data (zero)
    assert info["certificate"]["after"]["max_mean_gap"] < 1e-6
    plain, _ = zscored("eraser=control")
    stds = plain.reshape(len(before), -1).double().std(0)
    assert torch.allclose(stds[varying], torch.ones_like(stds[varying]), atol=1e-4)
    after, info = zscored("dataset.zscore_order=after", "eraser=leace")
    assert info["zscore"].startswith("after erasure")
    flat = after.reshape(len(after), -1).double()
    stds = flat.std(0)
    varying = stds > 1e-3
    assert flat.mean(0).abs().max() < 1e-5
    assert torch.allclose(stds[varying], torch.ones_like(stds[varying]), atol=1e-4)  # unit variance after erasure
    assert not torch.allclose(before, after)  # the order matters for LEACE
    with pytest.raises(ValueError, match="zscore_order"):
        zscored("dataset.zscore_order=sideways")


def test_random_eraser_takes_the_alf_rank_from_one_cached_fit(tmp_path: Path) -> None:
    cfg = load_job(job_config(tmp_path, [*QUICK, "eraser=alf_qleace"]))
    data = load_dataset(cfg.dataset)
    cache = Path(cfg.paths.cache_dir)
    _, alf = apply_eraser(data, cfg.eraser, Store(cache), certificate=False)
    assert key_hash(cache_key(data, "alf_qleace", {})) == key_hash(cache_key(data, "alf_qleace",
                                                                              cfg.eraser.options))
    assert source_rank(data, "alf_qleace", Store(cache)) == alf["report"]["rank_removed"] > 0
    rnd_cfg = load_job(job_config(tmp_path, [*QUICK, "eraser=random"]))
    _, rnd = apply_eraser(data, rnd_cfg.eraser, Store(cache), certificate=False)
    assert rnd["report"]["rank_removed"] == alf["report"]["rank_removed"]
    entries = [p for p in (cache / "erased").iterdir() if p.is_dir()]
    assert len(entries) == 2  # one ALF fit, one random projection
