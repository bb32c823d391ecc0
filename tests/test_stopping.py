"""Step-aware early stopping (training/engine/stopping.py), written once for `fit` and `fit_group`."""

from __future__ import annotations

import dataclasses
import math
import random
from pathlib import Path

import pytest
import torch

from tests.helpers import fit_settings, group_options, job_config
from tests.test_row_stopping import _host
from tests.test_vectorized import _data, _models
from training.app.schema import MdlConfig, load_section
from training.app.tasks import load_job
from training.engine.fit import Member, TrainData, fit
from training.engine.group import fit_group
from training.engine.seeding import generator
from training.engine.stopping import MAX_EPOCHS, PATIENCE, EarlyStopping
from training.inputs.fit_settings import fit_config, stop_options


def _plain_rule(losses: list[float], patience: int, max_epochs: int) -> tuple[int, int, str]:
    """The epoch rule before it was step-aware: (stop epoch, best epoch, reason), one validation per epoch."""
    best, best_epoch, since = float("inf"), 0, 0
    for epoch, loss in enumerate(losses, start=1):
        if loss < best:
            best, best_epoch, since = loss, epoch, 0
        else:
            since += 1
        if since >= patience or epoch >= max_epochs:
            return epoch, best_epoch, PATIENCE if since >= patience else MAX_EPOCHS
    raise AssertionError("losses too short")


def _run(stopper: EarlyStopping, losses: list[float]) -> tuple[int, int, int, str]:
    """(stop epoch, best epoch, steps, reason) for one validation per epoch."""
    stop, best_epoch, _, steps, reason = _host(stopper, [[loss] for loss in losses])
    return stop, best_epoch, steps, reason


@pytest.mark.parametrize("seed", range(20))
def test_without_step_options_it_is_the_plain_epoch_rule(seed: int) -> None:
    rng = random.Random(seed)
    patience, max_epochs, spe = rng.randint(1, 6), rng.randint(3, 40), rng.randint(1, 20)
    losses = [rng.random() for _ in range(max_epochs)]
    stop, best_epoch, _, reason = _run(EarlyStopping(patience, max_epochs, spe, 0, 0, 0), losses)
    assert (stop, best_epoch, reason) == _plain_rule(losses, patience, max_epochs)


def test_no_stop_inside_the_warmup_or_before_the_step_floor() -> None:
    # The demo's smallest block: 1 step per epoch, patience 5 epochs, loss rising from the first validation.
    rising = [1.0 + 0.01 * e for e in range(2000)]
    assert _run(EarlyStopping(5, 60, 1, 0, 0, 0), rising)[:3] == (6, 1, 6)  # the plain rule: stops inside the warm-up
    stop, best, steps, reason = _run(EarlyStopping(5, 60, 1, warmup_steps=50, min_steps=0, patience_min_steps=0),
                                      rising)
    assert (stop, best, steps, reason) == (50, 1, 50, PATIENCE)
    # min_steps keeps it going past max_epochs (60 steps here); the patience floor alone does not stop it early
    stop, _, steps, reason = _run(EarlyStopping(5, 60, 1, warmup_steps=50, min_steps=300,
                                            patience_min_steps=0), rising)
    assert (steps, reason) == (300, PATIENCE)
    # a late improvement (after the warm-up) restarts the step patience: max(5 × 1, 150) steps after it
    late = [1.0] + [2.0] * 99 + [0.5] + [2.0] * 1000
    stop, best, steps, reason = _run(EarlyStopping(5, 1000, 1, warmup_steps=50, min_steps=60,
                                                   patience_min_steps=150), late)
    assert (best, steps, reason) == (101, 251, PATIENCE)
    # large blocks: patience × steps per epoch dominates the floor, so the stop epoch is the plain rule's
    stop, best, steps, reason = _run(EarlyStopping(5, 60, 40, warmup_steps=50, min_steps=300,
                                                   patience_min_steps=150), rising)
    assert (stop, best, steps, reason) == (8, 1, 320, PATIENCE)  # 300 steps floor, then 7 epochs since the best
    improving = [1.0 - 0.001 * e for e in range(100)]
    assert _run(EarlyStopping(5, 60, 40, warmup_steps=50, min_steps=300, patience_min_steps=150),
                improving)[3] == MAX_EPOCHS


def test_stop_options_from_the_mdl_config_and_stop_after_warmup_has_one_default(tmp_path: Path) -> None:
    m = load_section(MdlConfig, {"min_steps": 300, "patience_min_steps": 150})
    assert stop_options(m, 50) == {"warmup_steps": 50, "min_steps": 300, "patience_min_steps": 150}
    assert stop_options(dataclasses.replace(m, stop_after_warmup=False), 50)["warmup_steps"] == 0
    with pytest.raises(ValueError, match="mdl.min_steps=-1 is not allowed"):
        load_section(MdlConfig, {"min_steps": -1}, "mdl.")
    # A config that does not set mdl.stop_after_warmup gets the schema's default, and that is what the fit loop of
    # an MDL job and of a GS erased evaluation use (it used to be True in the schema, False in the job).
    cfg = job_config(tmp_path, ["experiment=smoke"])
    del cfg["mdl"]["stop_after_warmup"]
    job = load_job(cfg)
    default = next(f.default for f in dataclasses.fields(MdlConfig) if f.name == "stop_after_warmup")
    assert job.mdl.stop_after_warmup is default is True
    assert fit_config(job, warmup_steps=50).warmup_steps == 50


def test_fit_and_fit_group_stop_alike_and_report_why() -> None:
    """A small model cannot stop inside the warm-up or before min_steps, even past max_epochs; the lockstep
    group applies the same rule bitwise; the reason is reported."""
    data, y, xv, yv = _data()
    sizes = [45, 150, 440]  # 2, 5, 14 steps per epoch at batch 32
    subsets = [torch.arange(80, 80 + s) for s in sizes]
    cfg = fit_settings(batch_size=32, patience=1, max_epochs=9, progress=False, warmup_steps=7, min_steps=25,
                    patience_min_steps=12)
    seq = [fit(Member(model, opt, subsets[k], generator(0, "b", k), cfg), TrainData(data, y, xv, yv))
           for k, (model, opt) in enumerate(_models("mlp", [0, 1, 2]))]
    members = [Member(m, o, subsets[k], generator(0, "b", k), cfg)
               for k, (m, o) in enumerate(_models("mlp", [0, 1, 2]))]
    vec = fit_group(members, TrainData(data, y, xv, yv), group_options(engine="loop"))
    for s, v, n in zip(seq, vec, sizes, strict=True):
        assert (v.epochs, v.best_epoch, v.steps, v.stop_reason) == (s.epochs, s.best_epoch, s.steps, s.stop_reason)
        assert v.curve == s.curve
        assert s.steps >= 25 and s.stop_reason in (PATIENCE, MAX_EPOCHS)
        assert s.steps == s.epochs * -(-n // 32)
    assert seq[0].epochs > cfg.max_epochs  # 45 samples: 2 steps per epoch, 25 steps need 13 epochs
    plain = fit_settings(batch_size=32, patience=1, max_epochs=9, progress=False)
    model, opt = _models("mlp", [0])[0]
    assert fit(Member(model, opt, subsets[0], generator(0, "b", 0), plain), TrainData(data, y, xv, yv)).steps < 25


# --- stop keys that pull against each other (training/tasks/mdl/stop_keys.py) --------------------------------

def _stop_line(tmp_path: Path, *overrides: str) -> str | None:
    from training.tasks.mdl.stop_keys import floor_outlasts_cap

    cfg = load_job(job_config(tmp_path, ["dataset=digits", "mdl=quick", *overrides]))
    return floor_outlasts_cap(cfg.mdl, cfg.optim, 1797)


def test_a_step_floor_that_outlasts_the_epoch_cap_is_said_with_both_keys(tmp_path: Path) -> None:
    from training.tasks.mdl.trainer import split_of

    line = _stop_line(tmp_path, "mdl.max_epochs=8", "optim.warmup_steps=50")
    cfg = load_job(job_config(tmp_path, ["dataset=digits", "mdl=quick"]))
    smallest = split_of(cfg.mdl, 0, 1797, 10, (1, 8, 8)).block_sizes[0]  # block model 1: the first block
    steps = math.ceil(smallest / cfg.optim.batch_size)
    assert 300 / steps > 8  # the floor (mdl.min_steps=300) outlasts the cap here
    assert line == (f"mdl.min_steps=300 outlasts mdl.max_epochs=8: block model 1 ({smallest} samples, {steps} "
                    f"step{'s' if steps > 1 else ''} an epoch) trains {math.ceil(300 / steps)} epochs, not 8 (no "
                    "model stops before step 300); set mdl.min_steps=0 mdl.stop_after_warmup=false to stop every "
                    "model by mdl.max_epochs")
    warm = _stop_line(tmp_path, "mdl.max_epochs=8", "mdl.min_steps=0", "optim.warmup_steps=400")
    assert warm is not None and warm.startswith("the warm-up (optim.warmup_steps=400 with mdl.stop_after_warmup=true)")
    assert f"trains {math.ceil(400 / steps)} epochs, not 8" in warm
    # the line's claim, on the stopping rule itself: a model that keeps improving stops at epoch 300, not 8
    stop = EarlyStopping(5, 8, 1, 50, 300, 150)
    epoch = 0
    while True:
        epoch += 1
        stop.record(1.0 / epoch, epoch)
        if stop.end_epoch(epoch, epoch) is not None:
            break
    assert epoch == 300


@pytest.mark.parametrize("overrides", [
    ["mdl.max_epochs=300", "optim.warmup_steps=50"],  # the cap reaches the floor
    ["mdl.max_epochs=8", "mdl.min_steps=0", "mdl.stop_after_warmup=false"],  # no floor: the cap rules
    ["mdl.max_epochs=8", "mdl.min_steps=0", "optim.warmup_steps=0"],
    ["mdl.max_epochs=3", "optim.warmup_steps=50", "optim.batch_size=1"],  # 128 steps an epoch: 3 epochs pass 300
])
def test_no_stop_key_line_where_the_epoch_cap_holds(tmp_path: Path, overrides: list[str]) -> None:
    assert _stop_line(tmp_path, *overrides) is None
