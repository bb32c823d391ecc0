"""Early stopping decided on the device (training/engine/stopping.py `RowStopping`): the rule of `EarlyStopping`
for every row of a lockstep group as tensors, so that the host reads the done vector only every
`training.poll_every` steps. Here: the same stops, bests and reasons as `EarlyStopping` on known and random
loss sequences, and a stopped row that nothing changes any more."""

from __future__ import annotations

import math
import random

import torch

from training.engine.stopping import REASONS, EarlyStopping, RowStopping


def _rule(patience: int, max_epochs: int, spe: int, warmup: int = 0, min_steps: int = 0, floor: int = 0
          ) -> EarlyStopping:
    return EarlyStopping(patience, max_epochs, spe, warmup, min_steps, floor)


def _host(rule: EarlyStopping, losses: list[list[float]]) -> tuple[int, int, float, int, str]:
    """(stop epoch, best epoch, best loss, steps, reason) of `rule` given each epoch's validation losses."""
    for epoch, epoch_losses in enumerate(losses, start=1):
        for loss in epoch_losses:
            rule.record(loss, epoch)
        reason = rule.end_epoch(epoch, epoch * rule.steps_per_epoch)
        if reason is not None:
            return epoch, rule.best_epoch, rule.best_loss, epoch * rule.steps_per_epoch, reason
    raise AssertionError("losses too short")


def _device(rules: list[EarlyStopping], losses: list[list[list[float]]]) -> list[tuple[int, int, float, int, str]]:
    """The same for every row at once: row r ends an epoch every `steps_per_epoch` group steps and validates
    len(losses[r][e]) times in its epoch e, the losses kept coming after it stopped."""
    stops = RowStopping(rules, [1] * len(rules), [0] * len(rules), torch.device("cpu"))
    epochs = [0] * len(rules)
    last = max(len(ls) * r.steps_per_epoch for r, ls in zip(rules, losses, strict=True))
    for step in range(1, last + 1):
        ends = [r for r, rule in enumerate(rules) if step % rule.steps_per_epoch == 0 and epochs[r] < len(losses[r])]
        for r in ends:
            for loss in losses[r][epochs[r]]:
                stops.record(slice(r, r + 1), torch.tensor([loss], dtype=torch.float64))
            epochs[r] += 1
        if ends:
            stops.end_epoch(torch.tensor(ends), step)
    assert bool(stops.done.all())
    return [(int(stops.epoch[r]), int(stops.best_epoch[r]), float(stops.best_loss[r]), int(stops.stop_step[r]),
             REASONS[int(stops.reason[r])]) for r in range(len(rules))]


def test_the_device_rule_stops_where_the_host_rule_stops() -> None:
    """Rows with different epochs, patience, warm-up, floors and a NaN loss; random curves (each row validates 1-3
    times per epoch): per row the host rule's stop epoch, best epoch and loss, steps and reason, both reasons
    seen."""
    rng = random.Random(0)
    rules, losses = [], []
    for r in range(40):
        spe = rng.choice([1, 3, 7])
        settings = (rng.choice([1, 2, 5]), rng.choice([3, 8, 30]), spe, rng.choice([0, 10]), rng.choice([0, 25]),
                    rng.choice([0, 12]))
        rules.append(settings)
        curve = [[1 / (1 + e) + rng.uniform(0, 0.3) for _ in range(rng.choice([1, 1, 3]))] for e in range(80)]
        if r == 3:
            curve[2][0] = math.nan  # NaN is never a new best, on both sides
        losses.append(curve)
    host = [_host(_rule(*s), ls) for s, ls in zip(rules, losses, strict=True)]
    device = _device([_rule(*s) for s in rules], losses)
    assert device == host
    assert {h[-1] for h in host} == {"patience", "max_epochs"}


def test_a_stopped_row_changes_no_more() -> None:
    """Row 0 stops at its first epoch end (max_epochs=1); better losses recorded after that (a poll comes later)
    change neither its best nor its stop; row 1 goes on."""
    stops = RowStopping([_rule(1, 1, 2), _rule(5, 9, 2)], [1, 1], [0, 0], torch.device("cpu"))
    better = stops.record(torch.tensor([0, 1]), torch.tensor([2.0, 2.0], dtype=torch.float64))
    assert better.tolist() == [True, True]
    stops.end_epoch(torch.tensor([0, 1]), 2)
    assert stops.done.tolist() == [True, False] and stops.reason.tolist() == [2, 0]
    better = stops.record(torch.tensor([0, 1]), torch.tensor([1.0, 1.0], dtype=torch.float64))
    stops.end_epoch(torch.tensor([0, 1]), 4)
    assert better.tolist() == [False, True]
    assert stops.best_loss.tolist() == [2.0, 1.0] and stops.best_epoch.tolist() == [1, 2]
    assert stops.epoch.tolist() == [1, 3] and stops.stop_step.tolist() == [2, 0]
