"""The SLURM launcher against a real one-machine SLURM 22.05 cluster with accounting (tests/conftest.py starts it
with tools/slurm_cluster.py): sweeps land every result with the local launcher's numbers, survive the time
limit (submitit's USR2 + requeue) and pre-emption (`scontrol requeue`: SIGTERM), report failures, keep results
of sweeps over keys outside the job directory, and honour array_parallelism. Every job here is digits-sized.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import job_config
from training.app.lifecycle import PROGRESS_FILE
from training.common.sweeps import expand
from training.tasks.mdl.job import run_job

pytestmark = pytest.mark.slurm

REPO = Path(__file__).resolve().parents[1]
# What a one-node, 2-core cluster can give a job (the config's defaults ask for a GPU and 8 cores).
SLURM = ("hydra/launcher=slurm", "hydra.launcher.gpus_per_node=0", "hydra.launcher.cpus_per_task=1",
         "hydra.launcher.mem_gb=2", "hydra.launcher.timeout_min=5")
ONE_JOB = ("eraser=control", "seed=0", "mdl.full_run=false")
FAILING_SWEEP = ("eraser=control", "seed=0", "dataset=cifar10,digits", "++dataset.download=false")
# Under `make test-slurm` (xdist --dist loadgroup) the slurm tests run in two groups, each on its own worker with its
# own cluster (tests/conftest.py puts the others in "slurm"): the two time-limit tests, which wait on the scheduler for
# minutes, side by side; groups with more tests are handed out first, so both start with the suite.
SECOND_CLUSTER = pytest.mark.xdist_group("slurm_second_cluster")
LONG_TRAINING_S = 70  # the time-limit job's block models, one after another: over its 1-min limit with a margin
# Each attempt goes on from the step the one before saved (in-block checkpoints), so load only adds attempts: a busy
# machine (CI: 2 cores, the reference job beside it) took 11 and more, so up to MAX_REQUEUES and a long wait.
MAX_REQUEUES = 30
LOADED_WAIT_S = 1500


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def _cmd(out_dir: Path, *overrides: str) -> list[str]:
    return [sys.executable, "-m", "training.run", "-m", "experiment=smoke", f"paths.out_dir={out_dir}", "logger=none",
            "progress=false", *overrides]


def _run(out_dir: Path, *overrides: str, timeout: int = 300) -> tuple[int, str]:
    proc = subprocess.run(_cmd(out_dir, *overrides), cwd=REPO, env=_env(), capture_output=True, text=True,
                          timeout=timeout)
    return proc.returncode, proc.stdout + proc.stderr


_BACKGROUND: list[subprocess.Popen[bytes]] = []


@pytest.fixture(autouse=True)
def _stop_background_commands() -> Iterator[None]:
    """A test that fails while a command runs in the background does not leave it running."""
    yield
    while _BACKGROUND:
        proc = _BACKGROUND.pop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)


def _start(out_dir: Path, log: Path, *overrides: str) -> subprocess.Popen[bytes]:
    with log.open("wb") as f:
        proc = subprocess.Popen(_cmd(out_dir, *overrides), cwd=REPO, env=_env(), stdout=f, stderr=subprocess.STDOUT)
    _BACKGROUND.append(proc)
    return proc


def _finish(proc: subprocess.Popen[bytes], log: Path, timeout: int = 400) -> tuple[int, str]:
    rc = proc.wait(timeout=timeout)
    return rc, log.read_text()


def _job_dirs(out_dir: Path, *overrides: str) -> list[Path]:
    return [Path(j["paths"]["job_dir"]) for j in expand("smoke", [f"paths.out_dir={out_dir}", *overrides])]


def _result(job_dir: Path) -> dict[str, Any]:
    return json.loads((job_dir / "result.json").read_text())


def _numbers(result: dict[str, Any]) -> dict[str, Any]:
    """What must not change between launchers or interrupted runs (timings may)."""
    mdl = result["mdl"]
    return {"hash": result["config_hash"], "ce": mdl["block_ce_bits"], "bits": mdl["bits_per_sample"],
            "legacy": mdl["legacy"], "epochs": [b["epochs"] for b in mdl["blocks"]],
            "curve": (result["final"] or {}).get("val_loss_curve")}


def _wait_for(ready: Callable[[], Any], timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := ready()):
        assert time.monotonic() < deadline, f"timed out after {timeout:.0f}s waiting for {what}"
        time.sleep(0.1)
    return value


def _slurm_jobs(out_dir: Path) -> list[str]:
    """SLURM ids of the sweep's jobs (`<array>_<task>`; submitit submits a sweep of one as a plain job), from
    submitit's folders (one per job, made when the job is submitted)."""
    folder = out_dir / "runs" / ".submitit"
    names = [p.name for p in folder.iterdir() if (p / f"{p.name}_submitted.pkl").exists()] if folder.exists() else []
    return sorted(names, key=lambda n: tuple(int(x) for x in n.split("_")))


def _logs(out_dir: Path, task: str) -> str:
    """stdout + stderr of every attempt of one job (submitit appends across requeues)."""
    folder = out_dir / "runs" / ".submitit" / task
    return "".join(p.read_text() for p in sorted(folder.glob("*_log.*")))


def _sacct(job: str, *extra: str) -> list[dict[str, str]]:
    fields = ("JobID", "State", "Start", "End", "ExitCode")
    out = subprocess.run(["sacct", "-n", "-P", "-X", "-o", ",".join(fields), "-j", job, *extra], env=_env(),
                         capture_output=True, text=True, timeout=60, check=True).stdout
    return [dict(zip(fields, line.split("|"), strict=True)) for line in out.splitlines() if line]


def _sacct_until(job: str, done: Callable[[list[dict[str, str]]], bool], *extra: str) -> list[dict[str, str]]:
    """sacct's rows for the job once `done(rows)` (accounting reaches slurmdbd a moment after the job ends)."""
    deadline = time.monotonic() + 60
    while not done(rows := _sacct(job, *extra)):
        assert time.monotonic() < deadline, f"sacct -j {job} {' '.join(extra)} never showed the finished job: {rows}"
        time.sleep(0.5)
    return rows


def _time(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%S")


def _blocks_done(job_dir: Path) -> int:
    try:
        return len(json.loads((job_dir / PROGRESS_FILE).read_text())["blocks"])
    except (FileNotFoundError, json.JSONDecodeError, KeyError):
        return 0


def test_smoke_sweep_lands_every_result_with_the_local_numbers_and_a_rerun_skips(slurm_cluster: Path,
                                                                                 tmp_path: Path) -> None:
    local = _start(tmp_path / "local", tmp_path / "local.log")  # the reference, alongside
    rc, text = _run(tmp_path / "slurm", *SLURM)
    assert rc == 0, text[-3000:]
    assert "multirun: 4/4 jobs ran: 4 done, 0 skipped, 0 failed" in text, text[-3000:]
    assert "Bypassing sacct error" not in text  # accounting works: submitit reads job states from sacct
    tasks = _slurm_jobs(tmp_path / "slurm")
    assert len(tasks) == 2 and len({t.split("_")[0] for t in tasks}) == 1  # one array: a task per cell (2 seeds)
    script = next((tmp_path / "slurm/runs/.submitit").glob("*/*_submission.sh")).read_text()
    assert f"#SBATCH --chdir={REPO}" in script  # jobs import this checkout and resolve relative paths here
    rc_local, local_text = _finish(local, tmp_path / "local.log")
    assert rc_local == 0, local_text[-3000:]
    slurm_dirs, local_dirs = _job_dirs(tmp_path / "slurm"), _job_dirs(tmp_path / "local")
    for s, loc in zip(slurm_dirs, local_dirs, strict=True):
        assert _numbers(_result(s)) == _numbers(_result(loc)), s
    stamps = [(d / "result.json").stat().st_mtime_ns for d in slurm_dirs]

    rc, text = _run(tmp_path / "slurm", *SLURM)
    assert rc == 0, text[-3000:]
    assert "multirun: 4/4 jobs ran: 0 done, 4 skipped, 0 failed" in text, text[-3000:]
    assert [(d / "result.json").stat().st_mtime_ns for d in slurm_dirs] == stamps


def test_a_sweep_over_max_array_size_is_cut_into_arrays(slurm_cluster: Path, tmp_path: Path) -> None:
    """Four one-seed cells (`-m seed=0,1`) on a cluster whose MaxArraySize is 3 (tests/conftest.py): submitit alone
    would submit one array of four, which sbatch refuses; the launcher submits two (3 + 1), every result lands."""
    from tests.conftest import MAX_ARRAY_SIZE

    job = ("seed=0,1", "mdl.full_run=false", "mdl.max_epochs=2")
    rc, text = _run(tmp_path, *SLURM, *job)
    assert rc == 0, text[-3000:]
    assert "multirun: 4/4 jobs ran: 4 done, 0 skipped, 0 failed" in text, text[-3000:]
    assert f"4 jobs: 2 job arrays (the cluster's MaxArraySize is {MAX_ARRAY_SIZE})" in text, text[-3000:]
    tasks = _slurm_jobs(tmp_path)
    arrays = sorted({t.split("_")[0] for t in tasks})
    assert len(tasks) == 4 and len(arrays) == 2, tasks
    assert all((d / "result.json").exists() for d in _job_dirs(tmp_path, *job))


def _calibrated_epochs(factory: pytest.TempPathFactory, seconds: float, *extra: str) -> int:
    """Epochs that make the job (ONE_JOB with `extra`, no early stopping) train at least ~`seconds`. Timed in CPU
    seconds of this process (one thread), which a busy machine does not inflate as it does wall time: the job's wall
    time is at least its CPU time, so load can only make it longer. A run's time is its set-up plus its epochs times
    the cost of one: the difference of two epoch budgets is the cost of the epochs alone (wall seconds / epochs
    overstated it ~1.7×, and the job ended before its signal)."""
    def cpu_seconds(epochs: int) -> float:
        overrides = ["experiment=smoke", *ONE_JOB, f"mdl.max_epochs={epochs}", f"mdl.patience={epochs}", *extra]
        cfg = job_config(factory.mktemp("calibrate"), overrides)
        t0 = time.process_time()
        run_job(cfg)
        return time.process_time() - t0

    cpu_seconds(1)  # the first job in this process pays for imports and caches: not an epoch's cost
    short = cpu_seconds(60)
    per_epoch = (cpu_seconds(240) - short) / 180
    return max(300, round(seconds / per_epoch))


@pytest.fixture(scope="module")
def long_epochs(tmp_path_factory: pytest.TempPathFactory) -> int:
    """The time-limit job's block models, one after another: at least ~LONG_TRAINING_S, so the job outlasts its
    1-minute limit on a fast machine as on a slow or busy one."""
    return _calibrated_epochs(tmp_path_factory, LONG_TRAINING_S, "training.parallel_models=1")


@SECOND_CLUSTER
def test_time_limit_signals_requeues_and_resumes_after_the_last_finished_block(slurm_cluster: Path, tmp_path: Path,
                                                                                long_epochs: int) -> None:
    job = (*ONE_JOB, f"mdl.max_epochs={long_epochs}", f"mdl.patience={long_epochs}")
    # The reference trains the block models in lockstep (bitwise equal on CPU); the SLURM job one after another,
    # so its finished blocks advance steadily. slurmctld checks limits every 30 s and sends the warning signal
    # when at most signal_delay_s + 30 s are left: with signal_delay_s=1, USR2 comes 29-59 s into an attempt of the
    # 1-minute limit (after its first block), before its ~70 s of training end even where the calibration
    # overstated the job's speed 1.4-fold. A requeued attempt resumes after its last finished block and goes on
    # from the step the one before saved in its unfinished block.
    reference = _start(tmp_path / "local", tmp_path / "local.log", *job)
    out = tmp_path / "slurm"
    rc, text = _run(out, *job, "training.parallel_models=1", *SLURM, "hydra.launcher.timeout_min=1",
                    "hydra.launcher.signal_delay_s=1", f"hydra.launcher.max_num_timeout={MAX_REQUEUES}",
                    timeout=LOADED_WAIT_S)
    assert rc == 0, text[-3000:]
    assert "multirun: 1/1 jobs ran: 1 done, 0 skipped, 0 failed" in text, text[-3000:]
    (task,) = _slurm_jobs(out)
    logs = _logs(out, task)
    assert "Caught signal SIGUSR2" in logs and "this job is timed-out" in logs, logs[-3000:]
    assert "Requeued job" in logs, logs[-3000:]  # submitit requeued it (max_num_timeout)
    resumed = [int(k) for k in re.findall(r"resuming after block model (\d+)/5", logs)]
    assert resumed and resumed[0] >= 1, logs[-3000:]
    first_attempt = logs.split("resuming after block model")[0]
    logged = len(set(re.findall(r"block (\d)/6: trained", first_attempt)))
    assert logged - 1 <= resumed[0] <= logged  # after its last finished block (one may end as the signal lands)
    assert "SKIP" not in logs
    rows = _sacct_until(task, lambda r: "COMPLETED" in {x["State"] for x in r}, "-D")
    states = [r["State"] for r in rows]
    assert states[-1] == "COMPLETED" and len(states) >= 2 and set(states[:-1]) == {"REQUEUED"}, rows
    print("\nsacct -D -X -j", task, *(f"\n  {r}" for r in rows))
    rc_ref, ref_text = _finish(reference, tmp_path / "local.log")
    assert rc_ref == 0, ref_text[-3000:]
    (slurm_dir,), (local_dir,) = _job_dirs(out, *job), _job_dirs(tmp_path / "local", *job)
    assert _numbers(_result(slurm_dir)) == _numbers(_result(local_dir))


LONG_GROUP_S = 60  # the in-block checkpoint job's one lockstep group: more than any attempt of a 1-minute limit


@pytest.fixture(scope="module")
def long_group_epochs(tmp_path_factory: pytest.TempPathFactory) -> int:
    """The job's block models trained together in one lockstep group (the CPU default): at least ~LONG_GROUP_S,
    longer than any attempt of a 1-minute limit."""
    return _calibrated_epochs(tmp_path_factory, LONG_GROUP_S)


def test_blocks_longer_than_an_attempt_finish_from_in_block_checkpoints(slurm_cluster: Path, tmp_path: Path,
                                                                        long_group_epochs: int) -> None:
    """Every block model of this job trains in one lockstep group that needs more time than any
    attempt gets (USR2 29-59 s into each attempt of the 1-minute limit, as above). Resuming only after finished
    blocks, it was requeued until "timed-out too many times"; now each attempt saves the group at the signal
    (training/engine/checkpoint.py) and the next one goes on from that step, and the job ends with the local
    run's numbers."""
    job = (*ONE_JOB, f"mdl.max_epochs={long_group_epochs}", f"mdl.patience={long_group_epochs}")
    reference = _start(tmp_path / "local", tmp_path / "local.log", *job)
    out = tmp_path / "slurm"
    rc, text = _run(out, *job, *SLURM, "hydra.launcher.timeout_min=1", "hydra.launcher.signal_delay_s=1",
                    f"hydra.launcher.max_num_timeout={MAX_REQUEUES}", timeout=LOADED_WAIT_S)
    assert rc == 0, text[-3000:]
    assert "multirun: 1/1 jobs ran: 1 done, 0 skipped, 0 failed" in text, text[-3000:]
    (task,) = _slurm_jobs(out)
    logs = _logs(out, task)
    assert "the models in training save a checkpoint at their next step" in logs, logs[-3000:]
    assert "Requeued job" in logs and "SKIP" not in logs, logs[-3000:]
    # Each attempt after the first went on from the step the one before saved (the group, and its last block
    # model, outlast any attempt: resuming after finished blocks only, the job never ended).
    saved = [int(s) for s in re.findall(r"checkpoint of \d+ model\(s\) at step (\d+)", logs)]
    resumed = [int(s) for s in re.findall(r"resuming \d+ model\(s\) at step (\d+)", logs)]
    # (an attempt whose signal came before its training began saved nothing: the next one resumed the same step)
    assert resumed and sorted(set(resumed)) == sorted(set(saved)), (saved, resumed, logs[-3000:])
    assert resumed == sorted(resumed) and resumed[0] > 0, resumed
    print(f"\n{long_group_epochs} epochs; checkpoints at steps {saved}; resumed at {resumed}")
    rows = _sacct_until(task, lambda r: "COMPLETED" in {x["State"] for x in r}, "-D")
    states = [r["State"] for r in rows]
    assert states[-1] == "COMPLETED" and len(states) >= 2 and set(states[:-1]) == {"REQUEUED"}, rows
    print("sacct -D -X -j", task, *(f"\n  {r}" for r in rows))
    rc_ref, ref_text = _finish(reference, tmp_path / "local.log", timeout=900)
    assert rc_ref == 0, ref_text[-3000:]
    (slurm_dir,), (local_dir,) = _job_dirs(out, *job), _job_dirs(tmp_path / "local", *job)
    ours, theirs = _result(slurm_dir), _result(local_dir)
    assert _numbers(ours) == _numbers(theirs)
    assert [b["best_epoch"] for b in ours["mdl"]["blocks"]] == [b["best_epoch"] for b in theirs["mdl"]["blocks"]]
    assert not list(slurm_dir.glob("checkpoint-*.pt"))


def test_preempted_cell_stops_at_once_and_its_requeued_copy_resumes(slurm_cluster: Path, tmp_path: Path) -> None:
    """A cell of two seeds (one array task), requeued by SLURM after its first seed's first block: the requeued
    copy resumes that seed after its saved blocks, trains the other, and both land the local numbers."""
    job = ("eraser=control", "seeds=2", "mdl.full_run=false", "mdl.max_epochs=200", "mdl.patience=200",
           "training.parallel_models=1")
    reference = _start(tmp_path / "local", tmp_path / "local.log", *job)
    out = tmp_path / "slurm"
    sweep = _start(out, tmp_path / "slurm.log", *job, *SLURM)
    job_dir, other_dir = _job_dirs(out, *job)
    before = _wait_for(lambda: _blocks_done(job_dir), 240, "the job's first finished block model")
    (task,) = _slurm_jobs(out)
    requeued_at = datetime.now().replace(microsecond=0)
    subprocess.run(["scontrol", "requeue", task], env=_env(), check=True, capture_output=True, timeout=30)
    rc, text = _finish(sweep, tmp_path / "slurm.log")
    assert rc == 0, text[-3000:]
    assert "multirun: 2/2 jobs ran: 2 done, 0 skipped, 0 failed" in text, text[-3000:]
    logs = _logs(out, task)
    assert "SIGTERM (pre-emption, requeue, scancel or time limit): stopping now" in logs, logs[-3000:]
    assert "SKIP" not in logs  # the old allocation did not run on to the end
    resumed = [int(k) for k in re.findall(r"resuming after block model (\d+)/5", logs)]
    assert len(resumed) == 1 and before <= resumed[0] < 5, (before, resumed)
    rows = _sacct_until(task, lambda r: "COMPLETED" in {x["State"] for x in r}, "-D")
    assert [r["State"] for r in rows] == ["REQUEUED", "COMPLETED"], rows
    # it left the allocation promptly: well before SIGKILL (KillWait = 30 s after the SIGTERM)
    assert (_time(rows[0]["End"]) - requeued_at).total_seconds() <= 10, (requeued_at, rows)
    print("\nsacct -D -X -j", task, *(f"\n  {r}" for r in rows))
    rc_ref, ref_text = _finish(reference, tmp_path / "local.log")
    assert rc_ref == 0, ref_text[-3000:]
    for mine, local_dir in zip((job_dir, other_dir), _job_dirs(tmp_path / "local", *job), strict=True):
        assert _numbers(_result(mine)) == _numbers(_result(local_dir))


@pytest.fixture(scope="module")
def failing_sweep(slurm_cluster: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int, str]:
    """One sweep for two tests: a task that fails when it runs (CIFAR-10 is not on disk and may not be downloaded;
    a bad option would be refused before anything is submitted) next to one that runs, one at a time."""
    out = tmp_path_factory.mktemp("failing")
    rc, text = _run(out, *SLURM, "hydra.launcher.array_parallelism=1", *FAILING_SWEEP,
                    f"paths.data_dir={out / 'nodata'}")
    return out, rc, text


@SECOND_CLUSTER
def test_one_failing_array_task_is_reported_and_the_others_keep_their_results(
        failing_sweep: tuple[Path, int, str]) -> None:
    out, rc, text = failing_sweep
    assert rc != 0, text[-3000:]
    assert "multirun: 2/2 jobs ran: 1 done, 0 skipped, 1 failed" in text, text[-3000:]
    bad, good = _job_dirs(out, *FAILING_SWEEP, f"paths.data_dir={out / 'nodata'}")
    assert f"FAILED {bad}: CIFAR-10 not found" in text, text[-3000:]
    assert (good / "result.json").exists() and not (bad / "result.json").exists()
    (summary_path,) = (out / "runs/.multirun").glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert (summary["total"], summary["done"], summary["failed"]) == (2, 1, 1)
    failed = next(j for j in summary["jobs"] if j["status"] == "failed")
    assert failed["job_dir"] == str(bad) and failed["error"].startswith("CIFAR-10 not found")


@SECOND_CLUSTER
def test_array_parallelism_one_runs_the_tasks_one_after_another(failing_sweep: tuple[Path, int, str]) -> None:
    out, _, text = failing_sweep
    tasks = _slurm_jobs(out)
    assert len(tasks) == 2, text[-3000:]
    script = next((out / "runs/.submitit").glob("*/*_submission.sh")).read_text()
    assert "#SBATCH --array=0-1%1" in script
    array = tasks[0].split("_")[0]
    rows = _sacct_until(array, lambda r: len(r) == 2 and all(x["State"] in ("COMPLETED", "FAILED") for x in r))
    spans = sorted((_time(r["Start"]), _time(r["End"])) for r in rows)
    assert spans[0][1] <= spans[1][0], rows  # the second started after the first ended: no overlap


def test_sweep_over_a_key_outside_the_job_directory_loses_no_result(slurm_cluster: Path, tmp_path: Path) -> None:
    rc, text = _run(tmp_path, *SLURM, *ONE_JOB, "optim.lr=0.001,0.003")
    results = [json.loads(p.read_text()) for p in (tmp_path / "runs").rglob("result.json")]
    assert sorted(r["config"]["optim"]["lr"] for r in results) == [0.001, 0.003], text[-3000:]
    assert rc == 0 and "multirun: 2/2 jobs ran: 2 done, 0 skipped, 0 failed" in text, text[-3000:]
