"""Bad input is refused before anything runs, memory, signals to a sweep's launching
process, a full disk. One row per case.

5. bad input: one line `error: key=value is not allowed: ...` on stderr, exit 2, no directory under
   paths.out_dir/runs; a sweep is refused whole, up front (`nothing ran`)
6. the batch buffers are capped at the data size; a job that cannot fit in memory is refused with the estimate
8. SIGTERM/SIGINT to the launching process of a joblib (`parallel`) sweep stops its workers within seconds and
   frees their locks; a rerun resumes
9. a full disk while writing progress.json / result.json: one line; the ledger entry and the summary survive (and
   when the ledger cannot be written either, it says so in one line and the summary still counts the job)
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hydra import compose, initialize_config_dir

from models import build_model
from tests.helpers import CONF, ENV, REPO, TINY, fit_settings, group_options, job_config, optimizer
from training.app.lifecycle import PROGRESS_FILE
from training.app.results import LOCK_FILE
from training.app.schema import group_config
from training.app.tasks import load_job
from training.common import files as files_mod
from training.common.cells import seed_configs
from training.data import load_dataset
from training.engine import group as group_mod
from training.engine.batches import DeviceData
from training.engine.fit import Member, TrainData
from training.engine.group import fit_group
from training.errors import Refused, user_error_line
from training.tasks.mdl import refusals as precheck_mod
from training.tasks.mdl.job import run_job
from training.tasks.mdl.refusals import HELD_COPIES, MODEL_COPIES, estimate_memory
from training.tasks.mdl.splits import validation_size


def _cli(out_dir: Path, *overrides: str, multirun: bool = False, prelude: str = "", timeout: int = 300,
         ) -> subprocess.CompletedProcess[str]:
    """`python -m training.run`, after `prelude` (Python run first in the same process: a monkeypatch)."""
    args = [*(["-m"] if multirun else []), f"paths.out_dir={out_dir}", "logger=none", "progress=false", *overrides]
    if prelude:
        run = f"from training.cli.run import main\nsys.argv = ['training.run', *{args!r}]\nmain()\n"
        cmd = [sys.executable, "-c", f"import sys\n{prelude}\n{run}"]
    else:
        cmd = [sys.executable, "-m", "training.run", *args]
    return subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


def _refused(proc: subprocess.CompletedProcess[str], out_dir: Path, key: str) -> str:
    """Exit 2, exactly one line on stderr, `error: ... key=... is not allowed: ...`, no job directory."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert f"{key}=" in lines[0] and "is not allowed: " in lines[0], lines[0]
    assert not (out_dir / "runs").exists() or not any((out_dir / "runs").iterdir()), list((out_dir / "runs").rglob("*"))
    return lines[0]


# --- 5. bad input, refused before anything runs ------------------------------------------------------------------

# (override, key named). The first six were already refused by the typed options (kept here as a guard); the rest
# were tracebacks after the data had loaded (device, num_blocks, storage), or ran (tags escaping paths.out_dir).
REFUSED = [
    ("arch.activation=bogus", "arch.activation"),
    ("arch.depth_counts=blocks", "arch.depth_counts"),
    ("eraser=qleace eraser.options.rank_deficient=bogus", "eraser.options.rank_deficient"),
    ("eraser=qleace eraser.options.max_iter=abc", "eraser.options.max_iter"),
    ("regularizer=sd regularizer.lam=-1", "regularizer.lam"),
    ("regularizer=sd regularizer.lam=nan", "regularizer.lam"),
    ("dataset=synthetic dataset.num_classes=0", "dataset.num_classes"),
    ("device=cuda:abc", "device"),
    ("dataset.tag=../../x", "dataset.tag"),
    ("dataset.tag=", "dataset.tag"),
    ("arch.tag=a/b", "arch.tag"),
    ("arch.tag=a\\b", "arch.tag"),
    ("training.storage=uint8 eraser=leace", "training.storage"),
    ("training.storage=uint8", "training.storage"),  # control: digits pixels are k/16, not k/255
    ("mdl.num_blocks=1000", "mdl.num_blocks"),  # digits: 1438 samples to code make at most 719 blocks
]


@pytest.mark.parametrize(("override", "key"), REFUSED, ids=[r[0] for r in REFUSED])
def test_bad_input_is_one_line_exit_2_and_no_directory(tmp_path: Path, override: str, key: str) -> None:
    _refused(_cli(tmp_path, *TINY, *override.split(" ")), tmp_path, key)


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_without_cuda_says_what_to_do(tmp_path: Path) -> None:
    line = _refused(_cli(tmp_path, *TINY, "device=cuda"), tmp_path, "device")
    assert "device=auto" in line and "GPU" in line
    line = _refused(_cli(tmp_path, *TINY, "device=cuda:0", "seed=0,1", multirun=True), tmp_path, "device")
    assert "multirun refused (nothing ran)" in line


@pytest.mark.parametrize("override", ["arch.activation=bogus", "dataset.tag=../../x", "training.storage=uint8 "
                                      "eraser=leace", "hydra.launcher.n_jobs=0 hydra/launcher=joblib"])
def test_a_sweep_with_a_bad_value_is_refused_whole(tmp_path: Path, override: str) -> None:
    line = _refused(_cli(tmp_path, *TINY, *override.split(" "), "seed=0,1", multirun=True), tmp_path,
                    override.split(" ")[0].split("=")[0])
    assert "multirun refused (nothing ran)" in line


def test_images_and_labels_of_different_lengths_are_one_line(tmp_path: Path) -> None:
    folder = tmp_path / "data" / "cifarnet"
    folder.mkdir(parents=True)
    np.savez(folder / "train.npz", images=np.zeros((20, 8, 8, 3), np.uint8), labels=np.arange(21) % 10)
    proc = _cli(tmp_path, *TINY, "dataset=cifarnet", f"paths.data_dir={tmp_path / 'data'}")
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert "cifarnet: 20 images but 21 labels" in lines[0] and str(folder) in lines[0]


# --- 6. memory ---------------------------------------------------------------------------------------------------

def test_batch_buffers_are_capped_at_the_data_and_give_the_same_numbers() -> None:
    torch.manual_seed(0)
    x, y = torch.rand(60, 1, 4, 4), torch.arange(60) % 3
    data = DeviceData(x)
    widths: list[int] = []
    plan = group_mod._Plan

    class Watched(group_mod._Plan):
        def __init__(self, live: Any, d: Any, *rest: Any) -> None:
            super().__init__(live, d, *rest)
            widths.append(int(self.idx.shape[1]))

    def bits(batch_size: int) -> list[float]:
        arch = group_config("arch", "mlp", width=8, depth=1)
        members = []
        for k, n in enumerate((10, 30)):
            torch.manual_seed(k)
            model = build_model(arch, (1, 4, 4), 3)
            members.append(Member(model, optimizer(model, lr=1e-2, beta1=0.9, beta2=0.999, weight_decay=0.0,
                                                        warmup_steps=0),
                                  torch.arange(n), torch.Generator().manual_seed(k),
                                  fit_settings(batch_size=batch_size, patience=3, max_epochs=4, progress=False),
                                  val_idx=torch.arange(50, 60)))
        return [r.best_val_loss for r in fit_group(members, TrainData(data, y), group_options(engine="loop"))]

    group_mod._Plan = Watched  # type: ignore[misc,assignment]  # a class swapped in, restored below
    try:
        capped, exact = bits(10**6), bits(30)
    finally:
        group_mod._Plan = plan  # type: ignore[misc]
    assert widths[0] == 30, widths  # not 10**6 slots per row (10**9: an OOM kill at 23.7 GB before)
    assert capped == exact


def test_a_job_that_cannot_fit_in_memory_is_refused_with_the_estimate(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precheck_mod, "available_memory", lambda device: 2**16)  # 64 KiB free
    with pytest.raises(Refused) as err:
        run_job(job_config(tmp_path, TINY))
    line = str(err.value)
    # training.parallel_models=auto: as many of its 5 models at once as fit, and not even one does
    assert line.startswith("this job needs about ") and "(data " in line and "1 model " in line, line
    assert "but the machine has 64 KiB available: lower optim.batch_size" in line and "\n" not in line
    assert "arch.width" in line  # a model too wide (or deep) to fit: the key that made it so
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize(("extra", "together"), [
    ([], 5),  # the lockstep group: every block model at once
    (["regularizer=sd", "training.engine=stacked"], 1),  # the stacked engine takes no regularizer: one at a time
    (["regularizer=sd", "training.engine=loop"], 5),  # the loop engine does
    (["regularizer=sd", "training.engine=stacked", "training.parallel_models=3"], 1),
    (["training.parallel_models=3"], 3),
])
def test_memory_estimate_counts_the_models_that_train_together(tmp_path: Path, extra: list[str],
                                                              together: int) -> None:
    cfg = load_job(job_config(tmp_path, [*TINY, *extra]))
    data = load_dataset(cfg.dataset, cfg.paths.data_dir)
    est = estimate_memory(cfg, data, len(data.y), torch.device("cuda"))  # engine=auto would be stacked there
    assert est.num_models == together
    one = estimate_memory(load_job(job_config(tmp_path, [*TINY, "training.parallel_models=1"])), data, len(data.y))
    weights = one.models // MODEL_COPIES["loop"]  # one model's weights (one at a time: the fit loop's copies)
    engine = "loop" if together == 1 or "training.engine=loop" in extra else "stacked"
    # fewer rows than models: the group builds all 5 up front, those not in a row hold their weights; one at a time,
    # each model is built as it starts and let go when it finishes
    held = (5 - together) * HELD_COPIES if together > 1 else 0
    assert est.models == (together * MODEL_COPIES[engine] + held) * weights


def test_a_cells_estimate_counts_every_seeds_models_and_the_data_copies_it_holds(tmp_path: Path) -> None:
    """A cell of three seeds trains 3 × 5 models; its seeds share one copy of the images where the eraser is fitted on
    every row (each seed adds its validation images, twice: its own and the group's), and hold their own images and
    their concatenation otherwise (a holdout fit: each seed codes its own rows)."""
    def cell(*extra: str) -> list[Any]:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            composed = compose("config", overrides=[f"paths.out_dir={tmp_path}", "logger=none", "seeds=3", *TINY,
                                                    "eraser=leace", *extra])
        return [load_job(c) for c in seed_configs(composed)]

    shared, own = cell(), cell("eraser.fit_on=holdout")
    data = load_dataset(shared[0].dataset, shared[0].paths.data_dir)
    n, numel = len(data.y), int(data.x[0].numel())
    one, together = (estimate_memory(shared[0], data, n, cell=c) for c in ([], shared))
    assert together.num_models == 3 * one.num_models == 15 and together.models == 3 * one.models
    val = validation_size(n, shared[0].mdl.val_size, shared[0].mdl.val_frac) * numel * 4
    assert together.data == one.data + (3 * 2 - 1) * val  # the images once (erased: float32), each seed's validation
    alone, apart = (estimate_memory(own[0], data, n, cell=c) for c in ([], own))  # (as many coded rows)
    assert apart.data == 2 * 3 * alone.data  # each seed's images and validation, and the group's copies of them


@pytest.mark.parametrize(("seeds", "what"), [(1, "this job"), (3, "this cell (3 seeds)")], ids=["job", "cell"])
def test_memory_refusal_from_the_command_line(tmp_path: Path, seeds: int, what: str) -> None:
    """A job, or a cell of several seeds (each seed's precheck estimates the whole cell): one line, nothing left."""
    prelude = "import training.tasks.mdl.refusals as p\np.available_memory = lambda device: 2**16"
    proc = _cli(tmp_path, *TINY, f"seeds={seeds}", prelude=prelude)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {what} needs about "), \
        proc.stderr[-3000:]
    assert not (tmp_path / "runs").exists()


# --- a refusal inside the job: one line, and nothing it made is left (paths.out_dir included) ---------------------
IN_JOB = [  # (override, what its line says)
    ("mdl.stopping=backtrack training.engine=stacked", "training.engine=stacked is not allowed"),  # left outputs/
    ("arch.depth=10000000", "arch.depth=10000000 is not allowed"),  # built ten million layers before any check
    ("eraser=leace eraser.options.rtol=-1", "eraser.options.rtol=-1 is not allowed"),  # a traceback after the fit
    ("dataset.limit=5", "dataset.limit=5 is not allowed"),  # blamed the data files ("replace the files")
]


@pytest.mark.parametrize(("override", "says"), IN_JOB, ids=[r[0] for r in IN_JOB])
def test_a_refused_job_leaves_no_directory_it_made(tmp_path: Path, override: str, says: str) -> None:
    out = tmp_path / "outputs"
    proc = _cli(out, *TINY, *override.split(" "), timeout=60)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: {says}"), proc.stderr[-3000:]
    assert not out.exists() and tmp_path.is_dir()


@pytest.mark.parametrize("name", ["result.json", PROGRESS_FILE, LOCK_FILE, ""])  # "": the job's directory
def test_a_path_of_the_wrong_kind_is_one_line_naming_it(tmp_path: Path, name: str) -> None:
    """A directory where the job writes a file (a progress.json left so by a killed job), or a file where its
    directory belongs: one line naming the path and what to do (a traceback before)."""
    cfg = job_config(tmp_path, TINY)
    path = Path(cfg["paths"]["job_dir"]) / name
    path.parent.mkdir(parents=True)
    path.mkdir() if name else path.write_text("x")
    with pytest.raises(OSError) as err:
        run_job(cfg)
    line = user_error_line(err.value)
    assert line is not None and str(path) in line and line.endswith(": move it away, or choose another paths.out_dir")


def test_stop_keys_line_is_a_warning_when_the_command_line_sets_one(tmp_path: Path) -> None:
    """`mdl=quick mdl.max_epochs=8`: the step floor wins on small blocks, said once as the job starts (a warning;
    an info line when only the presets chose the keys). The test ends the job right after it."""
    prelude = ("import training.tasks.mdl.job as j\nfrom training.errors import Refused\n"
               "def stop(*a, **k):\n    raise Refused('stopped by the test')\nj.Trainer = stop")
    asked = _cli(tmp_path, "dataset=digits", "mdl=quick", "mdl.max_epochs=8", "optim.warmup_steps=50",
                 prelude=prelude)
    preset = _cli(tmp_path, "dataset=digits", "mdl=quick", prelude=prelude)
    for proc in (asked, preset):
        assert proc.returncode == 2 and "error: stopped by the test" in proc.stderr, proc.stderr[-2000:]
    out = asked.stdout + asked.stderr
    assert "[WARNING] - mdl.min_steps=300 outlasts mdl.max_epochs=8: block model 1 (128 samples" in out, out[-2000:]
    assert out.count("outlasts") == 1
    out = preset.stdout + preset.stderr
    assert "[INFO] - the warm-up (optim.warmup_steps=1000" in out and "[WARNING]" not in out, out[-2000:]


# --- 9. a full disk ----------------------------------------------------------------------------------------------

FULL_DISK = """
import errno, os
_fsync = os.fsync  # the files named in FULL (by their first characters) cannot be written: a full disk
FULL = {full!r}
def fsync(fd):
    name = os.path.basename(os.readlink(f"/proc/self/fd/{{fd}}"))
    if any(name.startswith("." + f) for f in FULL):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as f.write/fsync raise it: no file name
    _fsync(fd)
"""
INSTALL = "os.fsync = fsync\n"  # in the CLI's process (a test's own process: monkeypatch.setattr)


def test_full_disk_writing_result_json_or_any_file_is_one_line_naming_it(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    space: dict[str, Any] = {}
    exec(FULL_DISK.format(full=["result.json"]), space)  # the CLI tests' patch, undone after this test
    monkeypatch.setattr(os, "fsync", space["fsync"])
    cfg = job_config(tmp_path, TINY)
    with pytest.raises(OSError) as err:
        run_job(cfg)
    job_dir = Path(cfg["paths"]["job_dir"])
    assert user_error_line(err.value) == (f"no space left on device writing {job_dir / 'result.json'}: free space "
                                          "or point paths.out_dir elsewhere")
    assert not list(job_dir.glob(".result.json.*"))  # no temp file left

    def no_space(fd: int) -> None:  # every writer: the line names its file
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(files_mod.os, "fsync", no_space)
    with pytest.raises(OSError) as err:
        files_mod.atomic_write_json(tmp_path / "x" / "progress.json", {"a": 1})
    assert err.value.filename == str(tmp_path / "x" / "progress.json")
    assert list((tmp_path / "x").iterdir()) == []


def test_full_disk_in_a_sweep_keeps_the_ledger_and_the_summary(tmp_path: Path) -> None:
    proc = _cli(tmp_path, *TINY, "seed=0,1", multirun=True,
                prelude=FULL_DISK.format(full=["progress.json", "result.json", "job-00001.json"]) + INSTALL)
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0 and "Traceback" not in text, text[-3000:]
    (ledger,) = (tmp_path / "runs" / ".multirun").iterdir()
    summary = json.loads((ledger / "summary.json").read_text())
    assert (summary["total"], summary["failed"]) == (2, 2)
    for job in summary["jobs"]:  # job 1's entry could not be written: it is in the summary from memory
        assert job["error"].startswith("no space left on device writing ") and "free space" in job["error"]
        assert job["error"].split(" writing ")[1].split(":")[0].endswith(("progress.json", "result.json"))
    assert (ledger / "job-00000.json").exists() and not (ledger / "job-00001.json").exists()
    ledger_lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("multirun ledger: ")]
    assert len(ledger_lines) == 1 and "job-00001.json" in ledger_lines[0] and "counted in memory" in ledger_lines[0]
    assert "multirun: 2/2 jobs ran: 0 done, 0 skipped, 2 failed" in text


def test_full_disk_for_the_summary_still_prints_it(tmp_path: Path) -> None:
    proc = _cli(tmp_path, *TINY, "seed=0,1", multirun=True,
                prelude=FULL_DISK.format(full=["result.json", "job-", "summary.json"]) + INSTALL)
    text = proc.stdout + proc.stderr
    assert "Traceback" not in text, text[-3000:]
    assert "multirun: 2/2 jobs ran: 0 done, 0 skipped, 2 failed" in text
    assert sum(ln.startswith("multirun ledger: ") for ln in proc.stderr.splitlines()) == 3  # 2 entries + summary


FULL_LOG = """
import errno, logging, os
class Full:  # a log file on a full disk: every write fails
    def __init__(self, f): self.f = f
    def write(self, s): raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    def flush(self): pass
    def close(self): self.f.close()
_open = logging.FileHandler._open
logging.FileHandler._open = lambda self: Full(_open(self))
"""


def test_full_disk_for_the_log_files_of_a_sweep_is_one_line(tmp_path: Path) -> None:
    """Each job's run.log cannot be written: one warning line for the process, not a `--- Logging error ---`
    traceback per record (858 stderr lines for two tiny jobs before); the jobs themselves run."""
    proc = _cli(tmp_path, *TINY, "seed=0,1", multirun=True, prelude=FULL_LOG)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0 and "Logging error" not in text and "Traceback" not in text, proc.stderr[-3000:]
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("warning: cannot write the log file ") and \
        lines[0].endswith("free space or point paths.out_dir elsewhere"), lines[:5]
    assert "run.log (no space left on device)" in lines[0]
    assert "multirun: 2/2 jobs ran: 2 done, 0 skipped, 0 failed" in text


# --- 8. signals to a sweep's launching process -------------------------------------------------------------------

SLOW = [*TINY, "mdl.max_epochs=300", "mdl.patience=300", "training.workers=1"]


def _lock_is_free(lock: Path) -> bool:
    with open(lock, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            return False
        fcntl.flock(f, fcntl.LOCK_UN)
        return True


def _descendants(root: int) -> list[int]:
    parents = {}
    for name in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{name}/stat") as f:
                parents[int(name)] = int(f.read().rpartition(")")[2].split()[1])
        except (OSError, IndexError, ValueError):
            continue
    out, todo = [], [root]
    while todo:
        parent = todo.pop()
        kids = [p for p, pp in parents.items() if pp == parent]
        out += kids
        todo += kids
    return [p for p in out if not _pid_gone(p)]


def _pid_gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] in ("Z", "X")
    except OSError:
        return True


def _start_sweep(tmp_path: Path, launcher: str) -> tuple[list[str], subprocess.Popen[bytes], Path]:
    """Two SLOW jobs under `launcher` in a session of their own, returned once a block model has finished."""
    args = [sys.executable, "-m", "training.run", "-m", f"paths.out_dir={tmp_path}", "logger=none", "progress=false",
            *SLOW, "seed=0,1", f"hydra/launcher={launcher}"]
    log = tmp_path / "first.log"
    with log.open("w") as out:
        proc = subprocess.Popen(args, cwd=REPO, env=ENV, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not list((tmp_path / "runs").rglob(PROGRESS_FILE)):
            assert proc.poll() is None, log.read_text()[-3000:]
            assert time.monotonic() < deadline, "timed out waiting for a finished block"
            time.sleep(0.1)
    except BaseException:
        _kill_session(proc)
        raise
    return args, proc, log


def _still_running(pids: list[int], wait_s: float = 10) -> list[int]:
    """The processes of `pids` still running after up to `wait_s` seconds."""
    gone = time.monotonic() + wait_s
    while not all(_pid_gone(p) for p in pids) and time.monotonic() < gone:
        time.sleep(0.1)
    return [p for p in pids if not _pid_gone(p)]


def _kill_session(proc: subprocess.Popen[bytes]) -> None:
    """Nothing of a test outlives it: its session (the sweep and its workers) is killed."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


@pytest.mark.slow  # ~40 s on 2 shared cores
def test_ctrl_c_to_a_submitit_local_sweep_prints_no_worker_tracebacks(tmp_path: Path) -> None:
    """A terminal's Ctrl-C reaches the whole foreground process group: submitit's controllers (one per job) died with
    KeyboardInterrupt tracebacks on the terminal. Now they ignore SIGINT; the launching process stops the workers."""
    _, proc, log = _start_sweep(tmp_path, "submitit_local")
    try:
        workers = _descendants(proc.pid)
        os.killpg(proc.pid, signal.SIGINT)  # as the terminal sends it
        rc = proc.wait(timeout=60)
        alive = _still_running(workers)
    finally:
        _kill_session(proc)
    text = log.read_text()
    assert rc == 130 and not alive, text[-3000:]
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-3000:]
    assert "SIGINT: stopping this sweep and its" in text
    errs = "".join(p.read_text() for p in (tmp_path / "runs" / ".submitit").rglob("*_log.err"))
    assert "Traceback" not in errs, errs[-3000:]


@pytest.mark.parametrize(("launcher", "sig"), [
    ("parallel", signal.SIGTERM),
    pytest.param("parallel", signal.SIGINT, marks=pytest.mark.slow),  # ~35 s each on 2 shared cores
    pytest.param("submitit_local", signal.SIGTERM, marks=pytest.mark.slow),
], ids=["parallel-SIGTERM", "parallel-SIGINT", "submitit_local-SIGTERM"])
def test_signal_to_a_sweep_with_workers_stops_them_and_a_rerun_resumes(tmp_path: Path, launcher: str,
                                                                        sig: int) -> None:
    args, proc, log = _start_sweep(tmp_path, launcher)
    try:
        workers = _descendants(proc.pid)
        locks = list((tmp_path / "runs").rglob(LOCK_FILE))
        assert workers and len(locks) == 2
        proc.send_signal(sig)
        t0 = time.monotonic()
        rc = proc.wait(timeout=60)
        stopped_s = time.monotonic() - t0
        alive = _still_running(workers)
    finally:  # nothing of this test outlives it (its session: the sweep and its workers)
        _kill_session(proc)
    text = log.read_text()
    assert rc == 128 + sig, text[-3000:]
    assert stopped_s < 15, f"took {stopped_s:.1f}s to stop"
    assert not alive, f"workers still running: {alive}"
    assert all(_lock_is_free(lock) for lock in locks)
    assert f"{signal.Signals(sig).name}: stopping this sweep and its" in text
    assert "multirun: " in text and "jobs ran" in text
    rerun = subprocess.run(args, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    again = rerun.stdout + rerun.stderr
    assert rerun.returncode == 0, again[-3000:]
    logs = again + "".join(p.read_text() for p in (tmp_path / "runs").rglob("*.log"))  # submitit: the jobs' logs
    assert "resuming after block model" in logs
    assert len(list((tmp_path / "runs").rglob("result.json"))) == 2


# SIGKILL of a parallel sweep's parent: its loky workers stop and exit
@pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc")
def test_workers_of_a_killed_parallel_sweep_exit(tmp_path: Path) -> None:
    parent = subprocess.Popen([sys.executable, "-m", "training.run", "-m", f"paths.out_dir={tmp_path}", "logger=none",
                               "progress=false", "dataset=digits", "mdl=quick", "mdl.max_epochs=400", "mdl.min_steps=0",
                               "arch.width=16", "certificate=false", "seed=0,1", "hydra/launcher=parallel"],
                              cwd=REPO, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                              start_new_session=True)
    workers: set[int] = set()
    try:
        deadline = time.time() + 240
        while time.time() < deadline and len(list(tmp_path.rglob("run.log"))) < 2:
            time.sleep(0.5)
        workers = {p for p in _descendants(parent.pid) if b"loky" in Path(f"/proc/{p}/cmdline").read_bytes()
                   or b"joblib" in Path(f"/proc/{p}/cmdline").read_bytes()}
        assert workers, "the sweep's jobs did not start in workers"
        assert not list(tmp_path.rglob("result.json")), "the jobs finished before the parent was killed"
        parent.send_signal(signal.SIGKILL)
        parent.wait()
        deadline = time.time() + 90
        while time.time() < deadline and not all(_pid_gone(p) for p in workers):
            time.sleep(0.5)
        assert all(_pid_gone(p) for p in workers), "loky workers outlived their sweep's parent"
        assert not list(tmp_path.rglob("result.json"))  # stopped, not finished for nobody
    finally:
        for p in workers | {parent.pid}:
            if not _pid_gone(p):
                os.kill(p, signal.SIGKILL)
