"""The memory estimate (training/tasks/mdl/refusals.py `estimate_memory`) bounds what a job holds, measured two ways:
the tensors alive (every CPU storage the job made, counted once) each time a block model finishes (fast, exact), and
the peak resident memory of real jobs in a subprocess beyond what the process held at its memory check (what the
check compares with the memory the machine has free): for each engine and `training.parallel_models` setting, MLPs
up to width 4096 and depth 8, and a cell of three seeds. The estimate is at least the measured peak and at most three
times it. A job that cannot fit (width 8192, depth 8, on a machine with 10 GiB free) is refused in one line before it
trains."""

from __future__ import annotations

import gc
import json
import subprocess
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import ENV, REPO, TINY, job_config
from training.tasks.mdl.job import run_job

MIN_BYTES = 1 << 14  # storages this big or bigger: weights, optimizer state, snapshots, batches
GiB = 2**30


def _storages() -> dict[int, int]:
    gc.collect()
    out: dict[int, int] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance on deprecated module attributes gc finds warns
        objects = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in objects:
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and not obj.is_meta:
                storage = obj.untyped_storage()
                if storage.nbytes() >= MIN_BYTES:
                    out[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, ReferenceError):
            continue
    return out


def _held_peak(tmp_path: Path, overrides: list[str]) -> tuple[int, Any, list[int]]:
    """(the most bytes the job's models held as a block model finished, beyond what was alive before they
    trained; the job's memory estimate; the gradients each model finished in a lockstep group still held)."""
    from training.app.tasks import load_job
    from training.data import load_dataset
    from training.engine import group as group_module
    from training.tasks.mdl import trainer as trainer_module
    from training.tasks.mdl.refusals import estimate_memory

    cfg = job_config(tmp_path, overrides)
    job = load_job(cfg)
    data = load_dataset(job.dataset, job.paths.data_dir)
    est = estimate_memory(job, data, len(data.y))
    peaks: list[int] = []
    original = trainer_module.Trainer.train_many

    def train_many(self: Any, jobs: list[Any], on_finish: Callable[..., None]) -> None:
        before = _storages()

        def measured(*args: Any) -> None:
            peaks.append(sum(n for p, n in _storages().items() if p not in before))
            on_finish(*args)

        original(self, jobs, measured)

    grads: list[int] = []
    finish_original = group_module._Lockstep._finish

    def finish(self: Any, m: Any, row: int) -> None:
        finish_original(self, m, row)
        grads.append(sum(p.grad is not None for p in m.spec.model.parameters()))

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer_module.Trainer, "train_many", train_many)
        mp.setattr(group_module._Lockstep, "_finish", finish)
        run_job(cfg)
    return max(peaks), est, grads


WIDE = [*TINY, "arch.width=256", "arch.depth=4", "mdl.max_epochs=1", "progress=false"]


@pytest.mark.parametrize("engine, parallel", [("loop", "auto"), ("loop", "2"), ("stacked", "1"), ("stacked", "auto")])
def test_the_estimate_bounds_what_the_models_hold(tmp_path: Path, engine: str, parallel: str) -> None:
    """And with two rows for six models (loop engine) the finished models wait for the group's end with their best
    state loaded and their gradients let go (HELD_COPIES, as the waiting ones)."""
    extra = [f"training.engine={engine}", f"training.parallel_models={parallel}"]
    held, est, grads = _held_peak(tmp_path, [*WIDE, *extra])
    assert 0 < held <= est.models + est.batches, (held, est)
    if (engine, parallel) == ("loop", "2"):
        assert grads == [0] * 5


def test_one_model_at_a_time_holds_one_model_whatever_the_blocks(tmp_path: Path) -> None:
    """The MLP's weights, its optimizer's state and its snapshot: MODEL_COPIES at most, for 3 blocks as for 6
    (mdl=quick's); a finished model is not kept while the next one trains (the estimate counts one model)."""
    from training.tasks.mdl.refusals import MODEL_COPIES

    one = ["training.engine=loop", "training.parallel_models=1"]
    held = {blocks: _held_peak(tmp_path / str(blocks), [*WIDE, *one, f"mdl.num_blocks={blocks}"])
            for blocks in (3, 6)}
    assert held[3][1].models == held[6][1].models  # one model's worth, whatever the blocks
    per_model = held[3][1].models // MODEL_COPIES["loop"]
    assert 0 < held[3][0] == held[6][0] <= MODEL_COPIES["loop"] * per_model, (held, per_model)


# --- the peak resident memory of real jobs -----------------------------------------------------------------------
# Each job runs in a subprocess that patches the memory it is told the machine has free (`free`), notes its estimate
# and resident memory at its memory check (the first seed's), resets the kernel's peak there (/proc/self/clear_refs)
# and prints the peak beyond it when the cell is done.
MEASURE = r"""
import gc, json, sys
from pathlib import Path

def status(field):
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))

out, free, overrides = Path(sys.argv[1]), int(sys.argv[2]), json.loads(sys.argv[3])
from hydra import compose, initialize_config_dir
from tests.helpers import CONF
from training.app.tasks import load_job
from training.common.cells import seed_configs
from training.inputs.store import Store
from training.tasks.mdl import job, refusals

refusals.available_memory = lambda device: free
got = {}
check = refusals.check_memory

def measured(cfg, data, n_coded, device, cell=()):
    check(cfg, data, n_coded, device, cell)
    if not got:
        est = refusals.estimate_memory(cfg, data, n_coded, device, free, cell)
        got.update(estimate=est.total, at_once=est.num_models)
        gc.collect()
        got["base"] = status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")

refusals.check_memory = measured
with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
    composed = compose("config", overrides=[f"paths.out_dir={out}", "logger=none", "progress=false", *overrides])
cfgs = [load_job(c) for c in seed_configs(composed)]
outcomes = job.run_cell(cfgs, Store.of(cfgs[0].paths, memos=True))
got.update(peak=status("VmHWM") - got["base"], status=[o.error or o.status for o in outcomes])
print(json.dumps(got))
"""
# MNIST-5k cut to 1500 images (512 validation), mdl=quick's six models, one epoch each: seconds to a minute a job
QUICK = ["dataset=mnist5k", "dataset.limit=1500", "mdl=quick", "mdl.max_epochs=1", "mdl.min_steps=0",
         "mdl.patience_min_steps=0", "mdl.stop_after_warmup=false", "optim.warmup_steps=5", "certificate=false"]
PLENTY = 8 * GiB  # auto: all at once (each job here needs under 3 GiB)


def _measured(tmp_path: Path, overrides: list[str], free: int = PLENTY) -> dict[str, Any]:
    """The job's estimate, models at once, and peak resident memory beyond what it held at its memory check."""
    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs (the peak resident memory reset)")
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(tmp_path), str(free), json.dumps([*QUICK, *overrides])],
                          cwd=REPO, env=ENV, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(got["status"]) == {"done"}, got
    return got


def _mlp(engine: str, parallel: str, width: int, depth: int) -> list[str]:
    return [f"training.engine={engine}", f"training.parallel_models={parallel}", f"arch.width={width}",
            f"arch.depth={depth}"]


PEAKS = {  # the figures in docs/speed.md ("The memory estimate, measured")
    "loop-1-4096x2": _mlp("loop", "1", 4096, 2),
    "loop-1-2048x8": _mlp("loop", "1", 2048, 8),
    "loop-auto-1024x8": _mlp("loop", "auto", 1024, 8),
    "loop-2-2048x4": _mlp("loop", "2", 2048, 4),
    "stacked-1-1024x4": _mlp("stacked", "1", 1024, 4),
    "stacked-auto-1024x4": _mlp("stacked", "auto", 1024, 4),
    "stacked-2-1024x8": _mlp("stacked", "2", 1024, 8),
    "cell-3-holdout-1024x4": [*_mlp("loop", "auto", 1024, 4), "seeds=3", "eraser=leace", "eraser.fit_on=holdout"],
}


@pytest.mark.xdist_group("memory_peaks")  # one at a time: each holds up to 3 GiB
@pytest.mark.parametrize("case", list(PEAKS))
def test_the_estimate_bounds_the_measured_peak(tmp_path: Path, case: str) -> None:
    got = _measured(tmp_path, PEAKS[case])
    assert got["peak"] <= got["estimate"] <= 3 * got["peak"], got


@pytest.mark.xdist_group("memory_peaks")
def test_auto_takes_the_rows_that_fit_and_the_peak_stays_within_the_free_memory(tmp_path: Path) -> None:
    """Told the machine has exactly what three rows need, `training.parallel_models=auto` trains three of the six
    models at once, and the job's peak stays under that."""
    from training.app.tasks import load_job
    from training.data import load_dataset
    from training.tasks.mdl.refusals import estimate_memory

    overrides = _mlp("loop", "3", 2048, 4)
    job = load_job(job_config(tmp_path / "plan", [*QUICK, *overrides]))
    data = load_dataset(job.dataset, job.paths.data_dir)
    free = estimate_memory(job, data, len(data.y)).total  # what three rows need
    got = _measured(tmp_path, _mlp("loop", "auto", 2048, 4), free)
    assert got["at_once"] == 3 and got["peak"] <= got["estimate"] <= free, got


def test_a_wide_deep_mlp_that_cannot_fit_is_refused_in_one_line_before_it_trains(tmp_path: Path) -> None:
    """Width 8192, depth 8 on MNIST-5k (476M parameters, 1.8 GiB a copy): one model at a time needs about 14 GiB.
    With 10 GiB free it is refused from the command line (exit 2, one line, nothing left); with 32 GiB it passes the
    check (called directly: no training)."""
    from tests.test_refusals import _cli
    from training.app.tasks import load_job
    from training.data import load_dataset
    from training.tasks.mdl import refusals

    big = ["dataset=mnist5k", "mdl=quick", "arch.width=8192", "arch.depth=8"]
    prelude = f"import training.tasks.mdl.refusals as p\np.available_memory = lambda device: {10 * GiB}"
    proc = _cli(tmp_path, *big, prelude=prelude, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("error: this job needs about 1") and "1 model " in lines[0], lines[0]
    assert "but the machine has 10.0 GiB available" in lines[0], lines[0]
    assert not (tmp_path / "runs").exists()

    job = load_job(job_config(tmp_path, big))
    data = load_dataset(job.dataset, job.paths.data_dir)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(refusals, "available_memory", lambda device: 32 * GiB)
        refusals.check_memory(job, data, len(data.y), torch.device("cpu"))
