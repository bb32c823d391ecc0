"""Nothing lost, one line per mistake.

1. job-directory collisions: a sweep keeps every job's result; jobs sharing a directory with different configs are
   refused before anything runs; a job holds a lock on its directory; result.json is re-checked before writing
2. the multirun ledger without a preset
3. bad config values: one line before any data or directory
4. a failed cache write is a warning, the job goes on
5. user errors: one line on stderr + run.log, exit 2; HYDRA_FULL_ERROR=1 shows the traceback
6. waiting on a lock is logged (what, since when, which pid); the holder's note is decoded once, as far as it goes
7. malformed result.json / progress.json count as absent
8. force=true recomputes a finished job of the same configuration
"""

from __future__ import annotations

import dataclasses
import errno
import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from tests.helpers import ENV, REPO, TINY, job_config, result_of
from training.app.lifecycle import PROGRESS_FILE, Progress
from training.app.results import LOCK_FILE, ConfigMismatchError, JobDir
from training.app.schema import ConfigError, group_config
from training.app.tasks import job_hash, spec_of
from training.common.env import LOCK_LOG_EVERY
from training.common.locks import Holder, describe_holder, holder_path, waiting_lock
from training.data import cache as cache_mod
from training.data import load_dataset
from training.data.cache import cached_erase
from training.errors import DataCorruptError
from training.inputs import pipeline as inputs_mod
from training.inputs import store as store_mod
from training.tasks.mdl.job import read_progress, run_job


def _cli(out_dir: Path, *overrides: str, multirun: bool = False, env: dict[str, str] | None = None,
         timeout: int = 300) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "training.run", *(["-m"] if multirun else []), f"paths.out_dir={out_dir}",
           "logger=none", "progress=false", *overrides]
    return subprocess.run(cmd, cwd=REPO, env={**ENV, **(env or {})}, capture_output=True, text=True,
                          timeout=timeout)


def _one_error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """stderr must be exactly one line, `error: ...`, and the exit code 2."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    return lines[0]


# --- 1. job-directory collisions ---------------------------------------------------------------------------------

def test_sweep_of_an_mdl_setting_keeps_both_results(tmp_path: Path) -> None:
    # (a learning rate, not max_epochs: with mdl=quick's min_steps a tiny job trains past max_epochs 2 and 3 alike)
    proc = _cli(tmp_path, "experiment=smoke", "eraser=control", "seed=0", "mdl.max_epochs=2", "optim.lr=0.001,0.003",
                "hydra/launcher=parallel", multirun=True)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    results = [json.loads(p.read_text()) for p in (tmp_path / "runs").rglob("result.json")]
    assert sorted(r["config"]["optim"]["lr"] for r in results) == [0.001, 0.003]
    assert len({r["mdl"]["bits_per_sample"] for r in results}) == 2


def test_sweep_whose_jobs_share_a_directory_is_refused_before_anything_runs(tmp_path: Path) -> None:
    proc = _cli(tmp_path, "experiment=smoke", "eraser=control", "seed=0", "paths.job_subdir=shared",
                "mdl.max_epochs=2,3", multirun=True)
    line = _one_error_line(proc)
    assert "multirun refused" in line and "shared" in line and "mdl.max_epochs: 2, 3" in line
    assert "seed" not in line.split("differ in")[1]  # only the keys that differ are named
    assert not (tmp_path / "runs").exists()  # nothing ran, no ledger, no directory
    line = _one_error_line(_cli(tmp_path, *TINY, "seed=0,abc", multirun=True))  # one bad value: refused whole
    assert "multirun refused" in line and "seed='abc'" in line and "job 1" in line
    assert not (tmp_path / "runs").exists()


def test_another_configs_result_refuses_its_job_and_a_sweep_hitting_it_unless_forced(tmp_path: Path) -> None:
    cfg = job_config(tmp_path, [*TINY, "seed=0"])
    job_dir = Path(cfg["paths"]["job_dir"])
    job_dir.mkdir(parents=True)
    (job_dir / "result.json").write_text(json.dumps({"config_hash": "0123456789abcdef", "config": {}}))
    line = _one_error_line(_cli(tmp_path, *TINY, "seed=0"))
    assert "another configuration" in line and "force=true" in line and str(job_dir) in line
    assert line in (job_dir / "run.log").read_text()
    line = _one_error_line(_cli(tmp_path, *TINY, "seed=0,1", multirun=True))
    assert str(job_dir) in line and "another configuration" in line and "force=true" in line
    assert not (job_dir.parent / "seed1").exists()  # the other job did not run either


def _hold_lock_in_subprocess(lock: Path, release: Path) -> subprocess.Popen[str]:
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from training.common.locks import waiting_lock
        with waiting_lock(Path({str(lock)!r}), "test holder"):
            Path({str(lock)!r} + ".ready").write_text("1")
            while not Path({str(release)!r}).exists():
                time.sleep(0.05)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, env=ENV, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 60
    while not Path(f"{lock}.ready").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.02)
    return proc


def _behind_a_holder(lock: Path, caplog: pytest.LogCaptureFixture, what: str, work: Callable[[], Any],
                     meanwhile: Callable[[], None] = lambda: None) -> tuple[int, Any]:
    """`work` in a thread while another process holds `lock`, until `what` is logged at once, then again
    (periodically); then `meanwhile`, and the lock is released. The holder's pid and what `work` returned."""
    holder = _hold_lock_in_subprocess(lock, Path(f"{lock}.release"))
    out: list[Any] = []
    worker = threading.Thread(target=lambda: out.append(work()))
    with caplog.at_level(logging.INFO):
        worker.start()
        deadline = time.monotonic() + 30
        while caplog.text.count(what) < 2:
            assert time.monotonic() < deadline, caplog.text
            time.sleep(0.05)
        assert worker.is_alive()
        meanwhile()
        Path(f"{lock}.release").write_text("1")
        worker.join(60)
    holder.communicate(timeout=30)
    assert not worker.is_alive()
    return holder.pid, out[0]


def test_second_job_with_the_same_directory_waits_logs_it_then_skips(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOCK_LOG_EVERY, "0.2")
    cfg = job_config(tmp_path, TINY)
    job_dir = Path(cfg["paths"]["job_dir"])
    job_dir.mkdir(parents=True)

    def first_job_finishes() -> None:  # its result is there when the lock is released
        first = {"config_hash": job_hash(cfg), "config": cfg, "mdl": {"bits_per_sample": 1.25}}
        (job_dir / "result.json").write_text(json.dumps(first))

    pid, result = _behind_a_holder(job_dir / LOCK_FILE, caplog, "waiting for job directory",
                                   lambda: run_job(cfg).result, first_job_finishes)
    assert result["mdl"] == {"bits_per_sample": 1.25}  # skipped: nothing recomputed or overwritten
    assert f"by pid {pid}" in caplog.text and str(job_dir / LOCK_FILE) in caplog.text
    assert "held since" in caplog.text and "SKIP" in caplog.text


def test_result_of_another_config_written_meanwhile_is_not_overwritten(tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = job_config(tmp_path, TINY)
    job_dir = Path(cfg["paths"]["job_dir"])
    foreign = {"config_hash": "ffffffffffffffff", "config": {"seed": 99}, "mdl": {"bits_per_sample": 9.0}}
    erase = inputs_mod._erased

    def erase_then_intrude(data: Any, c: Any, *rest: Any, **kw: Any) -> Any:  # a process ignoring the lock writes
        (job_dir / "result.json").write_text(json.dumps(foreign))
        return erase(data, c, *rest, **kw)

    monkeypatch.setattr(inputs_mod, "_erased", erase_then_intrude)
    with pytest.raises(ConfigMismatchError, match="not overwritten") as err:
        run_job(cfg)
    assert json.loads((job_dir / "result.json").read_text()) == foreign
    aside = job_dir / f"result.{job_hash(cfg)}.json"
    assert str(aside) in str(err.value) and json.loads(aside.read_text())["mdl"]["bits_per_sample"] > 0


# --- 2. the ledger without a preset ------------------------------------------------------------------------------

def test_multirun_without_a_preset_counts_its_jobs(tmp_path: Path) -> None:
    proc = _cli(tmp_path, *TINY, "seed=0,1", multirun=True)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    assert "raised" not in text and "0/?" not in text
    assert "[2/2] done" in text and "multirun: 2/2 jobs ran: 2 done, 0 skipped, 0 failed" in text
    (summary,) = (tmp_path / "runs/.multirun").glob("*/summary.json")
    assert json.loads(summary.read_text())["total"] == 2


# --- 3. bad values -----------------------------------------------------------------------------------------------

BAD = [("arch.width=0", "arch.width"), ("arch.width=-5", "arch.width"), ("arch.depth=0", "arch.depth"),
       ("mdl.max_epochs=0", "mdl.max_epochs"), ("seed=abc", "seed"), ("mdl.num_blocks=-1", "mdl.num_blocks"),
       ("optim.lr=0", "optim.lr"), ("optim.lr=-0.001", "optim.lr")]


@pytest.mark.parametrize(("override", "key"), BAD)
def test_library_run_job_checks_values_before_data_or_directory(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                override: str, key: str) -> None:
    def no_data(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("data loaded before the config was checked")

    monkeypatch.setattr(store_mod, "load_dataset", no_data)  # the job's first load (then handed to its body)
    with pytest.raises(ConfigError, match=key) as err:
        run_job(job_config(tmp_path, [*TINY, override]))
    assert "\n" not in str(err.value) and "must be" in str(err.value)
    assert not (tmp_path / "runs").exists()


def test_cli_bad_values_one_line_exit_2_no_directory(tmp_path: Path) -> None:
    for override, key in [BAD[0], BAD[2], BAD[3], BAD[4], BAD[5], BAD[6]]:
        proc = _cli(tmp_path, *TINY, override)
        line = _one_error_line(proc)
        assert key in line and override.split("=")[1] in line and "must be" in line, line
        assert not (tmp_path / "runs").exists(), override  # no `seedabc/` left behind
        assert "bits/sample" not in proc.stdout


# --- 4. cache writes ---------------------------------------------------------------------------------------------

def _enospc(x: torch.Tensor, tmp: str) -> None:
    Path(tmp).write_bytes(b"partial")
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), tmp)


def test_a_full_disk_or_an_unwritable_cache_dir_warns_and_goes_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(cache_mod, "_save_tensor", _enospc)
    with caplog.at_level(logging.WARNING):
        x, report, hit = cached_erase(tmp_path, {"k": 1}, lambda: (torch.ones(3, 2), {"ok": True}))
    assert float(x.sum()) == 6.0 and report == {"ok": True} and hit is False
    assert "No space left on device" in caplog.text and "in memory" in caplog.text
    assert [p.name for p in (tmp_path / "erased").iterdir() if not p.name.endswith(".lock")] == []  # no partial

    def runtime(x: torch.Tensor, tmp: str) -> None:  # torch.save's own words for a full disk
        raise RuntimeError("[enforce fail at inline_container.cc:671] . unexpected pos 704 vs 598")

    caplog.clear()
    monkeypatch.setattr(cache_mod, "_save_tensor", runtime)
    monkeypatch.setattr(cache_mod.shutil, "disk_usage", lambda p: type("U", (), {"free": 4096})())
    with caplog.at_level(logging.WARNING):
        cached_erase(tmp_path, {"k": 2}, lambda: (torch.ones(3, 2), {}))
    assert "No space left on device" in caplog.text and "unexpected pos" in caplog.text

    def denied(*args: Any, **kwargs: Any) -> Any:  # an unwritable cache directory
        raise PermissionError(errno.EACCES, "Permission denied", str(tmp_path / "erased" / "x.lock"))

    caplog.clear()
    monkeypatch.setattr(cache_mod, "waiting_lock", denied)
    with caplog.at_level(logging.WARNING):
        x, _, hit = cached_erase(tmp_path, {"k": 3}, lambda: (torch.zeros(2), {}))
    assert hit is False and x.shape == (2,)
    assert "Permission denied" in caplog.text and "cache not used" in caplog.text


def test_job_survives_a_full_disk_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cache_mod, "_save_tensor", _enospc)
    cfg = job_config(tmp_path, [*TINY, "eraser=leace"])
    result = result_of(run_job(cfg))
    assert (Path(cfg["paths"]["job_dir"]) / "result.json").exists() and result["mdl"]["bits_per_sample"] > 0
    assert result["eraser"]["cache_hit"] is False


# --- 5. user errors as one line ----------------------------------------------------------------------------------

def test_missing_or_corrupt_dataset_is_one_line_exit_2_and_in_run_log(tmp_path: Path) -> None:
    args = ("dataset=cifar10", f"paths.data_dir={tmp_path / 'nodata'}", "dataset.download=false")
    proc = _cli(tmp_path, *args)
    line = _one_error_line(proc)
    assert "CIFAR-10 not found" in line and "cifar-10-batches-py" in line
    (log,) = (tmp_path / "runs").rglob("run.log")
    assert line in log.read_text()
    full = _cli(tmp_path, *args, env={"HYDRA_FULL_ERROR": "1"})
    assert full.returncode != 0 and "Traceback" in full.stderr and "CIFAR-10 not found" in full.stderr
    _garbage_cifar(tmp_path / "data")
    line = _one_error_line(_cli(tmp_path, *args[:1], f"paths.data_dir={tmp_path / 'data'}", *args[2:]))
    assert "data_batch_1" in line and "UnpicklingError" in line


def _garbage_cifar(root: Path) -> Path:
    folder = root / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    for i in range(1, 6):
        (folder / f"data_batch_{i}").write_bytes(b"\x80\x04garbage")
    return folder


def test_corrupt_data_files_name_the_file(tmp_path: Path) -> None:
    folder = _garbage_cifar(tmp_path / "c")
    with pytest.raises(DataCorruptError, match="data_batch_1") as err:
        load_dataset(group_config("dataset", "cifar10", download=False), tmp_path / "c")
    assert str(folder) in str(err.value) and "replace it" in str(err.value)
    net = tmp_path / "n" / "cifarnet"
    net.mkdir(parents=True)
    (net / "train.npz").write_bytes(b"not a zip")
    with pytest.raises(DataCorruptError, match="train.npz"):
        load_dataset(group_config("dataset", "cifarnet"), tmp_path / "n")
    np.savez(net / "train.npz", images=np.zeros((4, 8, 8), np.uint8), labels=np.zeros(4))  # no channel axis
    with pytest.raises(DataCorruptError, match="NHWC"):
        load_dataset(group_config("dataset", "cifarnet"), tmp_path / "n")
    labels = tmp_path / "f" / "train-labels-idx1-ubyte"
    labels.parent.mkdir()
    labels.write_bytes(b"\x00\x00\x08")
    (tmp_path / "f" / "train-images-idx3-ubyte").write_bytes(b"\x00\x00\x08\x03" + pickle.dumps(1))
    with pytest.raises(DataCorruptError, match="train-images-idx3-ubyte"):
        load_dataset(group_config("dataset", "fashion_mnist", root=str(tmp_path / "f")), tmp_path)


def test_unwritable_output_dir_is_one_line(tmp_path: Path) -> None:
    target = Path("/sys/erasure-mdl-test-out")  # not writable, even by root
    if not Path("/sys").is_dir():
        pytest.skip("needs /sys")
    line = _one_error_line(_cli(target, *TINY))
    assert "/sys/erasure-mdl-test-out" in line and "paths.out_dir" in line
    line = _one_error_line(_cli(target, *TINY, "seed=0,1", multirun=True))
    assert "/sys/erasure-mdl-test-out" in line


# --- 6. lock waiting is logged -----------------------------------------------------------------------------------

def test_waiting_for_a_cache_lock_is_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(LOCK_LOG_EVERY, "0.2")
    key = {"k": "locked"}
    lock = tmp_path / "erased" / f"{cache_mod.key_hash(key)}.lock"
    lock.parent.mkdir(parents=True)
    pid, (_, _, hit) = _behind_a_holder(lock, caplog, "waiting for the erased-data cache entry",
                                        lambda: cached_erase(tmp_path, key, lambda: (torch.ones(1), {})))
    assert hit is False and f"by pid {pid}" in caplog.text and "held since" in caplog.text


@pytest.mark.parametrize("text", [None, "", "{not json", "[1, 2]", "{}"])
def test_no_note_or_not_a_note_is_holder_unknown(tmp_path: Path, text: str | None) -> None:
    """A note another process (of any version) left that is not a note: "holder unknown", never a traceback."""
    lock = tmp_path / "x.lock"
    if text is not None:
        holder_path(lock).write_text(text)
    assert describe_holder(lock) == "holder unknown"


def test_a_partial_note_is_read_as_far_as_it_goes(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    holder_path(lock).write_text(json.dumps({"pid": 5, "since": "yesterday", "extra": 1}))
    assert describe_holder(lock) == "held since ? by pid 5 on ?"


def test_this_process_s_note_round_trips_and_is_removed_on_release(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    with waiting_lock(lock, "x"):
        assert json.loads(Path(f"{lock}.holder").read_text())["pid"] == os.getpid()
    assert not Path(f"{lock}.holder").exists()
    mine = Holder.mine()
    holder_path(lock).write_text(json.dumps(dataclasses.asdict(mine)))
    assert Holder.read(lock) == mine
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(mine.since))
    assert describe_holder(lock) == f"held since {when} by pid {mine.pid} on {mine.host}"


# --- 7. malformed files ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("content", ["[]", "42", "{}", '{"config_hash": 5}', '"text"', "{broken"])
def test_malformed_result_counts_as_absent(tmp_path: Path, content: str, caplog: pytest.LogCaptureFixture) -> None:
    (tmp_path / "result.json").write_text(content)
    with caplog.at_level(logging.WARNING):
        assert JobDir(tmp_path, "abc", spec_of("mdl"), force=False).finished() is None  # not SKIP, not "another config"
    assert "result.json" in caplog.text


def test_a_job_with_a_malformed_result_and_progress_missing_a_field_recomputes(tmp_path: Path) -> None:
    cfg = job_config(tmp_path, TINY)
    job_dir = Path(cfg["paths"]["job_dir"])
    job_dir.mkdir(parents=True)
    (job_dir / "result.json").write_text("[]")  # not refused (as another config's) by a sweep either
    (job_dir / PROGRESS_FILE).write_text(json.dumps({"config_hash": job_hash(cfg),
                                                     "blocks": [{"block": 2, "train_size": 128}]}))
    result = result_of(run_job(cfg))
    assert json.loads((job_dir / "result.json").read_text())["config_hash"] == result["config_hash"]
    assert len(result["mdl"]["blocks"]) == len(result["mdl"]["block_sizes"]) - 1


def test_malformed_progress_starts_over(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / PROGRESS_FILE
    good = {"block": 2, "train_size": 10, "coded_size": 5, "ce_bits": 2.0, "temperature": 1.0, "seconds": 0.1,
            "best_val_loss": 1.0, "best_epoch": 1, "epochs": 2, "steps": 3}
    path.write_text(json.dumps({"config_hash": "h", "blocks": [good]}))
    assert read_progress(Progress(path, "h"), 6) == [good]
    assert read_progress(Progress(path, "other"), 6) == []
    bad: Any  # JSON of any shape but a progress file's
    for bad in ([], 42, {}, {"config_hash": "h"}, {"config_hash": "h", "blocks": [{"block": 2}]},
                {"config_hash": "h", "blocks": [{**good, "ce_bits": None}]},
                {"config_hash": "h", "blocks": [{**good, "block": 3}]}):
        path.write_text(json.dumps(bad))
        with caplog.at_level(logging.WARNING):
            assert read_progress(Progress(path, "h"), 6) == [], bad


# --- 8. force ----------------------------------------------------------------------------------------------------

def test_force_recomputes_a_finished_job_of_the_same_config(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = job_config(tmp_path, TINY)
    path = Path(cfg["paths"]["job_dir"]) / "result.json"
    first = result_of(run_job(cfg))
    stored = json.loads(path.read_text())
    stored["mdl"]["bits_per_sample"] = -1.0  # a marker: a skip would return it
    path.write_text(json.dumps(stored))
    assert result_of(run_job(cfg))["mdl"]["bits_per_sample"] == -1.0  # without force: SKIP
    with caplog.at_level(logging.WARNING):
        again = result_of(run_job({**cfg, "force": True}))
    assert "force=true: recomputing" in caplog.text
    assert again["mdl"]["bits_per_sample"] == first["mdl"]["bits_per_sample"]  # same seed, same numbers
    assert json.loads(path.read_text())["mdl"]["bits_per_sample"] == first["mdl"]["bits_per_sample"]
