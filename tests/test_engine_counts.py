"""The engine's deterministic CPU counts (tools/bench_engine.py): no host read inside a training step, host work
per step independent of the number of models, the stacked step captured whole by torch.compile, and ConvNeXt /
Swin in the stacked engine equal to training them one by one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import erasure
from models.registry import Arch
from tests.helpers import fit_settings, group_options
from tests.test_vectorized import TOL, _data
from tools import bench_engine as bench
from training.app.schema import group_config
from training.engine.batches import class_segments
from training.engine.fit import Member, TrainData, fit
from training.engine.group import fit_group, why_not_vectorized
from training.engine.seeding import generator, seeded_global_rng
from training.inputs.erase import BatchEraser


@pytest.mark.parametrize("path", ["fit", "loop", "stacked", "fit+augment", "loop+augment", "stacked+augment",
                                  "fit+erase", "loop+erase", "stacked+erase", "fit+linear", "fit+augment+cl",
                                  "loop+augment+cl"])
def test_no_host_read_inside_a_training_step(path: str) -> None:
    """Per step (the difference of a 2S-step and an S-step run, validation and set-up cancelling): no
    `.item()`/`float()`/`nonzero`/`unique`/boolean-mask index/`tolist`, with per-batch QLEACE erasure too."""
    syncs, uploads = bench.syncs([path])
    assert syncs[path] == 0 and uploads[path] == 0


def test_qleace_by_host_segments_is_the_same_map_bit_for_bit_and_the_counter_sees_a_read_back() -> None:
    """Where the sync counter must fire: QLEACE applied without the host's class segments reads the labels back
    (unique, tolist, masks), and a one-epoch run counts its validation's reads."""
    data, y, _, _ = bench._data()
    eraser = erasure.fit("qleace", data.all(), y)
    transform = BatchEraser(eraser)
    with bench.counting() as mode:
        transform(data.all(torch.arange(16)), y[:16])
    assert mode.syncs > 3
    with bench.counting() as mode:
        bench._run("stacked", 2, 2)
    assert mode.syncs > 0
    idx = torch.randperm(len(y), generator=torch.Generator().manual_seed(1))[:37]
    x, labels = data.all(idx), y[idx]
    segments = class_segments(labels, labels.numpy())
    assert segments.counts == tuple(np.bincount(labels.numpy()))
    assert torch.equal(transform(x, labels, segments), eraser(x, labels))
    wrong = class_segments(labels.roll(1), labels.roll(1).numpy())  # another batch's labels: another map
    assert not torch.allclose(transform(x, labels, wrong), eraser(x, labels), atol=1e-3)


def test_host_work_per_step_does_not_grow_with_the_number_of_models() -> None:
    """The stacked engine: aten ops and Python calls per step for 64 models within 10% of those for 1. The loop
    engine (one forward per model, bitwise as alone) grows with the models: the count sees that."""
    ops, calls = bench.ops([1, 64])
    assert abs(ops["64"] / ops["1"] - 1) <= 0.1, ops
    assert abs(calls["64"] / calls["1"] - 1) <= 0.1, calls
    loop_ops, _ = bench.ops([1, 8], "loop")
    assert loop_ops["8"] > 4 * loop_ops["1"]


@pytest.mark.parametrize("arch", ["mlp", "lenet"])
def test_the_stacked_step_compiles_without_graph_breaks(arch: str) -> None:
    assert bench.graph_breaks([arch]) == {arch: 0}


def test_occupancy_and_validation_calls_of_known_groups() -> None:
    """Without refill a group holds a row per model until its longest stops; with refill (rows < models) the
    models queue, largest training set first (exact row-steps: tests/test_group_rows.py).
    Validation calls = steps where some model validates, summed over groups. The demo cell twice (two seeds),
    steps per epoch [1, 3, 6, 11, 20]: as two groups each validates at every step for 300 steps (its 1-step-epoch
    models), then at the other models' epoch ends; as one group of a row per model the two seeds' equal blocks
    validate together: half the calls. Through five refilled rows the seeds' equal blocks queue side by side."""
    assert bench.occupancy_of([[10, 10], [5, 10]], [[1, 2], [1, 2]]) == pytest.approx(35 / 40)
    demo, sizes, every = [300, 300, 360, 660, 1200], [1, 2, 3, 4, 5], [1, 3, 6, 11, 20]  # the demo's control cell
    assert bench.occupancy_of([demo], [sizes]) == pytest.approx(2820 / 6000)
    # two rows: 1200 | 660, 360 (from 660), 300 (from 1020); the last 300 from 1200 on the first row: 1500 steps
    assert bench.occupancy_of([demo], [sizes], rows=2) == pytest.approx(2820 / 3000)
    # the cell twice through five rows: 1200, 1200, 660, 660, 360 start; 360 takes the row freed at 360 (to 720),
    # 300s those freed at 660 (to 960, 960) and 720 (to 1020), the last 300 one freed at 960 (to 1260)
    assert bench.occupancy_of([demo + demo], [sizes * 2], rows=5) == pytest.approx(5640 / (5 * 1260))
    apart = bench.validations_of([demo, demo], [sizes, sizes], [every, every])
    together = bench.validations_of([demo + demo], [sizes * 2], [every * 2])
    assert apart[0] == 2 * together[0] and apart[1] == 2 * together[1] == 2400
    refilled = bench.validations_of([demo + demo], [sizes * 2], [every * 2], rows=5)
    assert together[0] < refilled[0] < apart[0] and refilled[1] == 1260
    polled = bench.validations_of([demo + demo], [sizes * 2], [every * 2], rows=5, poll=16)
    assert polled[0] >= refilled[0] and polled[1] >= refilled[1]


def test_one_host_read_per_poll_not_per_model() -> None:
    """An epoch of 3 models (their validation, the epoch end, a poll of the done vector at once): one read back,
    the poll's, on both engines (it was 3 + 2 on the loop engine: a float per model's loss and the NaN check's
    two; 3 on the stacked one)."""
    assert bench.syncs_per_validation(["loop", "stacked"]) == {"loop": 1.0, "stacked": 1.0}


def _tiny(name: str, drop_path: float = 0.0) -> Arch:
    extra = {"stages": 3} if name == "swin" else {}
    return group_config("arch", name, width=8, depth=1, base_width=8, drop_path_rate=drop_path, **extra)


def _members(name: str, sizes: list[int], patience: list[int], drop_path: float = 0.0,
             dtype: torch.dtype = torch.float32) -> list[Member]:
    from models import build_model
    from tests.helpers import optimizer

    out = []
    for k, (size, p) in enumerate(zip(sizes, patience, strict=True)):
        with seeded_global_rng(0, "init", k):
            model = build_model(_tiny(name, drop_path), (3, 8, 8), 4).to(dtype)
        cfg = fit_settings(batch_size=32, patience=p, max_epochs=6, augment=True, progress=False)
        out.append(Member(model, optimizer(model, lr=2e-3, beta1=0.9, warmup_steps=7), torch.arange(80, 80 + size),
                          generator(0, "b", k), cfg))
    return out


@pytest.mark.parametrize("name", ["convnext", "swin"])
def test_convnext_and_swin_stacked_equal_one_by_one(name: str) -> None:
    """Tiny ConvNeXt and Swin (drop path 0: dropouts at p = 0 no longer refuse) in the stacked engine: the same
    early-stopping epochs, validation losses and parameters as training each alone, members stopping at different
    epochs. In float64 (the same arithmetic, to 1e-12): in float32 their LayerNorm/GRN/attention let Adam amplify
    the batched kernels' rounding to ~1e-4 relative within 6 epochs (measured), like MLPs at a high lr."""
    loss_rtol, param_tol = TOL[torch.float64]
    data, y, xv, yv = _data(dtype=torch.float64)
    sizes, patience = [45, 150, 300], [1, 2, 50]
    solo = _members(name, sizes, patience, dtype=torch.float64)
    alone = [fit(m, TrainData(data, y, xv, yv)) for m in solo]
    members = _members(name, sizes, patience, dtype=torch.float64)
    assert why_not_vectorized(members[0].model, members[0].optimizer, engine="stacked") is None
    together = fit_group(members, TrainData(data, y, xv, yv), group_options(engine="stacked"))
    assert len({r.epochs for r in alone}) > 1
    for a, b in zip(alone, together, strict=True):
        assert (a.epochs, a.best_epoch, a.steps) == (b.epochs, b.best_epoch, b.steps)
        assert [v for _, v in b.curve] == pytest.approx([v for _, v in a.curve], rel=loss_rtol)
    for s, m in zip(solo, members, strict=True):
        for key, a in s.model.state_dict().items():  # parameters, and Swin's constant buffers
            b = m.model.state_dict()[key]
            assert (a - b).abs().max() <= param_tol * (a.abs().max() + 1e-3), key


def test_swin_drop_path_draws_per_member_in_the_stacked_engine() -> None:
    """Drop path 0.2: the stacked engine takes it and each member draws its own masks: two identical members (same
    init, data, batches) end apart, while with drop path 0 they end equal. (The loop engine takes it too, each member
    drawing its lone stream: tests/test_cell.py.)"""
    def twins(drop_path: float) -> list[float]:
        members = _members("swin", [64, 64], [50, 50], drop_path)
        members[1] = Member(members[1].model, members[1].optimizer, members[0].idx, generator(0, "b", 0),
                            members[0].cfg)
        members[1].model.load_state_dict(members[0].model.state_dict())
        data, y, xv, yv = _data()
        return [r.best_val_loss for r in fit_group(members, TrainData(data, y, xv, yv),
                                                   group_options(engine="stacked"))]

    m = _members("swin", [64], [1], 0.2)[0]
    assert why_not_vectorized(m.model, m.optimizer, engine="loop") is None
    assert why_not_vectorized(m.model, m.optimizer, engine="stacked") is None
    same = twins(0.0)
    assert same[0] == same[1]
    apart = twins(0.2)
    assert apart[0] != apart[1]


@pytest.mark.parametrize("flag, modes", [("true", ["default"]), ("false", [])])
def test_training_compile_reaches_the_one_model_fit(flag: str, modes: list[str], tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A job training one model at a time (`parallel_models=1`: ConvNeXt's and Swin's default) compiles each
    model's training forward with `training.compile`, and only then."""
    from tests.helpers import job_config
    from training.tasks.mdl.job import run_job

    seen: list[Any] = []  # each call's mode (None: torch's default; sorted() below fails loudly on a mix)

    def compile_spy(model: torch.nn.Module, mode: str | None = None, **_: object) -> torch.nn.Module:
        seen.append(mode)
        return model

    monkeypatch.setattr(torch, "compile", compile_spy)
    run_job(job_config(tmp_path, ["experiment=smoke", "eraser=control", "mdl.full_run=false",
                                  "training.parallel_models=1", f"training.compile={flag}"]))
    assert sorted(set(seen)) == modes and (len(seen) > 1) == bool(modes)
