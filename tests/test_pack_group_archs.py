"""ConvNeXt and Swin in lockstep groups (the paper presets' ConvNeXt/Swin cells): with
`training.parallel_models=auto` a job trains its block models in one group on the loop engine (these architectures
do not vectorise: the stacked engine has no measured GPU tolerance for them), and in a pack (`hydra/launcher=packed`,
`training.pack_group`) the later seeds' models join the first job's group. On CPU each member's arithmetic is its
lone arithmetic, Swin's drop path included (each member draws its masks from its own stream, the one it draws alone),
so every job's numbers are `==` those of its models trained one at a time (`training.parallel_models=1`), with
per-batch erasure (`eraser.after_augment`, every paper preset) too."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import result_of
from tests.test_pack_group import _alone, _numbers, _packed

TINY_ARCH = {"convnext": ("arch=convnext", "arch.width=8", "arch.depth=1"),
        "swin": ("arch=swin", "arch.width=8", "arch.depth=1")}  # Swin keeps its drop path (0.2, the paper's)
SMALL = ("dataset.limit=200", "mdl.max_epochs=2", "mdl.patience=1", "optim.warmup_steps=0", "eraser.after_augment=true",
         "dataset.augment=true")


@pytest.mark.parametrize("arch", ["convnext", "swin"])
def test_a_pack_group_of_convnext_or_swin_gives_each_job_its_one_at_a_time_numbers(
        tmp_path: Path, arch: str, caplog: pytest.LogCaptureFixture) -> None:
    extra = (*TINY_ARCH[arch], *SMALL)
    one_at_a_time = _alone(tmp_path / "one", *extra, "training.parallel_models=1", seeds=(0, 1))
    with caplog.at_level(logging.INFO):
        packed, pack = _packed(tmp_path / "packed", *extra, seeds=(0, 1))
    assert "pack group: this job's 6 models and 6 of seed(s) 1 train in one lockstep group" in caplog.text
    assert "6 of this job's 6 models were trained in an earlier seed's pack group" in caplog.text
    assert not pack.ahead
    assert packed[1]["eraser"]["batch_eraser"]["applied"]
    if arch == "swin":
        assert packed[0]["model"]["drop_path_rate"] > 0
    assert packed == one_at_a_time


def _numerics(out: Path) -> dict[str, Any]:
    import json

    (found,) = out.rglob("result.json")
    numerics: dict[str, Any] = json.loads(found.read_text())["provenance"]["numerics"]
    return numerics


@pytest.mark.parametrize("arch", ["convnext", "swin"])
def test_a_lone_job_groups_its_convnext_or_swin_models_on_the_loop_engine(tmp_path: Path, arch: str) -> None:
    """parallel_models=auto groups them (the signature says loop, 6 together), with parallel_models=1 they train
    one by one (fit); the numbers are the same."""
    extra = (*TINY_ARCH[arch], "dataset.limit=200", "mdl.max_epochs=2", "optim.warmup_steps=0")
    grouped = _alone(tmp_path / "auto", *extra, seeds=(0,))
    alone = _alone(tmp_path / "one", *extra, "training.parallel_models=1", seeds=(0,))
    assert _numerics(tmp_path / "auto")["engine"] == "loop" and _numerics(tmp_path / "auto")["models_together"] == 6
    assert _numerics(tmp_path / "one")["engine"] == "fit"
    assert grouped == alone


@pytest.mark.parametrize("rows", [None, 1])
def test_the_loop_engine_draws_each_members_drop_path_from_its_lone_stream(rows: int | None) -> None:
    """Swin with drop path 0.2 in a loop-engine group (all rows at once, or one row refilled from the queue; two
    workers asked for: one thread, the streams share the global RNG): each member ends bitwise as `fit` alone under
    `torch.manual_seed(rng_seed)` (parameters, curve, stop); member 1 is member 0's twin (init, rows, batches) but
    for its stream's seed, and ends apart from it."""
    import dataclasses

    from tests.helpers import group_options
    from tests.test_engine_counts import _data, _members
    from training.engine.fit import TrainData, fit
    from training.engine.group import fit_group
    from training.engine.seeding import generator

    def members() -> list[Any]:
        out = _members("swin", [64, 64, 100], [1, 1, 2], 0.2)
        out[1] = dataclasses.replace(out[0], model=out[1].model, optimizer=out[1].optimizer,
                                     gen=generator(0, "b", 0))
        out[1].model.load_state_dict(out[0].model.state_dict())
        return [dataclasses.replace(m, rng_seed=100 + k) for k, m in enumerate(out)]

    data, y, xv, yv = _data()
    solo = members()
    alone = []
    for m in solo:
        torch.manual_seed(m.rng_seed)
        alone.append(fit(m, TrainData(data, y, xv, yv)))
    grouped = members()
    together = fit_group(grouped, TrainData(data, y, xv, yv), group_options(engine="loop", rows=rows, workers=2))
    assert [(r.epochs, r.best_epoch, r.curve) for r in together] == [(r.epochs, r.best_epoch, r.curve) for r in alone]
    for s, g in zip(solo, grouped, strict=True):
        for key, a in s.model.state_dict().items():
            assert torch.equal(a, g.model.state_dict()[key]), key
    assert together[0].curve != together[1].curve  # the twins' masks differ


def test_parallel_models_auto_trains_as_many_rows_as_the_memory_estimate_fits(tmp_path: Path) -> None:
    """A ConvNeXt group holds every row's activations until its one backward: with less memory free than all its
    models need at once, `training.parallel_models=auto` takes the most rows r whose group the estimate fits (that of
    `parallel_models=r`, which tests/test_group_rows.py checks against what a job builds), down to one model at a
    time; with no figure, all of them."""
    from tests.helpers import TINY, job_config
    from training.app.tasks import load_job
    from training.data import load_dataset
    from training.tasks.mdl.refusals import estimate_memory

    base = [*TINY, *TINY_ARCH["convnext"]]
    cfg = load_job(job_config(tmp_path, base))
    data = load_dataset(cfg.dataset, cfg.paths.data_dir)
    n = len(data.y)
    assert estimate_memory(cfg, data, n).num_models == 5 and estimate_memory(cfg, data, n, free=0).num_models == 1
    for rows in range(2, 6):
        need = estimate_memory(load_job(job_config(tmp_path, [*base, f"training.parallel_models={rows}"])), data, n)
        assert need.num_models == rows
        assert estimate_memory(cfg, data, n, free=need.total).num_models == rows
        assert estimate_memory(cfg, data, n, free=need.total - 1).num_models == rows - 1
    assert estimate_memory(cfg, data, n, free=1 << 50).num_models == 5


def test_a_job_trains_at_most_the_rows_that_fit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The job hands the memory estimate's rows to its trainer (`num_models`): 2 rows for its 5 ConvNeXt models, the
    others waiting for a row; the numbers are those of one at a time."""
    import training.tasks.mdl.job as job_module
    from tests.helpers import TINY, job_config
    from training.engine.group import fit_group as real
    from training.tasks.mdl import trainer as trainer_module
    from training.tasks.mdl.job import run_job

    rows: list[int | None] = []

    def spy(members: Any, inputs: Any, options: Any) -> Any:
        rows.append(options.rows)
        return real(members, inputs, options)

    monkeypatch.setattr(trainer_module, "fit_group", spy)
    from training.tasks.mdl.refusals import estimate_memory as estimate

    monkeypatch.setattr(job_module, "estimate_memory",
                        lambda *a: dataclasses.replace(estimate(*a), num_models=2))
    extra = [*TINY, *TINY_ARCH["convnext"], "dataset.limit=200", "optim.warmup_steps=0"]
    two = _numbers(result_of(run_job(job_config(tmp_path / "two", extra))))
    assert rows == [2]
    assert two == _numbers(result_of(run_job(job_config(tmp_path / "one", [*extra, "training.parallel_models=1"]))))
    assert rows == [2]


def test_a_swin_group_stopped_inside_its_blocks_resumes_to_the_uninterrupted_numbers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    """The group checkpoint holds each row's drop-path stream (the loop engine's `rng`): a Swin job of 2 rows for
    its 6 models, stopped twice inside its group (rows refilled in between), ends with the uninterrupted job's
    numbers."""
    extra, stops = ["training.parallel_models=2"], [6, 9]
    from tests.helpers import job_config
    from tests.test_checkpoint import _interrupted_run
    from training.tasks.mdl.job import run_job

    overrides = ["experiment=smoke", "eraser=control", "seed=0", *TINY_ARCH["swin"], "dataset.limit=200",
                 "mdl.max_epochs=4", "mdl.patience=4", "optim.warmup_steps=0", *extra]
    reference = _numbers(result_of(run_job(job_config(tmp_path / "ref", overrides))))
    cut = _interrupted_run(job_config(tmp_path / "cut", overrides), monkeypatch, caplog, stops=stops)
    assert reference["model"]["drop_path_rate"] > 0
    assert _numbers(cut) == reference
