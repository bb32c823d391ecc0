"""Numbers change only with a numerics version bump: optim.beta2 reaches the optimizer, and a golden job's bits
are pinned to task=mdl's numerics version (tests/golden/numerics.json; training.app.schema.numerics_of).

When a change alters numbers on purpose: bump NUMERICS (say why in its comment and in the README's "Numerics
versions"), set it as the `numerics` of the tasks whose numbers changed (training/tasks/<name>.py), then record the
new golden bits if the MDL task's changed: `python -m tests.test_numerics --record`.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import sys
import tempfile
from pathlib import Path

import pytest
import torch

from tests.helpers import job_config, result_of
from training.app.schema import NUMERICS, numerics_of
from training.app.tasks import job_hash, load_job, spec_of
from training.data import load_dataset
from training.tasks.mdl.job import run_job
from training.tasks.mdl.splits import make_split
from training.tasks.mdl.trainer import Trainer

GOLDEN = Path(__file__).parent / "golden" / "numerics.json"
GOLDEN_JOB = ["experiment=smoke", "eraser=leace", "mdl.max_epochs=8", "optim.warmup_steps=5", "mdl.full_run=false",
              "certificate=false", "optim.beta2=0.99", "mdl.min_steps=300", "mdl.patience_min_steps=150"]


def test_beta2_reaches_the_optimizer(tmp_path: Path) -> None:
    cfg = load_job(job_config(tmp_path, ["experiment=smoke", "optim.beta2=0.98"]))
    data = load_dataset(cfg.dataset)
    split = make_split(len(data.y), 0, val_size=64, val_frac=0.1, num_blocks=3, min_block=64)
    member = Trainer(cfg, data.x, data.y, data.num_classes, split, torch.device("cpu")).member(split.prefix(1), "t")
    assert {tuple(g["betas"]) for g in member.optimizer.param_groups} == {(cfg.optim.beta1, 0.98)}


def test_a_job_is_hashed_under_its_own_tasks_numerics_version(tmp_path: Path) -> None:
    """A task's jobs are hashed under the numerics version it pins (a task that pins none: the latest, NUMERICS), so
    a bump that changes one task's numbers moves only that task's job directories."""
    from training.app.tasks import job_cell_hash

    configs = [job_config(tmp_path, ["experiment=smoke"]), job_config(tmp_path, ["experiment=gs_two_moons"]),
               job_config(tmp_path, ["experiment=gs_sd_erasure", "task=gs_erased_eval", "eraser=leace"])]
    for cfg in configs:
        pinned = spec_of(cfg).numerics  # what the task's declaration says
        own = NUMERICS if pinned is None else pinned
        assert 1 <= own <= NUMERICS and numerics_of(spec_of(cfg)) == own
        assert job_hash(cfg) == job_hash(cfg, numerics=own) != job_hash(cfg, numerics=own - 1), cfg.get("task")
    assert numerics_of(dataclasses.replace(spec_of("mdl"), numerics=None)) == NUMERICS  # a task that pins none
    assert job_cell_hash(configs[2]) != job_cell_hash({**configs[2], "task": "mdl"})


def golden_bits(out_dir: Path) -> dict[str, object]:
    result = result_of(run_job(job_config(out_dir, GOLDEN_JOB)))
    return {"numerics_version": result["numerics_version"], "bits_per_sample": result["mdl"]["bits_per_sample"],
            "block_ce_bits": result["mdl"]["block_ce_bits"]}


def machine() -> str:
    """What the golden bits depend on besides the code: the torch build and the CPU kernels it dispatches to."""
    return f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {platform.processor() or '?'}"


def test_the_golden_job_changes_its_bits_only_with_a_numerics_bump(tmp_path: Path) -> None:
    """The golden job's bits as recorded on each machine they were recorded on: the same code gives bits that differ
    from one CPU's kernels to another's at the 1e-5 level (block 3: 3.2187340 on one machine, 3.2187523 on another,
    torch 2.14.1 both), so the bits must match one recording at rel 1e-6; a real change of the numbers matches none."""
    golden = json.loads(GOLDEN.read_text())
    if golden["numerics_version"] != numerics_of(spec_of("mdl")):
        pytest.fail(f"task=mdl's numerics version is {numerics_of(spec_of('mdl'))} but {GOLDEN} was recorded under "
                    f"{golden['numerics_version']}: record the new golden bits "
                    "(python -m tests.test_numerics --record)")
    now = golden_bits(tmp_path)
    # rel 1e-6: the round-off of another BLAS build passes; a machine's own kernels are one of the recordings
    matches = [r["machine"] for r in golden["recordings"]
               if now["block_ce_bits"] == pytest.approx(r["block_ce_bits"], rel=1e-6, abs=1e-9)]
    assert matches, (
        f"the golden job's numbers {now['block_ce_bits']} match no recording of {GOLDEN} (task=mdl: still numerics "
        f"{numerics_of(spec_of('mdl'))}): if the code changed them, bump NUMERICS in training/app/schema.py, set it as "
        "the task's `numerics` (training/tasks/mdl/__init__.py) and say why in the README, or undo the change; if "
        f"only the machine differs ({machine()}), check that main's code gives these bits here too, then "
        "`python -m tests.test_numerics --record` adds them")


def record(path: Path) -> None:
    """Add this machine's golden bits (a new numerics version: they replace every earlier recording)."""
    bits = golden_bits(Path(tempfile.mkdtemp()))
    old = json.loads(path.read_text()) if path.exists() else {}
    keep = [r for r in old.get("recordings", []) if old.get("numerics_version") == bits["numerics_version"]
            and r["block_ce_bits"] != bits["block_ce_bits"]]
    path.write_text(json.dumps({"numerics_version": bits["numerics_version"], "recordings": [*keep, {
        "machine": machine(), "bits_per_sample": bits["bits_per_sample"], "block_ce_bits": bits["block_ce_bits"]}]},
        indent=1) + "\n")


if __name__ == "__main__" and "--record" in sys.argv:
    GOLDEN.parent.mkdir(exist_ok=True)
    record(GOLDEN)
    print(f"recorded {GOLDEN}")
