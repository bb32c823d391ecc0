"""`hydra/launcher=packed`: jobs differing only in seed run in one process, each with its own directory, result.json,
resume and ledger line, and numbers == each job run alone; jobs of a pack share datasets and erased data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from hydra_plugins.erasure_mdl_packed.packed_launcher import bucket_key, buckets_of, cells_in, packs_of
from tests.helpers import kill_once_one_done_one_partial, kill_when, sweep_results
from training.app.lifecycle import PROGRESS_FILE
from training.data import shared
from training.data.cache import cached_erase
from training.data.registry import load_dataset

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
SEEDS = "seed=0,1,2"  # smoke's 2 erasers x 3 seeds: 6 jobs, 2 cells
# wall times, dates and the stored config's pack size (unhashed, speed only): the only keys that may differ
VOLATILE = ("seconds", "timings.", "provenance.", "config.training.pack_size", "config.training.pack_group",
            "eraser.cache_hit")


def _command(out_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "training.run", "-m", "experiment=smoke", f"paths.out_dir={out_dir}",
            "logger=none", "progress=false", *overrides]


def _sweep(out_dir: Path, *overrides: str) -> str:
    proc = subprocess.run(_command(out_dir, *overrides), cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=300)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    return text


def _results(out_dir: Path) -> dict[str, dict[str, Any]]:
    return sweep_results(out_dir, VOLATILE)


# The tests that compare with `lone` run on one worker under `make test` (module fixtures are per worker): its 6
# jobs once, not once per worker (tests/test_erasure_real.py shares the group: one long group, handed out first).
LONE_GROUP = pytest.mark.xdist_group("expensive_module_fixtures")


@pytest.fixture(scope="module")
def lone(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, Any]]:
    """The 6 jobs, one per worker process (joblib), as `make demo` runs them."""
    out = tmp_path_factory.mktemp("lone")
    _sweep(out, SEEDS, "hydra/launcher=parallel")
    results = _results(out)
    assert len(results) == 6
    return results


@LONE_GROUP
def test_packed_jobs_equal_lone_jobs_each_in_its_own_directory(tmp_path: Path, lone: dict[str, Any]) -> None:
    text = _sweep(tmp_path, SEEDS, "hydra/launcher=packed")
    assert "6 jobs in 2 packs, run by hydra/launcher=local" in text
    assert "pack of 3 jobs" in text and "multirun: 6/6 jobs ran: 6 done, 0 skipped, 0 failed" in text
    assert "pack group" not in text  # training.pack_group=auto: not with the loop engine (CPU)
    assert "cache hit (shared in this process)" in text  # the leace pack's seeds 1 and 2
    packed = _results(tmp_path)
    assert sorted(packed) == sorted(lone)  # the same job directories, one result.json each
    for job in lone:
        assert packed[job] == lone[job], job
    (summary,) = (tmp_path / "runs/.multirun").glob("*/summary.json")
    assert len({j["job_dir"] for j in json.loads(summary.read_text())["jobs"]}) == 6  # a ledger line per job


@LONE_GROUP
def test_pack_size_splits_packs_run_by_joblib(tmp_path: Path, lone: dict[str, Any]) -> None:
    text = _sweep(tmp_path, SEEDS, "hydra/launcher=packed", "hydra.launcher.inner=parallel", "training.pack_size=2")
    assert "6 jobs in 4 packs, run by hydra/launcher=parallel" in text
    assert "pack of 2 jobs" in text and "pack of 1 jobs" in text and "pack of 3 jobs" not in text
    assert _results(tmp_path) == lone
    again = _sweep(tmp_path, SEEDS, "hydra/launcher=packed", "hydra.launcher.inner=parallel", "training.pack_size=2")
    assert "multirun: 6/6 jobs ran: 0 done, 6 skipped, 0 failed" in again


@LONE_GROUP
def test_packs_run_by_submitit_local_one_subprocess_each(tmp_path: Path, lone: dict[str, Any]) -> None:
    text = _sweep(tmp_path, SEEDS, "hydra/launcher=packed", "hydra.launcher.inner=submitit_local")
    assert "6 jobs in 2 packs, run by hydra/launcher=submitit_local" in text
    assert "multirun: 6/6 jobs ran: 6 done, 0 skipped, 0 failed" in text
    assert _results(tmp_path) == lone


def test_packs_hold_jobs_that_differ_only_in_seed() -> None:
    jobs = [["eraser=control", "seed=0"], ["eraser=leace", "seed=0"], ["eraser=control", "seed=1"],
            ["eraser=leace", "seed=1"], ["eraser=control", "seed=2"],
            ["eraser=control", "seed=3", "dataset.limit=500"]]
    packs = packs_of(jobs, None, first_num=10)
    assert [[num for num, _ in pack] for pack in packs] == [[10, 12, 14], [11, 13], [15]]
    assert [[num for num, _ in pack] for pack in packs_of(jobs, 2)] == [[0, 2], [4], [1, 3], [5]]
    assert packs_of([["seed=0", "eraser=leace"], ["eraser=leace", "seed=1"]], None)[0][1][0] == 1  # order-blind


@LONE_GROUP
def test_killed_pack_resumes_each_of_its_jobs(tmp_path: Path, lone: dict[str, Any]) -> None:
    out, runs = tmp_path / "killed", tmp_path / "killed/runs"
    command = _command(out, SEEDS, "hydra/launcher=packed")
    finished, partial = kill_once_one_done_one_partial(command, runs, tmp_path / "first.log", REPO, ENV)
    assert len(finished) == 1 and len(partial) == 1, (finished, partial)
    (first,), (killed,) = finished, partial
    stamp = (first / "result.json").stat().st_mtime_ns
    rerun = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    text = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, text[-3000:]
    assert f"SKIP {first}" in text and (first / "result.json").stat().st_mtime_ns == stamp
    assert "resuming after block model" in text
    assert "multirun: 6/6 jobs ran: 5 done, 1 skipped, 0 failed" in text
    assert not list(runs.rglob(PROGRESS_FILE)) and (killed / "result.json").is_file()
    assert _results(out) == lone


@LONE_GROUP
def test_a_pack_killed_in_its_pack_group_resumes_each_of_its_jobs(tmp_path: Path, lone: dict[str, Any]) -> None:
    """Killed while the first job's group trains every seed's models (a block of seed 0 saved, no job done): the
    rerun resumes seed 0 after its saved blocks, its group takes the later seeds' models again, numbers == lone."""
    out, runs = tmp_path / "killed", tmp_path / "killed/runs"
    command = _command(out, SEEDS, "hydra/launcher=packed", "training.pack_group=true")
    finished, partial = kill_when(command, runs, tmp_path / "first.log", REPO, ENV,
                                  lambda finished, partial: bool(partial) and not finished)
    assert not finished and len(partial) == 1, (finished, partial)
    assert "pack group: this job's 6 models and 12 of seed(s) 1, 2" in (tmp_path / "first.log").read_text()
    rerun = subprocess.run(command, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=300)
    text = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, text[-3000:]
    assert "resuming after block model" in text and "and 12 of seed(s) 1, 2 train in one lockstep group" in text
    assert "multirun: 6/6 jobs ran: 6 done, 0 skipped, 0 failed" in text
    assert "were not used" not in text
    assert _results(out) == lone


def test_shared_datasets_are_loaded_once_and_never_seen_modified(tmp_path: Path) -> None:
    from tests.helpers import job_config
    from training.app.tasks import load_job

    cfg = load_job(job_config(tmp_path, ["dataset=digits"])).dataset
    apart = load_dataset(cfg), load_dataset(cfg)
    assert apart[0].x is not apart[1].x  # off outside a pack
    with shared.packed() as pack:
        memo = pack.datasets
        a, b = load_dataset(cfg, memo=memo), load_dataset(cfg, memo=memo)
        assert a.x is b.x and a.y is b.y and a is not b and a.info is not b.info
        assert torch.equal(a.x, apart[0].x) and a.info == apart[0].info
        a.info["fingerprint"]["content"] = "edited"  # a job's own dicts
        assert load_dataset(cfg, memo=memo).info == apart[0].info
        a.x.mul_(2)  # a job that edits the shared tensor in place: the next job gets the data as on disk
        c = load_dataset(cfg, memo=memo)
        assert c.x is not a.x and torch.equal(c.x, apart[0].x)
    assert load_dataset(cfg, memo=memo).x is not c.x  # the memo ends with the pack


def test_shared_erased_data_is_read_once_per_pack_and_equals_the_entry(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    import training.data.cache as cache

    built: list[int] = []
    loads: list[Path] = []
    real_load = cache._load

    def load(entry: Path, key: Any) -> tuple[torch.Tensor, dict[str, Any]] | None:
        loads.append(entry)
        return real_load(entry, key)

    monkeypatch.setattr(cache, "_load", load)

    def build() -> tuple[torch.Tensor, dict[str, Any]]:
        built.append(1)
        return torch.arange(12.0).reshape(3, 4).t(), {"rank_removed": (1, 2)}  # not contiguous; a tuple

    key = {"dataset": "x", "eraser": "y"}
    with shared.packed() as pack:
        x0, r0, hit0 = cached_erase(tmp_path, key, build, pack.erased)
        x1, r1, hit1 = cached_erase(tmp_path, key, build, pack.erased)
        x2, _, _ = cached_erase(tmp_path, key, build, pack.erased)
    assert (len(built), len(loads), hit0, hit1) == (1, 1, False, True)
    x_disk, r_disk, hit_disk = cached_erase(tmp_path, key, build)  # a lone job: from the entry
    assert hit_disk and torch.equal(x1, x_disk) and x1.stride() == x_disk.stride() and r1 == r_disk
    assert r1 == {"rank_removed": [1, 2]} and r1 is not r0
    with shared.packed() as pack:
        x3, _, _ = cached_erase(tmp_path, key, build, pack.erased)
        x3.add_(1)  # edited in place by a job: the next one loads the entry again
        x4, _, hit4 = cached_erase(tmp_path, key, build, pack.erased)
    assert (len(loads), len(built), hit4) == (4, 1, True) and torch.equal(x4, x_disk)


def test_bench_sweep_compares_every_number_but_wall_times() -> None:
    from tools.bench_sweep import differences

    a = {"j0": {"mdl.bits_per_sample": 1.25, "timings.mdl_s": 3.0, "mdl.blocks.0.seconds": 1.0}}
    same = {"j0": {"mdl.bits_per_sample": 1.25, "timings.mdl_s": 9.0, "mdl.blocks.0.seconds": 2.0}}
    assert differences(a, same) == []
    off = {"j0": {"mdl.bits_per_sample": 1.2500000000000002, "timings.mdl_s": 3.0, "mdl.blocks.0.seconds": 1.0}}
    assert differences(a, off) == ["j0: mdl.bits_per_sample 1.25 != 1.2500000000000002"]
    assert differences(a, {**same, "j1": {}}) == ["j1: only in the second run"]
    # which job of a parallel sweep fitted the shared eraser is scheduling, not a number; what it erased is one
    fitted = {"j0": {**a["j0"], "eraser.cache_hit": False, "eraser.report.rank": 9}}
    assert differences(fitted, {"j0": {**a["j0"], "eraser.cache_hit": True, "eraser.report.rank": 9}}) == []
    assert differences(fitted, {"j0": {**a["j0"], "eraser.cache_hit": True, "eraser.report.rank": 8}}) == [
        "j0: eraser.report.rank 9 != 8"]


def test_bench_sweep_quick_runs_all_three_ways_and_finds_them_equal(tmp_path: Path) -> None:
    out = tmp_path / "bench.json"
    # one cell of 2 seeds, one pack: each way runs (the numbers of many jobs are compared by the tests above)
    proc = subprocess.run([sys.executable, "tools/bench_sweep.py", "--quick", "--erasers", "leace", "--seeds", "2",
                           "--pack-size", "2", "--json", str(out)], cwd=REPO, env=ENV, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert "job-per-process" in proc.stdout and "+ pack group" in proc.stdout
    assert "all 2 jobs' result.json ==" in proc.stdout
    bench = json.loads(out.read_text())
    assert bench["equal"] and bench["jobs"] == 2 and bench["pack_size"] == 2
    assert set(bench["medians"]) == {"per_process", "packed", "pack_group"}
    counts = bench["cache_counts"]  # from the jobs' run.log: one fit each way; the pack's second seed takes it
    assert [counts[way]["fits"] for way in ("per_process", "packed", "pack_group")] == [1, 1, 1]
    assert counts["packed"]["erased_shared"] == 1 and counts["packed"]["erased_read"] == 0
    assert counts["per_process"]["erased_shared"] == 0  # each job in a worker of its own
    assert bench["ratio"] == pytest.approx(bench["per_process_s"] / bench["packed_s"])


def test_memo_keeps_the_latest_entries_only() -> None:
    memo = shared.Memo("test", max_entries=2)
    tensors = [torch.zeros(1) for _ in range(3)]
    for i, t in enumerate(tensors):
        memo.put(i, t, [t])
    assert memo.get(0) is None and memo.get(1) is tensors[1] and memo.get(2) is tensors[2]
    memo.put(3, tensors[0], [tensors[0]])  # 1 was used less recently than 2
    assert memo.get(1) is None and memo.get(2) is tensors[2]


def test_buckets_by_shape_hold_every_job_of_one_model_shape_once() -> None:
    jobs = [["arch=mlp", "eraser=control", "seed=0"], ["arch=lenet", "eraser=control", "seed=0"],
            ["arch=mlp", "eraser=leace", "seed=0"], ["arch=mlp", "eraser=control", "seed=1"],
            ["arch=lenet", "eraser=leace", "seed=1"], ["eraser=leace", "arch=mlp", "seed=1"],
            ["arch=mlp", "+arch.width=8", "eraser=leace", "seed=0"], ["dataset=digits", "arch=mlp", "seed=0"],
            ["arch=mlp", "eraser=control", "mdl.num_blocks=4", "seed=0"]]

    def nums(groups: list[list[Any]]) -> list[list[int]]:
        return [[num for num, _ in g] for g in groups]

    buckets = buckets_of(jobs, None, first_num=10, pack_by="shape")
    # a bucket: one arch and dataset (what decides the model's shape), its cells' seeds next to each other, the cells
    # of one eraser next to each other (the control cell with mdl.num_blocks=4 right after the other control cell)
    assert nums(buckets) == [[10, 13, 18, 12, 15], [11, 14], [16], [17]]
    assert nums(cells_in(buckets[0])) == [[10, 13], [18], [12, 15]]
    assert nums(buckets_of(jobs, 3, pack_by="shape")) == [[0, 3, 8], [2, 5], [1, 4], [6], [7]]  # at most 3 a bucket
    for size in (None, 2, 3):
        got = sorted(n for b in buckets_of(jobs, size, pack_by="shape") for n in nums([b])[0])
        assert got == list(range(len(jobs)))  # every job once
        assert buckets_of(jobs, size, pack_by="cell") == packs_of(jobs, size)  # the default: packs as before
    assert bucket_key(["arch=mlp", "seed=3", "eraser=leace", "++dataset.limit=500", "~arch.width"]) == (
        "++dataset.limit=500", "arch=mlp", "~arch.width")
    with pytest.raises(ValueError, match="hydra.launcher.pack_by='arch' is not allowed"):
        buckets_of(jobs, None, pack_by="arch")


def test_the_packs_of_a_bucket_share_its_memos_until_the_bucket_ends() -> None:
    t = torch.zeros(2)
    with shared.packed() as bucket:
        with shared.packed((0, 1), share=bucket) as cell:
            assert cell.datasets is bucket.datasets and cell.erased is bucket.erased and cell.seeds == (0, 1)
            cell.datasets.put("d", t, [t])
        with shared.packed((0, 1), share=bucket) as other:  # the next cell of the bucket finds it
            assert other.datasets.get("d") is t and other.ahead is not cell.ahead
    assert bucket.datasets.get("d") is None  # emptied with the bucket
    with shared.packed() as alone:
        alone.datasets.put("d", t, [t])
    assert alone.datasets.get("d") is None


@LONE_GROUP
def test_a_bucket_per_model_shape_runs_every_cell_in_one_process(tmp_path: Path, lone: dict[str, Any]) -> None:
    text = _sweep(tmp_path, SEEDS, "hydra/launcher=packed", "hydra.launcher.pack_by=shape")
    assert "6 jobs in 1 packs (a pack per model shape: hydra.launcher.pack_by=shape)" in text
    assert "pack of 6 jobs" in text and "multirun: 6/6 jobs ran: 6 done, 0 skipped, 0 failed" in text
    assert "cache hit (shared in this process)" in text
    assert _results(tmp_path) == lone  # each job its own directory and result, its lone numbers
    (summary,) = (tmp_path / "runs/.multirun").glob("*/summary.json")
    assert len({j["job_dir"] for j in json.loads(summary.read_text())["jobs"]}) == 6  # a ledger line per job
