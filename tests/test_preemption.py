"""SIGTERM stops a job at once and keeps its finished MDL blocks (training/cli/preemption.py); a rerun resumes.

Under SLURM the same SIGTERM comes from pre-emption or `scontrol requeue` (tests/test_slurm.py runs that on a real
cluster, where the requeued copy resumes); here it is a local multirun, its block models on two worker threads.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ENV, REPO
from training.app.lifecycle import PROGRESS_FILE
from training.app.results import LOCK_FILE
from training.cli.preemption import EXIT_STATUS, Preempted, ignore_time_limit_signal, stop_on_sigterm
from training.common import interrupt
from training.common.locks import holder_path
from training.common.sweeps import expand

SLOW_JOB = ["experiment=smoke", "eraser=control", "seed=0", "mdl.max_epochs=800", "mdl.patience=800"]


def test_sigterm_raises_preempted_in_the_main_thread_and_the_old_handler_comes_back() -> None:
    """Outside training (loading, erasing) SIGTERM raises at once; no stop request is left for a checkpoint."""
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(Preempted) as info, stop_on_sigterm():
        os.kill(os.getpid(), signal.SIGTERM)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:  # the handler runs at the next bytecode; never reached the end
            time.sleep(0.01)
    assert info.value.code == EXIT_STATUS == 143 and not isinstance(info.value, Exception)
    assert signal.getsignal(signal.SIGTERM) is before and not interrupt.requested()
    seen: list[object] = []

    def work() -> None:  # outside the main thread it changes nothing
        with stop_on_sigterm():
            seen.append(signal.getsignal(signal.SIGTERM))

    t = threading.Thread(target=work)
    t.start()
    t.join()
    assert seen == [before]


def test_a_finished_submitit_job_ignores_a_late_time_limit_signal(monkeypatch: pytest.MonkeyPatch) -> None:
    """A USR2 landing as a finished job's process exits (default handler back) would kill it by the signal, and SLURM
    would record the finished job as FAILED (exit 12): after the work, the signal is ignored. Not outside submitit."""
    before = signal.getsignal(signal.SIGUSR2)
    try:
        monkeypatch.delenv("SUBMITIT_EXECUTOR", raising=False)
        ignore_time_limit_signal()
        assert signal.getsignal(signal.SIGUSR2) == before  # a local run: nothing changes
        monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
        ignore_time_limit_signal()
        assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN
        signal.raise_signal(signal.SIGUSR2)  # would end this process under the default disposition
    finally:
        signal.signal(signal.SIGUSR2, before)


def _start(tmp_path: Path, *args: str, **popen: Any) -> tuple[subprocess.Popen[str], Path]:
    """`python -m training.run *args` of SLOW_JOB, once its first block model has finished; its job directory."""
    cmd = [sys.executable, "-m", "training.run", *args, f"paths.out_dir={tmp_path}", "logger=none", "progress=false",
           *SLOW_JOB]
    (job,) = expand("smoke", [f"paths.out_dir={tmp_path}", *SLOW_JOB[1:]])
    job_dir = Path(job["paths"]["job_dir"])
    proc = subprocess.Popen(cmd, cwd=REPO, env=ENV, text=True, **popen)
    try:
        deadline = time.monotonic() + 240
        while not (job_dir / PROGRESS_FILE).exists():
            assert proc.poll() is None, f"the job ended (exit {proc.returncode}) before its first block"
            assert time.monotonic() < deadline, "timed out waiting for the first finished block"
            time.sleep(0.05)
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    return proc, job_dir


def test_sigterm_stops_a_local_multirun_promptly_keeping_finished_blocks(tmp_path: Path) -> None:
    log = tmp_path / "first.log"
    with log.open("w") as out:
        proc, job_dir = _start(tmp_path, "-m", "training.workers=2", stdout=out, stderr=subprocess.STDOUT)
    try:
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        rc = proc.wait(timeout=60)
        stopped_s = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert rc == EXIT_STATUS, text[-3000:]
    assert stopped_s < 10, f"took {stopped_s:.1f}s to stop"
    assert "SIGTERM (pre-emption, requeue, scancel or time limit): stopping now" in text
    assert "multirun: 0/1 jobs ran" in text  # the multirun still says what happened
    kept = len(json.loads((job_dir / PROGRESS_FILE).read_text())["blocks"])
    assert 1 <= kept < 5 and not (job_dir / "result.json").exists()  # a rerun resumes from here (test_resume.py)


def test_ctrl_c_on_a_single_job_is_one_line_saying_what_was_kept(tmp_path: Path) -> None:
    """SIGINT (Ctrl-C) to `python -m training.run`: no traceback, one line naming the kept blocks and how to resume,
    exit 130; the job's lock is released (the rerun would resume, tests/test_resume.py)."""
    # a terminal's job: SIGINT at its default even where this test process inherited it ignored (an ignored
    # SIGINT passes to the child through exec, and Python then keeps ignoring it: the job never sees Ctrl-C)
    proc, job_dir = _start(tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    kept = len(json.loads((job_dir / PROGRESS_FILE).read_text())["blocks"])
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in out + err
    assert err.strip().splitlines() == [
        f"interrupted (Ctrl-C): {kept} finished MDL block model{'s' if kept != 1 else ''} kept in "
        f"{job_dir / PROGRESS_FILE}; rerun the same command to resume"], err[-3000:]
    assert not (job_dir / "result.json").exists()
    assert not holder_path(job_dir / LOCK_FILE).exists()  # released on the way out, not by the process's death
