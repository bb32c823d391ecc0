"""The MDL job's trainer: a fresh μP model and optimizer per fit, trained on index subsets of on-device data
(`Trainer`), and the split of a job's coded rows (`split_of`)."""

from __future__ import annotations

import dataclasses
import logging
import math
from typing import Any

import torch

from models.registry import arch_traits
from training.app.schema import JobConfig, MdlConfig
from training.engine.backends import compile_mode
from training.engine.batches import DeviceData
from training.engine.checkpoint import CheckpointStore
from training.engine.fit import (
    FitResult,
    Member,
    TrainData,
    cross_entropy_sum,
    fit,
    fit_temperature,
)
from training.engine.group import GroupOptions, OnFinish, fit_group, resolve_engine, why_not_vectorized
from training.engine.numerics import JobNumerics
from training.engine.regularizers import build_regularizer
from training.engine.seeding import derive_seed, generator, seeded_global_rng
from training.inputs.fit_settings import fit_config, resolve_optim
from training.inputs.pipeline import BatchErasure
from training.tasks.mdl.splits import MdlSplit, make_split, model_name, smallest_block

log = logging.getLogger(__name__)
LN2 = math.log(2)
FitJob = tuple[torch.Tensor, object, "int | None"]  # (training rows, tag, eval_every_steps): one model to train


class Trainer:
    """Builds a fresh μP model + optimizer per fit and trains it on index subsets of on-device data.

    The data lives on the device once, in the smallest exact dtype (`training.storage`); batches are index
    gathers. `train_many` trains several models (the block models of a job) in lockstep groups of
    `training.parallel_models` (auto: all of them, or as many as fit in memory: `model_room`) on `engine` (auto:
    stacked on a GPU where the architecture vectorises, else loop).

    `batches` (`eraser.after_augment`): the training batches are drawn from `batches.raw` (a second copy on the
    device) and erased after augmentation by `batches.transform`; the validation set and the coded blocks are
    the erased `x`, as without it.

    `numerics`: the job's (training/engine/numerics.py; None outside a job: fp32). The seeds of a cell train their
    models together (training/tasks/mdl/cell.py), each seed's from its own trainer's `member`s.
    """

    def __init__(self, cfg: JobConfig, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                 split: MdlSplit, device: torch.device, data: DeviceData | None = None,
                 batches: BatchErasure | None = None, checkpoint: CheckpointStore | None = None,
                 numerics: JobNumerics | None = None):
        self.cfg, self.seed, self.opts = cfg, cfg.seed, cfg.training
        self.numerics = numerics
        self.checkpoint = checkpoint  # where a signal saves the models in training (training/engine/checkpoint.py)
        # `data`: the same x already on the device (several seeds' trainers share one copy)
        self.data = data if data is not None else DeviceData(x, device, storage=self.opts.storage)
        self.train_data, self.batch_transform = self.data, None
        self.raw = None if batches is None else batches.raw  # what the batches are drawn from, when not `x`
        if batches is not None:
            self.train_data = DeviceData(batches.raw, device, storage=self.opts.storage)
            self.batch_transform = batches.transform.to(device)  # the eraser's state moves to the device once
        self.y = y.to(device)
        self.num_classes, self.split, self.device = num_classes, split, device
        self.optim = resolve_optim(cfg.optim, cfg.arch)
        # the group engine (auto: stacked on a GPU where the architecture vectorises, else loop: `resolve_engine`)
        self.engine = resolve_engine(self.opts.engine, device, arch_traits(cfg.arch.name).vectorises)
        self.regularizer = build_regularizer(cfg.regularizer, num_classes)
        self.x_val, self.y_val = self.data.all(split.val_idx), self.y[split.val_idx.to(device)]
        self.input_shape = tuple(int(s) for s in x.shape[1:])
        self.x = x  # the images as given (a cell's seeds share them where they are the same)
        self.model_info: dict[str, Any] = {}
        self.model_room: int | None = None  # how many of its models fit at once (the job's memory estimate; None: all)

    def train_set(self) -> TrainData:
        """What every model of this job trains on (raw when erased after augmentation) and validates on: the job's
        validation set, or (`mdl.split=redraw`) each model's own (`Member.val_idx` into the erased images)."""
        if self.split.redraw_seed is not None:
            return TrainData(self.train_data, self.y, val_data=self.data)
        return TrainData(self.train_data, self.y, self.x_val, self.y_val)

    def member(self, idx: torch.Tensor, tag: object, eval_every_steps: int | None = None) -> Member:
        """A fresh model (init drawn from (seed, "init", tag)), its optimizer, data subset and generator."""
        from models import build_with_facts

        with seeded_global_rng(self.seed, "init", tag):
            model, facts = build_with_facts(self.cfg.arch, self.input_shape, self.num_classes)
            model = model.to(self.device)
        self.model_info = facts
        opt = self.optim.build(model)
        return Member(model, opt, idx.to(self.device), generator(self.seed, "batches", tag),
                      fit_config(self.cfg, self.optim.warmup_steps, eval_every_steps, self.batch_transform,
                                 self.numerics), val_idx=self.split.of_model(tag).val_idx, name=model_name(tag),
                      rng_seed=derive_seed(self.seed, "train", tag))  # as `_fit_one` seeds it

    def train(self, idx: torch.Tensor, tag: object, eval_every_steps: int | None = None
              ) -> tuple[torch.nn.Module, FitResult]:
        return self._fit_one(self.member(idx, tag, eval_every_steps), tag)

    def _fit_one(self, m: Member, tag: object) -> tuple[torch.nn.Module, FitResult]:
        # Dropout/drop-path draw from the global RNG: seed it per (seed, tag) so a resumed job's block i
        # sees the same stream as in an uninterrupted run (and runs do not depend on earlier blocks).
        with seeded_global_rng(self.seed, "train", tag):
            res = fit(m, self.train_set(), self.regularizer, desc=f"{tag}", checkpoint=self.checkpoint,
                      compile=compile_mode(self.opts.compile))
        return m.model, res

    def group_size(self, first: Member, count: int) -> int:
        """How many models train at once: `training.parallel_models` (auto: all, at most `model_room` | N), 1 where
        the group engine cannot take them."""
        want = self.opts.parallel_models
        reason = (why_not_vectorized(first.model, first.optimizer, self.regularizer, self.engine)
                  or first.cfg.one_at_a_time())
        if str(want) == "auto":
            room = count if self.model_room is None else self.model_room
            return 1 if reason is not None else max(1, min(count, room))
        if int(want) > 1 and reason is not None:
            log.warning("training.parallel_models=%s ignored: %s; training one model at a time", want, reason)
            return 1
        return max(1, int(want))

    def train_many(self, jobs: list[FitJob], on_finish: OnFinish) -> None:
        """Train one model per (idx, tag, eval_every_steps); `on_finish(k, model, result)` as each one ends (any
        order within a group). Numbers as `train` one by one under the numerics contract (training/engine/numerics.py):
        bitwise with the loop engine on CPU (the default there); the stacked engine, and any engine on a GPU, within
        its tolerance (tests/test_vectorized.py)."""
        if not jobs:
            return
        first = self.member(*jobs[0])
        size = self.group_size(first, len(jobs))
        if size == 1 and len(jobs) == 1 and self.checkpoint is not None and self.checkpoint.in_group(first.name):
            size = 2  # the last model of a group an earlier attempt saved goes on in that group's engine
        if size <= 1:
            pending: Member | None = first
            del first  # one model at a time: a finished model (its optimizer state, its snapshot) is not kept
            for k, job in enumerate(jobs):
                member, pending = (pending if pending is not None else self.member(*job)), None
                on_finish(k, *self._fit_one(member, job[1]))
                del member
            return
        # `size` rows: a row whose model stops takes the next model (training/engine/lockstep_state.py RowSchedule)
        members = [first] + [self.member(*job) for job in jobs[1:]]
        fit_group(members, self.train_set(), self.group_options(on_finish, rows=size))

    def group_options(self, on_finish: OnFinish, rows: int | None = None) -> GroupOptions:
        o = self.opts
        return GroupOptions(on_finish=on_finish, progress=self.cfg.progress, compile=o.compile, engine=self.engine,
                            regularizer=self.regularizer, workers=o.workers, fused_optimizer=o.fused_optimizer,
                            checkpoint=self.checkpoint, rows=rows, poll_every=o.poll_every)

    def code_bits(self, model: torch.nn.Module, idx: torch.Tensor, split: MdlSplit) -> tuple[float, float]:
        """Mean cross-entropy in bits of `model` (already in eval mode) on the samples `idx`, and the
        temperature used (1 unless `mdl.calibrate_temperature`, then fitted on the validation set of the model's
        `split`)."""
        idx = idx.to(self.device)
        t = 1.0
        if self.cfg.mdl.calibrate_temperature:
            val = split.val_idx.to(self.device)
            x_val, y_val = (self.x_val, self.y_val) if split is self.split else (self.data.all(val), self.y[val])
            t = fit_temperature(model, x_val, y_val)
        return cross_entropy_sum(model, self.data.all(idx), self.y[idx], temperature=t) / len(idx) / LN2, t


def split_of(m: MdlConfig, seed: int, n: int, num_classes: int, input_shape: tuple[int, ...]) -> MdlSplit:
    """The job's MDL split of its `n` coded rows (validation set and blocks, drawn from its `seed`) of K classes
    and samples of `input_shape` (`mdl.min_block=paper_code` reads them)."""
    split = make_split(n, seed, val_size=m.val_size, val_frac=m.val_frac, num_blocks=m.num_blocks,
                       min_block=smallest_block(m.min_block, num_classes, math.prod(input_shape)))
    return dataclasses.replace(split, redraw_seed=seed) if m.split == "redraw" else split
