"""Rows that stay full (training/engine/group.py, lockstep_state.py `RowSchedule`): a group of M rows trains more
members than M; a row whose member stops takes the next pending one, which trains exactly as it would alone.

The loop engine on CPU: results `==` training each member alone and `==` the same group without refill (a
member's arithmetic does not depend on its row or its start). The stacked engine (per-row optimizer scalars on the
device): within the stacked tolerance of tests/test_vectorized.py. Occupancy is counted on known schedules.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch
from torch import Tensor

from models import build_model
from tests.helpers import fit_settings, group_options, job_config, optimizer
from tests.test_checkpoint import _load, _stop_at
from tests.test_vectorized import SHAPE, K, _arch, _data, _models
from training.common import interrupt
from training.engine.batches import Epoch, augment_pad, draw_epoch
from training.engine.checkpoint import PATTERN
from training.engine.fit import FitResult, Member, TrainData, fit, snapshot
from training.engine.group import GROUP_FORMAT, POLL_AUTO, _Lockstep, fit_group
from training.engine.lockstep_state import LockstepMember, RowSchedule, _Plan, replay
from training.engine.seeding import generator, seeded_global_rng
from training.tasks.mdl.job import run_job

SIZES, PATIENCE = [45, 300, 64, 440, 100], [1, 3, 50, 1, 2]  # stops at different steps, for both reasons


def _members(augment: bool = False, eval_every: int | None = None, max_epochs: int = 9,
             patience: list[int] = PATIENCE) -> list[Member]:
    out = []
    for k, ((model, opt), size, p) in enumerate(zip(_models("mlp", list(range(5))), SIZES, patience, strict=True)):
        cfg = fit_settings(batch_size=32, patience=p, max_epochs=max_epochs, min_steps=30, augment=augment,
                           eval_every_steps=eval_every)
        out.append(Member(model, opt, torch.arange(80, 80 + size), generator(0, "b", k), cfg, name=f"m{k}"))
    return out


def _group(members: list[Member], rows: int | None, engine: str = "loop", poll: int = 1
           ) -> tuple[list[FitResult], list[dict[str, Tensor]], RowSchedule]:
    data, y, xv, yv = _data()
    group = _Lockstep(members, TrainData(data, y, xv, yv), group_options(engine=engine, rows=rows, poll_every=poll))
    results = group.run()
    return results, [snapshot(m.model) for m in members], group.schedule


def _numbers(res: FitResult) -> dict:
    return {k: v for k, v in dataclasses.asdict(res).items() if k != "seconds"}


def test_replay_counts_the_row_steps_polls_and_validations_of_known_schedules() -> None:
    """Members of 10, 4, 6, 3 steps (training sets 100, 40, 60, 30) through 2 rows: the largest two start (10 and
    6 steps); at step 6 the 4-step member takes the freed row (to step 10); at step 10 the 3-step member takes one
    row (to step 13) and the other row is left: 2 × 10 + 3 = 23 row-steps of work in 2 × 13 held."""
    sched = replay([10, 4, 6, 3], [100, 40, 60, 30], rows=2)
    assert sched.first == [0, 2] and not sched.queue
    assert (sched.work, sched.steps, sched.rows) == (23, 13, 2)
    assert sched.occupancy == pytest.approx(23 / 26)
    alone = replay([10, 4, 6, 3], [100, 40, 60, 30])  # a row per member: held as long as the longest
    assert (alone.work, alone.steps, alone.rows, alone.first) == (23, 10, 4, [0, 1, 2, 3])
    assert alone.occupancy == pytest.approx(23 / 40)
    assert replay([7, 5], [1, 1], rows=1).occupancy == 1.0  # one row, always refilled: nothing idle
    # The same members polled every 4 steps: the 6-step member stops at step 6, its row is seen free at step 8
    # (2 row-steps held without work) and the 4-step member runs to 12; at 12 (a poll) the 3-step one takes a row,
    # stops at 15, seen at 16; the 10-step member's row was seen free at 12. Work 23 in 2 × 16 held.
    sched = replay([10, 4, 6, 3], [100, 40, 60, 30], rows=2, poll=4)
    assert (sched.work, sched.steps) == (23, 16)
    assert replay([10, 4, 6, 3], [100, 40, 60, 30], rows=2, poll=5).steps == 15  # seen at 10, then 15
    assert replay([8, 4], [2, 1], rows=2, poll=4).steps == 8  # stops on a poll step: no wait
    # Members validating every 2 and every 3 of their own steps: together (a row each) at steps 2, 3, 4, 6 (6
    # shared): 4 steps with a validation. Through one row the second starts at step 6: 2, 4, 6, then 9, 12: 5.
    assert replay([6, 6], [2, 1], every=[2, 3]).validations == 4
    assert replay([6, 6], [2, 1], rows=1, every=[2, 3]).validations == 5


@pytest.mark.parametrize("extra", [{}, {"augment": True, "eval_every": 3}], ids=["plain", "augment-eval-every"])
@pytest.mark.parametrize("poll", [1, 7])
def test_refilled_rows_train_each_member_as_alone_bitwise_on_the_loop_engine(extra: dict, poll: int) -> None:
    """Also when the host reads the done vector only every 7 steps (`training.poll_every`): a stopped member's row
    is held, masked, until the poll; its result, best state and curve are those of the step it stopped at."""
    data, y, xv, yv = _data()
    alone_members = _members(**extra)
    alone = [fit(m, TrainData(data, y, xv, yv)) for m in alone_members]
    steps = [r.steps for r in alone]
    assert len(set(steps)) == len(steps) or len(set(steps)) > 2, steps  # members stop apart
    full, full_states, full_sched = _group(_members(**extra), rows=None, poll=poll)
    refilled, states, sched = _group(_members(**extra), rows=2, poll=poll)
    for k, res in enumerate(alone):
        assert _numbers(refilled[k]) == _numbers(res) == _numbers(full[k]), k
        for name, a in snapshot(alone_members[k].model).items():
            assert torch.equal(states[k][name], a) and torch.equal(full_states[k][name], a), (k, name)
    # the group counted exactly the schedule its members' step counts give, and refill filled its rows
    every = [extra.get("eval_every") or -(-size // 32) for size in SIZES]  # steps between validations
    expect = replay(steps, SIZES, rows=2, poll=poll, every=every)
    assert (sched.work, sched.steps, sched.rows) == (expect.work, expect.steps, 2) and sched.work == sum(steps)
    assert sched.validations == expect.validations and full_sched.validations == \
        replay(steps, SIZES, poll=poll, every=every).validations
    assert (full_sched.work, full_sched.steps) == (sum(steps), -(-max(steps) // poll) * poll)
    assert any(s % poll for s in steps) == (poll > 1)  # some member stopped between polls
    assert sched.occupancy > full_sched.occupancy


def test_refilled_rows_on_the_stacked_engine_within_its_tolerance() -> None:
    """Per-row schedule-free scalars on the device: each refilled member within the stacked engine's tolerance of
    training alone (tests/test_vectorized.py), the same stopping epochs."""
    data, y, xv, yv = _data()
    alone_members = _members()
    alone = [fit(m, TrainData(data, y, xv, yv)) for m in alone_members]
    results, states, sched = _group(_members(), rows=2, engine="stacked")
    assert sched.occupancy > 0.9
    polled, _, late = _group(_members(), rows=2, engine="stacked", poll=16)  # `auto` on the stacked engine
    assert [(r.epochs, r.best_epoch, r.steps, r.stop_reason) for r in polled] == \
        [(r.epochs, r.best_epoch, r.steps, r.stop_reason) for r in results]
    assert late.work == sched.work and late.steps > sched.steps
    for k, (res, ref) in enumerate(zip(results, alone, strict=True)):
        assert (res.epochs, res.best_epoch, res.steps) == (ref.epochs, ref.best_epoch, ref.steps), k
        assert res.best_val_loss == pytest.approx(ref.best_val_loss, rel=1e-5)
        for name, a in snapshot(alone_members[k].model).items():
            assert (states[k][name] - a).abs().max() <= 1e-4 * (a.abs().max() + 1e-3), (k, name)


def test_a_member_taking_a_row_has_the_groups_optimizer_settings() -> None:
    members = _members()
    with seeded_global_rng(0, "init", 9):
        model = build_model(_arch("mlp"), SHAPE, K)
    members[-1] = dataclasses.replace(members[-1], model=model, optimizer=optimizer(model, lr=1e-3, beta1=0.9,
                                                                                    warmup_steps=7))
    with pytest.raises(ValueError, match="identical optimizer param groups"):
        _group(members, rows=2)


JOB = ["experiment=smoke", "eraser=control", "seed=0", "mdl.max_epochs=12", "mdl.patience=12"]


def _untimed(value: object) -> object:
    """result.json without its clock readings (seconds, timings, dates) and where it ran (its directory, the
    config holding it, the code's provenance)."""
    if isinstance(value, dict):
        return {k: _untimed(v) for k, v in value.items() if k not in ("job_dir", "config", "provenance")
                and not k.endswith("_s") and not any(t in k for t in ("second", "timing", "time", "date"))}
    if isinstance(value, list):
        return [_untimed(v) for v in value]
    return value


def test_a_job_polled_every_k_steps_gives_the_same_result(tmp_path: Path) -> None:
    """`training.poll_every=13` (the host reads which models stopped every 13 steps; a stopped model's row is held
    until then) with two rows (six models, refilled) and with a row per model (the default): result.json `==` polled
    at every step (auto, on the loop engine), curves, stop reasons and codes included."""
    results = {}
    for rows in ("2", "auto"):
        for k in ("auto", 13):
            job = [*JOB, f"training.parallel_models={rows}", f"training.poll_every={k}"]
            results[rows, k] = _untimed(run_job(job_config(tmp_path / f"{rows}-{k}", job)).result)
    assert POLL_AUTO["loop"] == 1
    assert results["2", "auto"] == results["2", 13] == results["auto", 13] == results["auto", "auto"]


def test_a_checkpoint_after_a_refill_holds_the_rows_and_the_queue(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                                                  ) -> None:
    """Stopped at step 129 of two rows for six models: a member that took a freed row (its own start step), the
    pending members by name, and the row-steps counted so far. Resuming from it: tests/test_checkpoint.py
    ("refill", "refill-stacked")."""
    cfg = job_config(tmp_path, [*JOB, "training.parallel_models=2"])
    _stop_at(monkeypatch, 130)
    with pytest.raises(interrupt.Interrupted):
        run_job(cfg)
    (path,) = Path(cfg["paths"]["job_dir"]).glob(PATTERN)
    saved = _load(path)
    state = saved["state"]
    assert state["format"] == GROUP_FORMAT == 4 and state["step"] == 129 and len(saved["names"]) == 6
    starts = {n: state["members"][n]["first_step"] for n in state["live"]}
    assert len(starts) == 2 and any(s > 0 for s in starts.values()), starts
    sched = state["schedule"]
    assert sched["rows"] == 2 and sched["queue"] and set(sched["queue"]) <= set(saved["names"])
    assert sched["steps"] == 129 and sched["work"] == 2 * 129  # rows full so far
    assert not set(sched["queue"]) & (set(state["live"]) | set(state["finished"]))


def test_each_rows_next_epoch_is_drawn_one_ahead_in_fits_order() -> None:
    """A row starts with its first epoch and the second drawn ahead; at an epoch end it takes the one drawn ahead
    and draws the next: the member's generator gives the epochs `fit` would draw, in its order."""
    data, _, _, _ = _data()
    member = _members(augment=True)[1]
    row = LockstepMember.start(0, member, data.device)
    plan = _Plan([row], data)
    gen = generator(0, "b", 1)
    pad = augment_pad(data, True)
    epochs = [draw_epoch(row.size, gen, True, pad) for _ in range(3)]

    def held(idx: Tensor, off: Tensor, ep: Epoch) -> bool:
        assert ep.offsets is not None
        return torch.equal(idx[0, :row.size], row.idx[ep.perm]) and torch.equal(off[0, :row.size], ep.offsets)

    assert held(plan.idx, plan.off, epochs[0]) and held(plan.next_idx, plan.next_off, epochs[1])
    plan.new_epoch(row, 0)
    assert held(plan.idx, plan.off, epochs[1]) and held(plan.next_idx, plan.next_off, epochs[2])
    assert not held(plan.idx, plan.off, epochs[2])


def test_refilled_rows_split_over_worker_threads_give_the_same_numbers() -> None:
    """`training.workers=2` with 3 rows for 5 members: each worker thread a group of ⌈3 × its members / 5⌉ rows
    (the one with 3 members: 2 rows, refilled), from its share of the members: `==` one group without refill."""
    data, y, xv, yv = _data()
    ref, ref_states, _ = _group(_members(), rows=None)
    members = _members()
    results = fit_group(members, TrainData(data, y, xv, yv), group_options(engine="loop", rows=3, workers=2))
    assert [_numbers(r) for r in results] == [_numbers(r) for r in ref]
    for k, m in enumerate(members):
        assert all(torch.equal(v, ref_states[k][n]) for n, v in snapshot(m.model).items()), k


def test_the_memory_estimate_counts_the_models_waiting_for_a_row(tmp_path: Path) -> None:
    """`training.parallel_models=2` for six models: the job builds all six before its group starts (their weights
    exist; a waiting model's optimizer has no state yet), two rows hold optimizer state, gradients and snapshots.
    The estimate (training/tasks/mdl/refusals.py) counts that (a finished one holds its weights, its best state loaded):
    2 × MODEL_COPIES + 4 × HELD_COPIES models' weights."""
    from training.app.tasks import load_job
    from training.data import load_dataset
    from training.tasks.mdl import trainer as trainer_module
    from training.tasks.mdl.refusals import HELD_COPIES, MODEL_COPIES, estimate_memory

    built: list[list[Member]] = []

    def spy(members: list[Member], inputs: TrainData, options: object) -> list[FitResult]:
        built.append(list(members))
        assert all(not m.optimizer.state for m in members)  # nothing has stepped: weights only
        return fit_group(members, inputs, options)  # type: ignore[arg-type]

    cfg = job_config(tmp_path, [*JOB, "training.parallel_models=2"])
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer_module, "fit_group", spy)
        run_job(cfg)
    held = [sum(p.numel() for p in m.model.parameters()) for m in built[0]]
    job = load_job(cfg)
    data = load_dataset(job.dataset, job.paths.data_dir)
    est = estimate_memory(job, data, len(data.y))
    assert len(built) == 1 and len(held) == 6 and est.num_models == 2
    assert est.models == (2 * MODEL_COPIES["loop"] + 4 * HELD_COPIES) * held[0] * 4  # and each finished one
