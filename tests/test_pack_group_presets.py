"""Which paper presets' packs can form a pack group (`hydra/launcher=packed`, training.pack_group=auto on a GPU): per
cell, what the job decides: the seeds' data the same (`pack_group.seed_free`: per-batch erasure no longer refuses)
and the job's models trained in one group (`Trainer.group_size`, as `precheck.models_at_once` mirrors it, with the
engine the job resolves for the architecture: stacked for MLP/LeNet, loop for ConvNeXt/Swin)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from training.app.tasks import load_job
from training.common.sweep_jobs import fast_expand
from training.tasks.mdl import pack_group
from training.tasks.mdl import refusals as precheck

PAPER = ["paper_table_c", "paper_fig4_width", "paper_fig4_depth", "paper_fig5_width", "paper_fig5_depth",
         "paper_fig6_7_width", "paper_fig6_7_depth", "paper_fig8_width", "paper_fig8_depth", "paper_fig16"]
GPU = torch.device("cuda")  # the device decides the engine (auto: stacked); nothing runs on it here
SHAPES = {"cifar10": ((3, 32, 32), 10), "cifarnet": ((3, 32, 32), 10), "svhn": ((3, 32, 32), 10)}
ONE_AT_A_TIME = "its models train one at a time, so no group forms for the later seeds to join"


def why_no_pack_group(job: dict[str, Any], refusals: dict[str, str | None] | None = None) -> str | None:
    """None where a cell's pack forms a pack group on a GPU, else the one-line reason. `refusals`: the engine's
    refusal by model (its modules, which the width does not change: one shape-only build per architecture)."""
    cfg = load_job(job)
    if (reason := pack_group.seed_free(cfg)) is not None:
        return reason
    refusals = {} if refusals is None else refusals
    key = json.dumps({**job["arch"], "width": None, "regularizer": job["regularizer"]}, sort_keys=True, default=str)
    if key not in refusals:
        shape, classes = SHAPES[cfg.dataset.name]
        _, _, model = precheck._model_size(cfg.arch, shape, classes)
        refusals[key] = precheck._why_not_vectorised(cfg.training.engine, cfg.regularizer.name, model, GPU,
                                                     cfg.arch.name)
    models = cfg.mdl.num_blocks - 1 + int(cfg.mdl.full_run)
    if precheck.models_at_once(cfg.training.parallel_models, models, refusals[key]) < models:
        return f"{cfg.arch.name}: {refusals[key] or ONE_AT_A_TIME}"
    return None


@pytest.mark.parametrize("name", PAPER)
def test_every_cell_of_every_paper_preset_forms_a_pack_group(name: str, tmp_path: Path) -> None:
    """Every architecture (MLP, LeNet: the stacked engine; ConvNeXt, Swin: the loop engine, Swin's drop path drawn
    per member) and every eraser, per-batch erasure included (gradient edits the data once)."""
    cells: dict[str, tuple[str, str, str | None]] = {}
    refusals: dict[str, str | None] = {}
    for job in fast_expand(name, [f"paths.out_dir={tmp_path}", "seed=0"]):  # one job per cell
        cells[job["paths"]["job_dir"]] = (job["arch"]["name"], job["eraser"]["name"], why_no_pack_group(job, refusals))
    assert cells
    assert all(reason is None for _, _, reason in cells.values()), [c for c in cells.values() if c[2] is not None]
    archs = {arch for arch, _, _ in cells.values()}
    if "fig6_7" in name or name in ("paper_table_c", "paper_fig16"):  # where ConvNeXt and Swin cells are
        assert {"convnext", "swin"} <= archs, archs


@pytest.mark.parametrize(("arch", "override", "reason"), [
    ("convnext", "training.parallel_models=1", ONE_AT_A_TIME),
    ("swin", "training.engine=stacked", None),  # the stacked engine groups Swin too (numbers within the contract)
    ("mlp", "regularizer=sd", "a regularizer with the stacked engine"),
    ("convnext", "regularizer=sd", None),  # the loop engine takes a regularizer
])
def test_a_paper_cell_forms_no_pack_group_where_its_models_train_one_at_a_time(
        arch: str, override: str, reason: str | None, tmp_path: Path) -> None:
    (job,) = fast_expand("paper_table_c", [f"paths.out_dir={tmp_path}", "seed=0", f"arch={arch}", "eraser=leace",
                                           override])
    assert why_no_pack_group(job) == (None if reason is None else f"{arch}: {reason}")


def test_the_reasons_fire_where_the_seeds_data_differ(tmp_path: Path) -> None:
    (job,) = fast_expand("paper_table_c", [f"paths.out_dir={tmp_path}", "seed=0", "arch=mlp", "eraser=leace"])
    assert why_no_pack_group(job) is None
    for override, reason in [("dataset.permute_labels=true", "dataset.permute_labels draws each seed's labels"),
                             ("eraser.fit_on=holdout", "eraser.fit_on=holdout splits each seed's rows"),
                             ("eraser.fit_labels=shuffled", "eraser.fit_labels=shuffled draws each seed's fit labels")]:
        (other,) = fast_expand("paper_table_c", [f"paths.out_dir={tmp_path}", "seed=0", "arch=mlp", "eraser=leace",
                                                 override])
        assert why_no_pack_group(other) == reason, override
