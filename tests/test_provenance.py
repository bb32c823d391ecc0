"""What a result was computed with, on what data, and never a non-finite result.

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

import gzip
import json
import logging
import math
import re
import subprocess
import sys
import textwrap
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
import schedulefree
import torch
from torch import nn

import erasure
from tests.helpers import ENV, REPO, TINY, fit_settings, group_options, job_config, result_of
from training.app.lifecycle import PROGRESS_FILE, Progress, run_in_job_dir
from training.app.schema import ConfigError, group_config
from training.app.tasks import decode_result, get_task, job_hash, load_job
from training.common import provenance as prov_mod
from training.data import load_dataset
from training.data.cache import _store, cached_erase, key_hash
from training.data.idx import find_idx_pair
from training.data.registry import DatasetMissingError, LoadedData
from training.engine.batches import DeviceData
from training.engine.fit import FitConfig, Member, TrainData, fit
from training.engine.group import fit_group
from training.errors import UserError  # NonFiniteError's base (tests fail, not error, on code without it)
from training.inputs import erase as erase_module
from training.inputs.erase import apply_eraser, cache_key
from training.inputs.plan import FitPlan
from training.inputs.store import Store
from training.tasks.mdl.aggregate_collect import UNKNOWN_COMMIT, commit_of
from training.tasks.mdl.job import run_job
from training.tasks.mdl.result import MdlSections
from training.tasks.mdl.trainer import Trainer

PROVENANCE_KEYS = {"code", "python", "torch", "numpy", "device_name", "host", "started", "ended", "numerics"}
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
    assert set(prov["numerics"]) == {"device_name", "torch", "cuda", "cudnn", "precision", "engine", "models_together",
                                     "deterministic"}  # training/engine/numerics.py
    assert prov["code"]["version"] == "0.1.0"
    if (REPO / ".git").exists():  # run from a checkout: its commit; dirty iff tracked files differ
        assert prov["code"]["commit"] == _git("rev-parse", "HEAD")
        assert prov["code"]["dirty"] is bool(_git("status", "--porcelain", "--untracked-files=no"))
    assert prov["python"].count(".") == 2 and prov["torch"] == torch.__version__
    assert prov["numpy"] and prov["device_name"] and prov["host"]
    started, ended = (datetime.fromisoformat(prov[k]) for k in ("started", "ended"))
    assert started.utcoffset() == timedelta(0) and ended.utcoffset() == timedelta(0)  # UTC, with its offset
    assert t0 - timedelta(seconds=1) <= started <= ended <= t1 + timedelta(seconds=1)


def test_2_every_result_records_its_provenance_mdl_and_gs_and_its_data_fingerprint(tmp_path: Path) -> None:
    t0 = datetime.now(timezone.utc)
    mdl = result_of(run_job(job_config(tmp_path / "mdl", TINY)))
    gs = result_of(get_task("gs_two_moons")(job_config(tmp_path / "gs", ["experiment=gs_two_moons", "gs.steps=20",
                                                                          "gs.grid.n=51"])))
    t1 = datetime.now(timezone.utc)
    for result in (mdl, gs):
        on_disk = json.loads((Path(result["job_dir"]) / "result.json").read_text())
        _check_provenance(on_disk["provenance"], t0, t1)
    assert (commit_of(decode_result(mdl)) != UNKNOWN_COMMIT) is (REPO / ".git").exists()  # aggregate.py reads these
    fp = json.loads((Path(mdl["job_dir"]) / "result.json").read_text())["dataset"]["fingerprint"]
    data = load_dataset(group_config("dataset", "digits"))
    assert fp == {"content": data.content_hash(), "files": []}  # sklearn's digits: no file of ours read


def test_2_outside_a_git_checkout_commit_and_dirty_are_null(tmp_path: Path) -> None:
    site = tmp_path / "site-packages"  # an installed wheel: the package next to its dist-info, no .git
    (site / "training").mkdir(parents=True)
    (site / "erasure_mdl-0.1.0.dist-info").mkdir()
    (site / "erasure_mdl-0.1.0.dist-info" / "METADATA").write_text("Name: erasure-mdl\nVersion: 0.1.0\n")
    assert prov_mod.code_provenance(site) == {"commit": None, "dirty": None, "version": "0.1.0"}
    unpacked = tmp_path / "unpacked"  # a copy of the checkout without .git: pyproject's version
    (unpacked / "training").mkdir(parents=True)
    (unpacked / "pyproject.toml").write_text((REPO / "pyproject.toml").read_text())
    assert prov_mod.code_provenance(unpacked) == {"commit": None, "dirty": None, "version": "0.1.0"}
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
        Progress(job_dir / PROGRESS_FILE, job_hash(load_job(cfg))).save([fake])

    plant()
    resumed = result_of(run_job(cfg))  # the planted block is this configuration's: a plain run resumes from it
    assert resumed["mdl"]["blocks"][0]["ce_bits"] == fake["ce_bits"]
    plant()
    forced = result_of(run_job({**cfg, "force": True}))
    assert fake["ce_bits"] not in [b["ce_bits"] for b in forced["mdl"]["blocks"]]
    assert not (job_dir / PROGRESS_FILE).exists()


# --- 3. non-finite is a failure --------------------------------------------------------------------------------

@pytest.mark.parametrize("override", ["regularizer=sd regularizer.lam=nan", "optim.weight_decay=inf",
                                      "optim.lr=nan", "optim.lr=inf"])
def test_3_nonfinite_config_values_are_refused_up_front(tmp_path: Path, override: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(override.split()[-1].split("=")[0])):
        load_job(job_config(tmp_path, override.split()))


def _nan_after(monkeypatch: pytest.MonkeyPatch, k: int) -> None:
    """The training loss (a cross-entropy with a gradient) becomes NaN from its k-th call on."""
    real = torch.nn.functional.cross_entropy
    calls = {"n": 0}

    def patched(logits: torch.Tensor, *args: Any, **kw: Any) -> torch.Tensor:
        out = real(logits, *args, **kw)
        # a training loss: logits with a gradient, or the stacked engine's vmapped per-sample loss (under vmap
        # requires_grad reads False; its validation runs without grad)
        if logits.requires_grad or (kw.get("reduction") == "none" and torch.is_grad_enabled()):
            calls["n"] += 1
            if calls["n"] >= k:
                return out * math.nan
        return out

    monkeypatch.setattr(torch.nn.functional, "cross_entropy", patched)


def _toy(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(96, 1, 2, 4, generator=g)
    return x, (x.flatten(1).sum(1) > 0).long()


def _member(x: torch.Tensor, y: torch.Tensor, name: str, cfg: FitConfig) -> Member:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2))
    opt = schedulefree.AdamWScheduleFree(model.parameters(), lr=1e-2, warmup_steps=2)
    return Member(model, opt, torch.arange(64), torch.Generator().manual_seed(1), cfg, name=name)


@pytest.mark.parametrize("engine", ["fit", "loop", "stacked"])
def test_3_nan_training_loss_fails_fit_or_the_lockstep_group_naming_the_member(monkeypatch: pytest.MonkeyPatch,
                                                                               engine: str) -> None:
    """4 steps an epoch. fit: NaN from step 6 (epoch 2), caught at epoch 2's validation, after step 8. A group, loop
    engine: one cross-entropy per member per step (call 11 = member 1 at step 6); stacked: one vmapped call per step
    for both (call 6 = step 6, every member NaN: the first one is named); read at the first poll after it."""
    x, y = _toy()
    cfg = fit_settings(batch_size=16, patience=50, max_epochs=10, progress=False)
    data = TrainData(DeviceData(x, x.device, storage="float32"), y, x[64:], y[64:])
    names = ["block model 3"] if engine == "fit" else ["block model 1", "block model 2"]
    members = [_member(x, y, name, cfg) for name in names]
    _nan_after(monkeypatch, 11 if engine == "loop" else 6)
    with pytest.raises(UserError) as err:
        if engine == "fit":
            fit(members[0], data)
        else:
            fit_group(members, data, group_options(engine=engine, poll_every=1))
    assert type(err.value).__name__ == "NonFiniteError"
    assert str(err.value) == (f"non-finite training loss in {names[0]} by step 8 (epoch 2): lr too high or bad data; "
                              "nothing was written as a result")


def test_3_nan_loss_from_the_cli_one_line_exit_2_no_result(tmp_path: Path) -> None:
    prelude = textwrap.dedent("""
        import torch
        real = torch.nn.functional.cross_entropy
        calls = [0]
        def patched(logits, *a, **kw):
            out = real(logits, *a, **kw)
            if logits.requires_grad:
                calls[0] += 1
                if calls[0] >= 7:
                    return out * float("nan")
            return out
        torch.nn.functional.cross_entropy = patched
    """)
    proc = _cli(tmp_path, *TINY, "training.parallel_models=1", prelude=prelude)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    # block model 1 takes 5 steps (the warm-up: calls 1-5), block model 2 three an epoch: call 7 is its step 2,
    # caught at the end of its epoch 1
    assert lines[0] == ("error: non-finite training loss in block model 2 by step 3 (epoch 1): lr too high or bad "
                        "data; nothing was written as a result")
    assert not list(tmp_path.rglob("result.json"))
    log = next(tmp_path.rglob("run.log")).read_text()
    assert lines[0] in log


def test_3_a_diverging_lr_fails_its_job_and_the_ledger_counts_it(tmp_path: Path) -> None:
    """The real thing: lr 1e20 overflows within two steps (before: exit 0, most blocks coded at log2 10 by the
    initial model, as the NaN validation losses never beat it)."""
    proc = _cli(tmp_path, *TINY, "optim.lr=0.001,1e20", multirun=True)
    assert proc.returncode != 0, (proc.stdout + proc.stderr)[-3000:]
    summary = json.loads(next(tmp_path.rglob("summary.json")).read_text())
    entries = summary["jobs"]
    by_status = {e["status"]: e for e in entries}
    assert sorted(e["status"] for e in entries) == ["done", "failed"], summary
    assert ONE_LINE.fullmatch(by_status["failed"]["error"]), by_status["failed"]
    results = [json.loads(p.read_text()) for p in tmp_path.rglob("result.json")]
    assert [r["config"]["optim"]["lr"] for r in results] == [0.001]


def test_3_nonfinite_code_length_or_result_number_writes_no_result(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Trainer, "code_bits", lambda self, model, idx, split: (math.inf, 1.0))
    cfg = job_config(tmp_path, TINY)
    with pytest.raises(UserError, match=r"^non-finite code length \(inf bits/sample\) of block 2 by block "
                                             r"model 1: lr too high or bad data; nothing was written as a result$"):
        run_job(cfg)
    assert not (Path(cfg["paths"]["job_dir"]) / "result.json").exists()
    # the lifecycle's last check: no number of mdl/final may be NaN/inf (None is allowed)
    cfg2 = job_config(tmp_path / "b", TINY)
    body = lambda run: MdlSections.read(  # noqa: E731
        {"mdl": {"bits_per_sample": 1.0, "blocks": [{"ce_bits": math.nan}]}, "final": None})
    with pytest.raises(UserError, match=r"^non-finite mdl\.blocks\[0\]\.ce_bits \(nan\) in the result of "):
        run_in_job_dir(load_job(cfg2), body, finite=("mdl", "final"))
    assert not (Path(cfg2["paths"]["job_dir"]) / "result.json").exists()


def test_3_nan_erased_data_fails_and_a_cached_nan_entry_is_rebuilt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                   caplog: pytest.LogCaptureFixture) -> None:
    data = load_dataset(group_config("dataset", "digits"))
    eraser = group_config("eraser", "leace")
    real = erasure.erase
    monkeypatch.setattr(erasure, "erase", lambda *a, **kw: (real(*a, **kw)[0] * math.nan, {}))
    with pytest.raises(UserError, match=r"^non-finite erased data: eraser leace gave \d+ NaN/Inf values on "
                                             r"digits; .*nothing was cached"):
        apply_eraser(data, eraser, Store(tmp_path), certificate=False)
    assert not list((tmp_path / "erased").glob("*/data.pt"))
    monkeypatch.setattr(erasure, "erase", real)
    # fitted on a held-out part and applied to the rest: the same refusal, nothing cached
    applied = erase_module._apply_fitted
    monkeypatch.setattr(erase_module, "_apply_fitted", lambda *a, **kw: (applied(*a, **kw)[0] * math.nan, {}))
    holdout = FitPlan("holdout", coded_idx=torch.arange(400, len(data.y)), fit_idx=torch.arange(400))
    with pytest.raises(UserError, match=r"^non-finite erased data: eraser leace gave \d+ NaN/Inf values on "):
        apply_eraser(data, eraser, Store(tmp_path), holdout, certificate=False)
    assert not list((tmp_path / "erased").glob("*/data.pt"))
    monkeypatch.setattr(erase_module, "_apply_fitted", applied)
    # an entry holding NaN with a valid manifest (cached by a version that did not check): rebuilt, one line
    key = {"k": 1}
    entry = tmp_path / "erased" / key_hash(key)
    _store(entry, key, torch.full((4, 3), math.nan), {})
    with caplog.at_level(logging.WARNING):
        x, _, hit = cached_erase(tmp_path, key, lambda: (torch.ones(4, 3), {}))
    assert not hit and torch.equal(x, torch.ones(4, 3))
    lines = [r.getMessage() for r in caplog.records if "NaN" in r.getMessage()]
    assert len(lines) == 1 and str(entry) in lines[0] and "rebuilding" in lines[0]


# --- 4. data identity ------------------------------------------------------------------------------------------

def _idx(path: Path, arr: bytes, dims: list[int], gz: bool = False) -> None:
    raw = bytes([0, 0, 8, len(dims)]) + b"".join(d.to_bytes(4, "big") for d in dims) + arr
    path.write_bytes(gzip.compress(raw) if gz else raw)


def _fashion(folder: Path, pixel0: int = 0, gz_images: bool = False) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    n = 20
    images = bytes([pixel0]) + bytes((i * 7) % 256 for i in range(1, n * 28 * 28))
    _idx(folder / ("train-images-idx3-ubyte" + (".gz" if gz_images else "")), images, [n, 28, 28], gz_images)
    _idx(folder / "train-labels-idx1-ubyte", bytes(i % 10 for i in range(n)), [n])


def _load(folder: Path) -> LoadedData:
    return load_dataset(group_config("dataset", "fashion_mnist", root=str(folder), download=False))


def test_4_a_file_swapped_under_the_same_name_changes_fingerprint_andcache_key(tmp_path: Path) -> None:
    folder = tmp_path / "fm"
    _fashion(folder)
    before = _load(folder)
    fp = before.info["fingerprint"]
    assert fp["content"] == before.content_hash()
    assert [f["name"] for f in fp["files"]] == ["train-images-idx3-ubyte", "train-labels-idx1-ubyte"]
    images = folder / "train-images-idx3-ubyte"
    assert fp["files"][0]["size"] == images.stat().st_size and len(fp["files"][0]["sha256"]) == 64
    _fashion(folder, pixel0=255)  # same names, same sizes, one byte changed
    after = _load(folder)
    fp2 = after.info["fingerprint"]
    assert fp2["content"] != fp["content"] and fp2["files"][0]["sha256"] != fp["files"][0]["sha256"]
    assert fp2["files"][1] == fp["files"][1] and fp2["files"][0]["size"] == fp["files"][0]["size"]
    assert key_hash(cache_key(after, "leace", {})) != key_hash(cache_key(before, "leace", {}))


def test_4_a_dataset_root_given_is_the_only_place_looked_in(tmp_path: Path) -> None:
    _fashion(tmp_path / "data" / "fashion-mnist")  # a copy where the loader looks when no root is given
    assert load_dataset(group_config("dataset", "fashion_mnist", download=False), tmp_path / "data").y.shape == (20,)
    missing = group_config("dataset", "fashion_mnist", root=str(tmp_path / "missing"), download=False)
    with pytest.raises(DatasetMissingError, match=str(tmp_path / "missing")):  # never the copy found elsewhere
        load_dataset(missing, tmp_path / "data")


def test_4_a_gzipped_and_a_plain_idx_file_mixed_are_used_with_one_warning(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    folder = tmp_path / "mix"
    _fashion(folder, gz_images=True)
    with caplog.at_level(logging.WARNING):
        pair = find_idx_pair(folder)
        data = _load(folder)
    assert pair == (folder / "train-images-idx3-ubyte.gz", folder / "train-labels-idx1-ubyte")
    assert len(data.y) == 20
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and str(pair[0]) in warnings[0] and str(pair[1]) in warnings[0], warnings
