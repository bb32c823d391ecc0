"""Numbers change only with a numerics version bump: optim.beta2 reaches the optimizer, and a golden job's bits
are pinned to task=mdl's numerics version (tests/golden/numerics.json; training.app.schema.numerics_of).

When a change alters numbers on purpose: bump NUMERICS (say why in its comment and in the README's "Numerics
versions"), set it as the `numerics` of the tasks whose numbers changed (training/tasks/<name>.py), then record the
new golden bits if the MDL task's changed: `python -m tests.test_numerics --record`.
"""

from __future__ import annotations

import dataclasses
import json
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


def test_a_numerics_bump_moves_every_job_directory(tmp_path: Path) -> None:
    cfg = job_config(tmp_path, ["experiment=smoke"])
    assert job_hash(cfg) != job_hash(cfg, numerics=numerics_of(spec_of("mdl")) - 1)


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


def test_the_golden_job_changes_its_bits_only_with_a_numerics_bump(tmp_path: Path) -> None:
    golden = json.loads(GOLDEN.read_text())
    now = golden_bits(tmp_path)
    if golden["numerics_version"] != numerics_of(spec_of("mdl")):
        pytest.fail(f"task=mdl's numerics version is {numerics_of(spec_of('mdl'))} but {GOLDEN} was recorded under "
                    f"{golden['numerics_version']}: record the new golden bits "
                    "(python -m tests.test_numerics --record)")
    # rel 1e-6: float round-off of another BLAS build passes; any real change of the numbers does not
    assert now["block_ce_bits"] == pytest.approx(golden["block_ce_bits"], rel=1e-6, abs=1e-9), (
        f"the golden job's numbers changed without a numerics bump (task=mdl: still {numerics_of(spec_of('mdl'))}): "
        "bump "
        "NUMERICS in training/app/schema.py, set it as the task's `numerics` (training/tasks/mdl/__init__.py) and say "
        "why in the README, or undo the change")


if __name__ == "__main__" and "--record" in sys.argv:
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(golden_bits(Path(tempfile.mkdtemp())), indent=1) + "\n")
    print(f"recorded {GOLDEN}")
