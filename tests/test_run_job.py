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
from training.data import registry
from training.data.registry import LoadedData
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


def test_the_data_the_precheck_loads_is_the_data_the_job_uses_and_a_skip_outcome_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The precheck returns the data it loaded and the lifecycle hands it to the body (no module state): one load
    for a job that runs; a rerun is `skipped` and loads only what its fingerprint check reads."""
    from training.inputs import store as store_mod

    loads: list[str] = []
    real = registry.load_dataset

    def load_dataset(*a: Any, **k: Any) -> LoadedData:
        loads.append("load")
        return real(*a, **k)

    monkeypatch.setattr(store_mod, "load_dataset", load_dataset)
    cfg = job_config(tmp_path, [*QUICK, "mdl.full_run=false", "mdl.num_blocks=3"])
    first = run_job(cfg)
    assert (first.status, len(loads)) == ("done", 1) and first.result is not None
    again = run_job(cfg)
    assert again.status == "skipped" and again.result == first.result and len(loads) == 2  # the fingerprint's


def test_rerun_skips_same_seed_identical_other_hash_refused(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = job_config(tmp_path / "a", QUICK)
    first = result_of(run_job(cfg))
    mtime = (Path(cfg["paths"]["job_dir"]) / "result.json").stat().st_mtime_ns
    with caplog.at_level("INFO"):
        outcome = run_job(cfg)
    again = result_of(outcome)
    assert "SKIP" in caplog.text and outcome.status == "skipped"
    assert (Path(cfg["paths"]["job_dir"]) / "result.json").stat().st_mtime_ns == mtime
    assert again["mdl"] == first["mdl"]
    # Same seed in a fresh directory: identical numbers.
    fresh = result_of(run_job(job_config(tmp_path / "b", QUICK)))
    assert fresh["mdl"]["block_ce_bits"] == first["mdl"]["block_ce_bits"]
    assert fresh["final"]["val_loss_curve"] == first["final"]["val_loss_curve"]
    # Another config gets its own directory (the c<hash> part of paths.job_dir) ...
    changed = job_config(tmp_path / "a", [*QUICK, "optim.lr=0.001"])
    assert changed["paths"]["job_dir"] != cfg["paths"]["job_dir"]
    # ... and one forced into this directory is refused unless force=true.
    same_dir = f"paths.job_dir={cfg['paths']['job_dir']}"
    with pytest.raises(ConfigMismatchError, match="force=true"):
        run_job(job_config(tmp_path / "a", [*QUICK, "optim.lr=0.001", same_dir]))
    forced = result_of(run_job(job_config(tmp_path / "a", [*QUICK, "optim.lr=0.001", same_dir, "force=true"])))
    assert forced["config_hash"] != first["config_hash"]


def test_other_seed_differs(tmp_path: Path) -> None:
    a = result_of(run_job(job_config(tmp_path, QUICK)))
    b = result_of(run_job(job_config(tmp_path, [*QUICK, "seed=1"])))
    assert a["mdl"]["block_ce_bits"] != b["mdl"]["block_ce_bits"]


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


def _erasing(cfg: Any) -> tuple[Any, Any]:
    """What `erase_maybe_zscored` takes besides the data: the job's config and its store."""
    from training.inputs.store import Store

    return cfg, Store.of(cfg.paths)


def test_zscore_is_per_coordinate_and_before_erasure(tmp_path: Path) -> None:
    from training.data import load_dataset
    from training.inputs.pipeline import erase_maybe_zscored

    cfg = load_job(job_config(tmp_path, [*QUICK, "dataset.zscore=true", "eraser=leace"]))
    data = load_dataset(cfg.dataset)
    x, info = erase_maybe_zscored(data, *_erasing(cfg))
    assert info["zscore"] == "before erasure"
    flat = x.reshape(len(x), -1).double()
    varying = data.x.reshape(len(x), -1).std(0) > 1e-8
    assert flat.mean(0).abs().max() < 1e-5  # LEACE keeps the global mean of standardised data (zero)
    assert info["certificate"]["after"]["max_mean_gap"] < 1e-6
    control = load_job(job_config(tmp_path, [*QUICK, "eraser=control", "dataset.zscore=true"]))
    plain, _ = erase_maybe_zscored(data, *_erasing(control))
    stds = plain.reshape(len(x), -1).double().std(0)
    assert torch.allclose(stds[varying], torch.ones_like(stds[varying]), atol=1e-4)


def test_random_eraser_takes_the_alf_rank_from_one_cached_fit(tmp_path: Path) -> None:
    from training.data import load_dataset
    from training.data.cache import key_hash
    from training.inputs.erase import apply_eraser, cache_key, source_rank
    from training.inputs.store import Store

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


def test_zscore_after_erasure_standardises_the_erased_data(tmp_path: Path) -> None:
    from training.data import load_dataset
    from training.inputs.pipeline import erase_maybe_zscored

    cfg = load_job(job_config(tmp_path, [*QUICK, "dataset.zscore=true", "dataset.zscore_order=after",
                                             "eraser=leace"]))
    data = load_dataset(cfg.dataset)
    x, info = erase_maybe_zscored(data, *_erasing(cfg))
    assert info["zscore"].startswith("after erasure")
    flat = x.reshape(len(x), -1).double()
    stds = flat.std(0)
    varying = stds > 1e-3
    assert flat.mean(0).abs().max() < 1e-5
    assert torch.allclose(stds[varying], torch.ones_like(stds[varying]), atol=1e-4)  # unit variance after erasure
    leace_first = load_job(job_config(tmp_path, [*QUICK, "dataset.zscore=true", "eraser=leace"]))
    before, _ = erase_maybe_zscored(data, *_erasing(leace_first))
    assert not torch.allclose(before, x)  # the order matters for LEACE
    with pytest.raises(ValueError, match="zscore_order"):
        erase_maybe_zscored(data, *_erasing(load_job(job_config(tmp_path, [*QUICK, "dataset.zscore=true",
                                                                     "dataset.zscore_order=sideways"]))))
