"""A cell's seeds trained together: the block models of every seed of one configuration in one lockstep group
(training/engine/group.py), members = seeds x blocks.

Each member keeps its seed's init, split, batch order and validation rows, exactly as its seed's job alone would
train it. The seeds' data is one tensor on the device where it is the same for every seed (`eraser.fit_on=all`,
labels neither permuted nor shuffled: one copy); where a seed's data or labels are its own (holdout/self splits,
shuffled fit labels, permuted labels) the seeds' tensors are concatenated and each member indexes its seed's part.
With the loop engine on CPU a member's arithmetic does not depend on its group, so every seed's numbers are bitwise
those of a one-seed cell (tests/test_cell.py); the stacked engine, and any engine on a GPU, picks kernels by the
group's shape: there they are within the numerics contract (training/engine/numerics.py), and result.json's
numerics signature records the group size (`models_together`).

`training.parallel_models=auto` gives the group as many rows as the memory estimate allows (a stopped model's row
takes the next: training/engine/lockstep_state.py `RowSchedule`). The group's checkpoint (a signal inside a block)
is in the first seed's directory. If the group fails (a seed's non-finite loss), each seed's unfinished models train
again in the seed's own group, so one seed's failure is that seed's, never the others'.
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
from collections.abc import Sequence

import torch
from torch import Tensor, nn

from training.common import interrupt
from training.engine.batches import DeviceData
from training.engine.fit import FitResult, Member, TrainData
from training.engine.group import OnFinish, fit_group
from training.tasks.mdl.trainer import FitJob, Trainer

log = logging.getLogger(__name__)


def same(a: Tensor | None, b: Tensor | None) -> bool:
    """Both None, or the same tensor, or equal in shape, dtype and every element."""
    return a is b or (a is not None and b is not None and a.shape == b.shape and a.dtype == b.dtype
                      and torch.equal(a, b))


def _batch_map(t: Trainer) -> tuple[Tensor, ...]:
    """What a seed's batch eraser (`eraser.after_augment`) is made of, with its eraser's class (none without one)."""
    transform = t.batch_transform
    if transform is None:
        return ()
    kind = torch.tensor(list(type(transform.eraser).__name__.encode()), dtype=torch.uint8)
    return (kind, *(x.cpu() for x in transform.tensors()))


def one_transform(trainers: Sequence[Trainer]) -> bool:
    """Whether every seed's batch eraser is the same map (or none has one): one group's members share one."""
    first = _batch_map(trainers[0])
    return all(len(m := _batch_map(t)) == len(first) and all(same(a, b) for a, b in zip(m, first, strict=True))
               for t in trainers[1:])


def cell_data(trainers: Sequence[Trainer]) -> tuple[TrainData, list[int]]:
    """What the group trains and validates on, and each seed's row offset into it: the first seed's data where
    every seed's is the same, else the seeds' data concatenated."""
    first = trainers[0]
    if all(same(t.x, first.x) and same(t.y, first.y) and same(t.raw, first.raw) for t in trainers[1:]):
        return TrainData(first.train_data, first.y, val_data=first.data), [0] * len(trainers)
    offsets = [0, *itertools.accumulate(len(t.y) for t in trainers[:-1])]
    storage, device = first.opts.storage, first.device
    data = DeviceData(torch.cat([t.x for t in trainers]), device, storage=storage)
    train = data if first.raw is None else DeviceData(torch.cat([t.raw for t in trainers if t.raw is not None]),
                                                      device, storage=storage)
    return TrainData(train, torch.cat([t.y for t in trainers]), val_data=data), offsets


def train_cell(trainers: list[Trainer], jobs: list[list[FitJob]], on_finish: list[OnFinish]) -> dict[int, Exception]:
    """Train every seed's models (`jobs[s]`, reported to `on_finish[s]`) together; returns the seeds (indices) that
    failed, with their error."""
    flat = [(s, k) for s, seed_jobs in enumerate(jobs) for k in range(len(seed_jobs))]
    errors: dict[int, Exception] = {}
    if not flat:
        return errors
    lead = trainers[0]
    s0, k0 = flat[0]
    first = trainers[s0].member(*jobs[s0][k0])
    size = lead.group_size(first, len(flat))
    if size <= 1 or not one_transform(trainers):
        if size > 1:
            log.info("cell: the seeds' batch erasers differ (eraser.after_augment fitted per seed): each seed's models "
                     "train in their own group")
        return alone(trainers, jobs, on_finish, errors)
    data, offsets = cell_data(trainers)
    transform = lead.batch_transform
    # one validation index tensor per seed's split: the group decodes each seed's validation images once (`ValSet`)
    vals = [t.split.val_idx.to(t.device) + off for t, off in zip(trainers, offsets, strict=True)]
    members: list[Member] = []
    for s, k in flat:
        t = trainers[s]
        m = first if (s, k) == (s0, k0) else t.member(*jobs[s][k])
        cfg = m.cfg if transform is None else dataclasses.replace(m.cfg, batch_transform=transform)
        split = t.split.of_model(jobs[s][k][1])  # the model's own with mdl.split=redraw
        val = vals[s] if split is t.split else split.val_idx.to(t.device) + offsets[s]
        members.append(dataclasses.replace(m, idx=m.idx + offsets[s], val_idx=val, cfg=cfg,
                                           name=f"seed {t.seed} {m.name}"))
    finished: set[tuple[int, int]] = set()

    def done(j: int, model: nn.Module, res: FitResult) -> None:
        s, k = flat[j]
        finished.add((s, k))
        if s in errors:
            return
        try:
            on_finish[s](k, model, res)
        except Exception as err:  # noqa: BLE001 - this seed's failure (e.g. a non-finite code length): the others go on
            interrupt.stop_behind(err)
            errors[s] = err

    log.info("cell: %d seeds' %d models in one lockstep group of %d rows", len(trainers), len(flat), size)
    try:
        fit_group(members, data, lead.group_options(done, rows=None if size >= len(flat) else size))
    except Exception as err:  # noqa: BLE001 - any failure: each seed's unfinished models train in its own group
        interrupt.stop_behind(err)  # a stop torch.save turned into a RuntimeError passes too
        log.warning("the cell's group failed (%s: %s); each seed's unfinished models train in the seed's own group",
                    type(err).__name__, err)
        index = [[k for k in range(len(seed_jobs)) if (s, k) not in finished] for s, seed_jobs in enumerate(jobs)]
        alone(trainers, [[jobs[s][k] for k in ks] for s, ks in enumerate(index)],
              [_renumbered(on_finish[s], ks) for s, ks in enumerate(index)], errors)
    return errors


def _renumbered(on_finish: OnFinish, index: list[int]) -> OnFinish:
    """`on_finish` of the models `index` (their numbers among the seed's), called with their numbers among these."""
    def done(k: int, model: nn.Module, res: FitResult) -> None:
        on_finish(index[k], model, res)
    return done


def alone(trainers: list[Trainer], jobs: list[list[FitJob]], on_finish: list[OnFinish],
          errors: dict[int, Exception]) -> dict[int, Exception]:
    """Each seed's models in the seed's own group, one seed after another (a seed in `errors` is left out)."""
    for s, t in enumerate(trainers):
        if s in errors:
            continue
        try:
            t.train_many(jobs[s], on_finish[s])
        except Exception as err:  # noqa: BLE001 - this seed's failure
            interrupt.stop_behind(err)
            errors[s] = err
    return errors
