"""A sweep over directories this user may not write: a colleague's cell directory (shared paths.out_dir), a
read-only job directory. Each such job fails in one line, the sweep goes on with the others (every launcher that
runs here: local, parallel, submitit_local; SLURM's jobs run the same code) and exits non-zero."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.helpers import ENV, REPO, TINY, job_config

NOBODY = 65534
needs_root = pytest.mark.skipif(os.geteuid() != 0 or shutil.which("setpriv") is None,
                                reason="needs root and setpriv to act as two users")


@pytest.fixture
def shared_out() -> Iterator[Path]:
    """A paths.out_dir two users share (pytest's tmp_path sits under a 0o700 directory of root's)."""
    out = Path(tempfile.mkdtemp(prefix="erasure-mdl-shared-"))
    out.chmod(0o777)
    try:
        yield out
    finally:
        shutil.rmtree(out, ignore_errors=True)


def _job_dir(out: Path, *overrides: str) -> Path:
    return Path(job_config(out, [*TINY, *overrides])["paths"]["job_dir"])


def _as_nobody(out: Path, *overrides: str, timeout: int = 300) -> subprocess.CompletedProcess[str]:
    cmd = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", sys.executable, "-m",
           "training.run", "-m", f"paths.out_dir={out}", "logger=none", "progress=false", *TINY, *overrides]
    return subprocess.run(cmd, capture_output=True, text=True, env={**ENV, "HOME": str(out)}, cwd=out,
                          timeout=timeout)


@needs_root
@pytest.mark.parametrize("colleagues", ["cell", "job_dir"])
def test_a_colleagues_directory_fails_its_job_in_one_line_and_the_sweep_goes_on(shared_out: Path,
                                                                                 colleagues: str) -> None:
    """Two users share paths.out_dir; the control cell's directory, or its job directory, is root's (the
    colleague's) without write for others (no lock, no result can be made there); the sweep is nobody's."""
    blocked = _job_dir(shared_out, "eraser=control", "seed=5")
    if colleagues == "cell":
        blocked = blocked.parent
    blocked.mkdir(parents=True)
    for d in [shared_out / "runs", *(shared_out / "runs").rglob("*")]:
        d.chmod(0o777)
    blocked.chmod(0o755)
    proc = _as_nobody(shared_out, "eraser=control,random", "seed=5")
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in text, text[-3000:]  # some jobs did not run
    assert "2/2 jobs ran: 1 done, 0 skipped, 1 failed" in text, text[-3000:]
    failed = [ln for ln in text.splitlines() if "FAILED" in ln]
    assert len(failed) == 1 and str(blocked) in failed[0] and "permission denied" in failed[0].lower(), failed
    assert (_job_dir(shared_out, "eraser=random", "seed=5") / "result.json").is_file()
    assert list(blocked.iterdir()) == []


@contextmanager
def _unwritable(path: Path) -> Iterator[None]:
    """`path` a directory this process cannot add to: chmod a-w, or for root (whom modes do not stop) the
    immutable attribute."""
    path.mkdir(parents=True)
    if os.geteuid() != 0:
        path.chmod(0o555)
    elif shutil.which("chattr") is None or subprocess.run(["chattr", "+i", str(path)]).returncode != 0:
        pytest.skip("root without chattr +i: cannot make a directory root may not write")
    try:
        yield
    finally:
        if os.geteuid() == 0:
            subprocess.run(["chattr", "-i", str(path)], check=True)
        path.chmod(0o755)


@pytest.mark.parametrize("launcher", ["local", "parallel", pytest.param("submitit_local", marks=pytest.mark.slow)])
def test_a_cell_that_cannot_be_written_fails_its_jobs_alone_with_every_launcher(tmp_path: Path,
                                                                                launcher: str) -> None:
    cell = _job_dir(tmp_path, "eraser=control", "seed=5").parent
    extra = ["hydra.launcher.timeout_min=10"] if launcher == "submitit_local" else []
    with _unwritable(cell):
        cmd = [sys.executable, "-m", "training.run", "-m", f"paths.out_dir={tmp_path}", "logger=none",
               "progress=false", *TINY, f"hydra/launcher={launcher}", *extra, "eraser=control,random", "seed=5"]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=ENV, cwd=REPO, timeout=600)
        assert list(cell.iterdir()) == []
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    assert "2/2 jobs ran: 1 done, 0 skipped, 1 failed" in text, text[-3000:]
    failed = [ln for ln in text.splitlines() if ln.strip().startswith("FAILED")]
    assert len(failed) == 1 and str(cell) in failed[0], failed
    assert (_job_dir(tmp_path, "eraser=random", "seed=5") / "result.json").is_file()
