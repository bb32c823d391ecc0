"""Many independent models trained in lockstep: the block models of an MDL sweep and/or several seeds.

Each member keeps its own init, training subset, batch order, augmentation stream, schedule-free state and early
stopping, exactly as `training.engine.fit.fit` would train it alone (the same `draw_epoch` streams). One step takes one
batch per live member (gathered, cropped/flipped, decoded and mapped by the shared `batch_transform` in one go); a
member whose epoch ends is validated, and one that early-stops leaves the group, its row taken by the next pending
member (`GroupOptions.rows`, lockstep_state.py `RowSchedule`). The step's arithmetic is the engine's (backends.py):
`loop` (bitwise sequential training, tests/test_vectorized.py; default on CPU) or `stacked` (default on GPU).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import Tensor, nn

from training.common import interrupt
from training.common.progress import progress_bar
from training.engine.backends import LoopEngine, StackedEngine, ValSet
from training.engine.batches import class_segments, host_copy
from training.engine.checkpoint import CheckpointStore, Saved, fits_safely
from training.engine.fit import (
    NEEDS_SHARED_VAL,
    BatchTransform,
    FitResult,
    Member,
    Regularizer,
    TrainData,
    _global_rng,
    _set_global_rng,
    nonfinite_loss,
    snapshot,
)
from training.engine.flat_optim import fused_backend
from training.engine.lockstep_state import LockstepMember, RowSchedule, _name, _Plan, balanced_parts
from training.engine.seeding import derive_seed
from training.engine.stopping import REASONS, RowStopping

ENGINES = ("auto", "loop", "stacked")
GROUP_FORMAT = 4  # a group checkpoint's layout (4: early stopping on the device, validations not yet polled)
POLL_AUTO = {"loop": 1, "stacked": 16}  # training.poll_every=auto, by engine (the loop engine's CPU: no gain)
log = logging.getLogger(__name__)


OnFinish = Callable[[int, nn.Module, FitResult], None]  # (member index, model in eval mode with best state, result)


@dataclass(frozen=True)
class GroupOptions:
    """How a group trains (`fit_group`): `training.*` and `progress`, all given (their defaults live once, in
    training/app/schema.py); the regularizer and what to call as each member ends (None: none)."""

    engine: str
    progress: bool
    compile: bool | str | None
    fused_optimizer: bool | str
    workers: int | str
    rows: int | None  # at most this many members train at once, the others wait for a row (None: all)
    poll_every: int | str  # the host reads which rows stopped every this many steps (auto: POLL_AUTO)
    on_finish: OnFinish | None = None
    regularizer: Regularizer | None = None
    checkpoint: CheckpointStore | None = None  # where a stop request (training/common/interrupt.py) saves the group


def why_not_vectorized(model: nn.Module, optimizer: torch.optim.Optimizer,
                       regularizer: Regularizer | None = None, engine: str = "loop") -> str | None:
    """None when `model` can be trained by `fit_group` with `engine`, else the reason (the caller falls back
    to `fit`)."""
    if regularizer is not None and engine == "stacked":
        return "a regularizer is set (the stacked engine's padded batches would change its batch mean)"
    if (refusal := module_refusal(model, engine)) is not None:
        return refusal
    if not all(k in optimizer.param_groups[0] for k in ("k", "weight_sum", "betas", "train_mode")):
        return f"{type(optimizer).__name__} is not a schedule-free AdamW"
    return None


def module_refusal(model: nn.Module, engine: str) -> str | None:
    """Why `model`'s modules cannot train in a group on `engine` (None: they can). Constant buffers (SwinV2's
    relative positions) are fine; so are dropout and drop path (the loop engine gives each member its own stream of
    the global RNG, `Member.rng_seed`; the stacked engine draws their masks with vmap randomness="different")."""
    if any(isinstance(m, nn.modules.batchnorm._NormBase) for m in model.modules()):
        return "the model has batch norm (its running statistics are state that training changes)"
    return None


def draws_masks(model: nn.Module) -> bool:
    """Whether training `model` draws dropout / drop path masks from the global RNG: a dropout's p or a drop path's
    drop_prob (timm's DropPath) above 0 (at p = 0 dropout returns its input unchanged)."""
    return any((float(m.p) if isinstance(m, nn.modules.dropout._DropoutNd) else
                float(getattr(m, "drop_prob", 0.0) or 0.0)) > 0 for m in model.modules())


def resolve_engine(engine: str, device: torch.device, vectorises: bool = True) -> str:
    """`training.engine`: auto → stacked on a GPU for an architecture that vectorises (its registry entry), else
    loop (bitwise one model's arithmetic on CPU; ConvNeXt/Swin stacked on a GPU have no measured tolerance yet)."""
    if engine not in ENGINES:
        raise ValueError(f"training.engine must be one of {ENGINES}, got {engine!r}")
    if engine == "auto":
        return "stacked" if device.type == "cuda" and vectorises else "loop"
    return engine


def fit_group(members: Sequence[Member], inputs: TrainData, options: GroupOptions) -> list[FitResult]:
    """Train all members at once; each ends as `training.engine.fit.fit` would (best state loaded, eval mode),
    validated on the shared (x_val, y_val), else on its own `val_idx`; `on_finish(k, model, result)` is called as
    member k ends (in any order). `regularizer`: loop engine only. `workers` (CPU, loop engine): the members split
    over this many threads, each a lockstep group on its own core (`resolve_workers`; the numbers do not change).
    `fused_optimizer` (loop engine): the optimizer step as one kernel over flat buffers (flat_optim.py)."""
    if not members:
        return []
    device = inputs.data.device
    kind = check_options(options.engine, options.workers, options.fused_optimizer, device)
    options = dataclasses.replace(options, engine=kind)  # resolved: loop | stacked
    n_workers = resolve_workers(options.workers, device, kind, len(members))
    if n_workers > 1 and draws_masks(members[0].model):
        n_workers = 1  # the loop engine swaps each member's stream into the one global RNG: one thread
    return _fit_threads(members, inputs, options, n_workers) if n_workers > 1 else _fit_rows(members, inputs, options)


def _fit_rows(members: Sequence[Member], inputs: TrainData, options: GroupOptions,
              stop: threading.Event | None = None) -> list[FitResult]:
    """One lockstep group of `options.rows` rows refilled from the queue; with `training.fused_optimizer` (whose
    flat buffers step one cohort) the queue trains in chunks of `rows` members instead."""
    rows = options.rows
    if rows is None or rows >= len(members) or fused_backend(options.fused_optimizer, inputs.data.device) is None:
        return _Lockstep(members, inputs, options, stop).run()
    results: list[FitResult] = []
    for start in range(0, len(members), rows):
        def done(k: int, model: nn.Module, res: FitResult, offset: int = start) -> None:
            if options.on_finish is not None:
                options.on_finish(offset + k, model, res)

        results += _Lockstep(members[start: start + rows], inputs, replace(options, on_finish=done, rows=None),
                             stop).run()
    return results


def check_options(engine: str, workers: int | str, fused_optimizer: bool | str, device: torch.device,
                  vectorises: bool = True) -> str:
    """One clear error for a bad `training.engine` / `workers` / `fused_optimizer` (run_job checks them before
    any data is loaded); returns the resolved engine (`vectorises`: the architecture's, see `resolve_engine`)."""
    kind = resolve_engine(engine, device, vectorises)
    backend = fused_backend(fused_optimizer, device)
    if kind == "stacked" and backend is not None:
        raise ValueError("training.fused_optimizer applies to the loop engine (the stacked engine already steps "
                         "all members with a few batched kernels); set training.engine=loop or drop it")
    resolve_workers(workers, device, kind, 1)
    return kind


def resolve_workers(workers: int | str, device: torch.device, engine: str, n_members: int) -> int:
    """`training.workers`: auto → on CPU with the loop engine, one thread per intra-op thread torch would use
    (`torch.get_num_threads()`), at most one per member; else 1. A small model's step is a chain of small kernels
    that two cores split poorly, while disjoint groups of models, one per core, scale almost linearly."""
    if str(workers) == "auto":
        return 1 if device.type != "cpu" or engine != "loop" else max(1, min(torch.get_num_threads(), n_members))
    n = int(workers)
    if n < 1:
        raise ValueError(f"training.workers must be auto or a positive integer, got {workers!r}")
    if n > 1 and (device.type != "cpu" or engine != "loop"):
        raise ValueError(f"training.workers={n} needs the CPU and the loop engine (got {device.type}, {engine})")
    return min(n, n_members)


class Cancelled(Exception):
    """A sibling worker failed (or the run was interrupted): this worker stopped early."""


def _cost(member: Member, inputs: TrainData) -> float:
    """A member's training + half its validation samples (a forward only) per epoch, times the epochs it may take."""
    x_val, val_idx = inputs.x_val, member.val_idx
    n_val = len(x_val) if x_val is not None else len(val_idx) if val_idx is not None else 0
    spe = math.ceil(len(member.idx) / member.cfg.batch_size)
    return (len(member.idx) + n_val / 2) * member.cfg.max_steps_estimate(spe) / spe


def _fit_threads(members: Sequence[Member], inputs: TrainData, options: GroupOptions,
                 n_workers: int) -> list[FitResult]:
    """Members split over `n_workers` threads, each one lockstep group with one intra-op thread (torch kernels
    release the GIL: the groups run on separate cores). `on_finish` calls are serialised (one lock); if a worker
    fails the others stop at their next step and the first error is raised."""
    parts = _saved_parts(members, options.checkpoint)
    rest = [k for k in range(len(members)) if not any(k in p for p in parts)]
    if rest:
        parts += [[rest[j] for j in p] for p in balanced_parts([_cost(members[k], inputs) for k in rest], n_workers)]
    results: list[FitResult | None] = [None] * len(members)
    lock, stop = threading.Lock(), threading.Event()
    bar = progress_bar(total=len(members), desc=f"{len(members)} models, {len(parts)} workers", unit="model",
                       disable=not options.progress)

    def work(part: list[int]) -> None:
        torch.set_num_threads(1)

        def done(j: int, model: nn.Module, res: FitResult) -> None:
            with lock:
                results[part[j]] = res
                if options.on_finish is not None:
                    options.on_finish(part[j], model, res)
                bar.update(1)

        rows = None if options.rows is None else max(1, math.ceil(options.rows * len(part) / len(members)))
        _fit_rows([members[k] for k in part], inputs, replace(options, on_finish=done, progress=False, rows=rows), stop)

    threads = torch.get_num_threads()
    try:
        with ThreadPoolExecutor(len(parts), thread_name_prefix="fit-worker") as pool:
            futures = [pool.submit(work, p) for p in parts]
            try:
                wait(futures, return_when=FIRST_EXCEPTION)
            finally:  # an error, or e.g. KeyboardInterrupt while waiting: the other workers stop too
                stop.set()
            errors = (f.exception() for f in futures)
            if (first := next((e for e in errors if e is not None and not isinstance(e, Cancelled)), None)) is not None:
                raise first
    finally:
        stop.set()
        torch.set_num_threads(threads)
        bar.close()
    return [r for r in results if r is not None]


def _saved_parts(members: Sequence[Member], store: CheckpointStore | None) -> list[list[int]]:
    """The members (indices) of each worker group an interrupted attempt checkpointed: each finds its file again."""
    if store is None:
        return []
    names = [_name(m, k) for k, m in enumerate(members)]
    parts: list[list[int]] = []
    for saved in (s for s in store.saved() if s.kind == "group"):
        if part := [k for k, n in enumerate(names) if n in saved.names and not any(k in p for p in parts)]:
            parts.append(part)
    return parts


def _make_engine(members: Sequence[Member], options: GroupOptions, refill: bool) -> LoopEngine | StackedEngine:
    models, opts = [m.model for m in members], [m.optimizer for m in members]
    numerics, dev = members[0].cfg.numerics, next(models[0].parameters()).device
    fmt = None if numerics is None else numerics.memory_format(models[0], dev, options.engine)
    if options.engine != "stacked":
        seeds = [rng_seed(m) for m in members] if draws_masks(models[0]) else None
        return LoopEngine(models, opts, options, seeds, fmt)
    if options.regularizer is not None:
        raise ValueError("the stacked engine does not support a regularizer; use engine='loop'")
    return StackedEngine(models, opts, options.compile, per_row=refill)


def rng_seed(member: Member) -> int:
    """The seed of the global RNG stream `member` draws its masks from (`Member.rng_seed`, else one of its own)."""
    return member.rng_seed if member.rng_seed is not None else derive_seed(member.gen.initial_seed(), "masks")


class _Lockstep:
    """One lockstep group on the current thread: every live member takes one batch per step; a member whose epoch
    ends is validated and may stop, and a stopped one leaves the group. Row r of the plan and engine is `live[r]`."""

    def __init__(self, members: Sequence[Member], inputs: TrainData, options: GroupOptions,
                 stop: threading.Event | None = None) -> None:
        dev = inputs.data.device
        self.y, self.data, self.options = inputs.y.to(dev), inputs.data, options
        val_data = inputs.data if inputs.val_data is None else inputs.val_data  # members' own val_idx index it
        self.val = ValSet(val_data, self.y, None if inputs.x_val is None else inputs.x_val.to(dev),
                          None if inputs.y_val is None else inputs.y_val.to(dev), [m.val_idx for m in members])
        self.members = [LockstepMember.start(k, m, dev) for k, m in enumerate(members)]
        self.schedule = RowSchedule([m.size for m in self.members], options.rows)
        self.live = [self.members[k] for k in self.schedule.first]
        self.refill = bool(self.schedule.queue)  # rows take new members: per-row optimizer scalars
        transform = members[0].cfg.batch_transform
        # a label-dependent batch transform gets each step's class segments from the host's labels (no read back)
        self.y_host = host_copy(inputs.y) if transform is not None and transform.needs_labels else None
        if transform is not None and not self.val.shared and inputs.val_data is None:
            raise ValueError(NEEDS_SHARED_VAL)
        # the loop engine transforms each member's batch alone, as `fit` does (bitwise); the stacked one all at once
        self.transform_rows = options.engine != "stacked"
        self.random = draws_masks(members[0].model)  # draws masks from the global RNG
        self.on_finish, self.stop = options.on_finish, stop
        self.step = 0
        self.poll_every = max(1, int(POLL_AUTO.get(options.engine, 1) if str(options.poll_every) == "auto"
                                     else options.poll_every))
        # validations the host has not read yet: (group step, rows, their epochs, losses on the device)
        self.pending: list[tuple[int, list[int], list[int], Tensor]] = []
        self.unpolled = False  # a validation or an epoch end since the last poll (a row may have stopped)
        self.names = [m.name for m in self.members]
        self.store = options.checkpoint if len(set(self.names)) == len(self.names) else None
        fused = fused_backend(options.fused_optimizer, dev) is not None and options.engine != "stacked"
        self.engine_kind = "stacked" if options.engine == "stacked" else \
            f"{'FlatScheduleFree' if fused else 'LibraryOptim'}/{options.engine}"
        self.finished: dict[str, tuple[nn.Module, FitResult]] = {}  # for a checkpoint: their results, best states
        self.restored_from: Path | None = None
        self.bar = progress_bar(total=len(members), desc=f"{len(members)} models", unit="model",
                                disable=not options.progress)
        self.t0 = time.perf_counter()

    def _build(self) -> None:
        """The plan and the engine of the live rows (pending members size the plan's buffers)."""
        pending = [self.members[k] for k in self.schedule.queue]
        self.plan = _Plan(self.live, self.data, self.y_host, pending)
        self.engine = _make_engine([m.spec for m in self.live], self.options, self.refill)
        self.stops = RowStopping([m.stopper for m in self.live], [m.epoch for m in self.live],
                                 [m.first_step for m in self.live], self.y.device)

    def run(self) -> list[FitResult]:
        saved = self._restore() if self.store is not None else None
        if self.live:  # (a checkpoint may hold every member finished)
            self._build()
            self._train(saved)
        self.bar.close()
        if self.store is not None:
            self.store.delete(self.store.path(self.names), self.restored_from)
        for m in self.members:
            m.spec.model.eval()
        return [m.result for m in self.members if m.result is not None]

    def _train(self, saved: dict | None) -> None:
        """Steps until every member has stopped (from the saved step, if any). Dropout / drop path (stacked engine)
        draw from the global RNG, seeded from the first member's batch generator (a checkpoint saves it)."""
        devices = [self.y.device] if self.y.device.type == "cuda" else []
        with (torch.random.fork_rng(devices, enabled=self.random),
              self.engine if isinstance(self.engine, StackedEngine) else nullcontext(),
              interrupt.checkpointing() if self.store is not None else nullcontext()):
            if self.random:
                torch.manual_seed(self.members[0].spec.gen.initial_seed())
            if saved is not None:
                self._load(saved)
            self.engine.train()
            while self.live:
                if self.store is not None and interrupt.requested():
                    self._save()
                    raise interrupt.Interrupted(interrupt.signum())
                self._train_step()
                self._validate(self.plan.validating(self.step))
                self._end_epochs()
                if self.unpolled and self.step % self.poll_every == 0:
                    self._retire(self._poll())

    def _train_step(self) -> None:
        if self.stop is not None and self.stop.is_set():
            raise Cancelled
        gidx, xb, wb = self.plan.batch()
        yb = self.y[gidx]
        counts = self.plan.counts() if self.transform_rows else None  # the loop engine's slices
        if self.plan.transform is not None:
            xb = self._transform(self.plan.transform, xb, yb, counts)
        numerics, kind = self.members[0].spec.cfg.numerics, type(self.engine).__name__[:-6].lower()
        with nullcontext() if numerics is None else numerics.training_forward(xb.device, kind, len(self.members)):
            self.engine.step(xb, yb, wb, counts, self.step - self.plan.start, self.stops.done)  # own steps so far
        self.step += 1
        self.schedule.step(len(self.live))
        self.plan.advance()

    def _transform(self, transform: BatchTransform, xb: Tensor, yb: Tensor, counts: list[int] | None) -> Tensor:
        """The members' `batch_transform` on the step's batches (rows, bs, c, h, w), after augmentation; a
        label-dependent one with the class segments of its rows, from the host's labels."""
        labels = self.plan.labels() if transform.needs_labels else None
        if counts is None:
            segments = None if labels is None else class_segments(yb, labels)
            return transform(xb.reshape(-1, *xb.shape[2:]), yb.reshape(-1), segments).reshape(xb.shape)
        for r, c in enumerate(counts):  # the rows past c are never read by the loop engine
            segments = None if labels is None else class_segments(yb[r, :c], labels[r, :c])
            xb[r, :c] = transform(xb[r, :c], yb[r, :c], segments)
        return xb

    def _validate(self, rows: list[int]) -> None:
        """Validation of `rows`: losses, best states and the stop rule's bests on the device (read at the next poll)."""
        if not rows:
            return
        ms = [self.live[r] for r in rows]
        if not self.pending or self.pending[-1][0] != self.step:
            self.schedule.validations += 1  # a step with a validation
        losses = self.engine.validate(rows, [m.index for m in ms], self.val, self.stops.record)
        self.pending.append((self.step, rows, [m.epoch for m in ms], losses))
        self.unpolled = True

    def _end_epochs(self) -> None:
        """Rows whose epoch just ended are validated (per-epoch validation) and the stop rule decides on the device
        whether they stop; every one draws its next epoch (a stopped one's is never read)."""
        ends = self.plan.ended()
        if not ends:
            return
        self._validate([r for r in ends if not self.live[r].spec.cfg.eval_every_steps])
        self.stops.end_epoch(torch.tensor(ends, device=self.y.device), self.step)
        for r in ends:
            self.live[r].epoch += 1  # the host's count (messages); a stopped member's is the device's
            self.plan.new_epoch(self.live[r], r)
        self.plan.restart(ends)
        self.unpolled = True

    def _poll(self) -> list[int]:
        """The host's one read back (every `poll_every` steps, where a row may have stopped): the done vector, the
        stopped rows' numbers, the validation losses since the last poll (curves) and whether the training losses
        stayed finite (else NonFiniteError). Records after a member's stop are dropped: it finishes with the numbers
        of the step it stopped at. Returns the rows that stopped."""
        s, n = self.stops, len(self.live)
        ints = torch.stack([s.done.long(), s.reason, s.stop_step, s.epoch, s.best_epoch,
                            torch.isfinite(self.engine.loss_sum).long()])
        values = torch.cat([ints.double().flatten(), s.best_loss, *(p[3] for p in self.pending)]).tolist()
        self.engine.loss_sum.zero_()
        done, reason, stop_step, epoch, best_epoch, finite, best_loss = (values[i * n:(i + 1) * n] for i in range(7))
        losses = iter(values[7 * n:])
        if (r := next((r for r in range(n) if not finite[r]), None)) is not None:
            m, ended = self.live[r], bool(self.plan.batches[r] == 0)  # named by the epoch of its last step
            raise nonfinite_loss("training loss", m.name, self.step - m.first_step, m.epoch - ended)
        for step, rows, epochs, _ in self.pending:
            for r, ep in zip(rows, epochs, strict=True):
                loss, m = next(losses), self.live[r]
                if done[r] and step - m.first_step > stop_step[r]:
                    continue  # validated after it stopped
                if not math.isfinite(loss):
                    raise nonfinite_loss("validation loss", m.name, step - m.first_step, ep)
                m.curve.append((step - m.first_step, loss))
        self.pending, self.unpolled = [], False
        stopped = [r for r in range(n) if done[r]]
        for r in stopped:
            m = self.live[r]
            m.stopper.best_loss, m.stopper.best_epoch = best_loss[r], int(best_epoch[r])
            m.epoch, m.stop_reason, m.stop_step = int(epoch[r]), REASONS[int(reason[r])], int(stop_step[r])
            self.schedule.idle(self.step - m.first_step - m.stop_step)  # held after it stopped: no work
        return stopped

    def _retire(self, done: list[int]) -> None:
        """Finish the stopped rows, each taking the next pending member if any; compact to the rows still held."""
        if not done:
            return
        for r in done:
            self._finish(self.live[r], r)
        rows = []
        for r in range(len(self.live)):
            if r in done:
                k = self.schedule.next()
                if k is None:
                    continue
                self._take(r, self.members[k])
            rows.append(r)
        if len(rows) < len(self.live):
            self.live = [self.live[r] for r in rows]
            if self.live:
                self.engine.keep(rows)
                self.plan.keep(rows)
                self.stops.keep(torch.tensor(rows, device=self.y.device))
        if self.live:
            self.engine.train()  # a finished member may have shared the template module (stacked engine)

    def _take(self, row: int, m: LockstepMember) -> None:
        """Member m takes `row` from the next step on: its first step is its step 1, as alone."""
        m.first_step, m.started_s = self.step, time.perf_counter() - self.t0
        self.live[row] = m
        self.engine.replace(row, m.spec.model, m.spec.optimizer, rng_seed(m.spec))
        self.plan.replace(row, m)
        self.stops.replace(row, m.stopper, self.step)

    def _finish(self, m: LockstepMember, row: int) -> None:
        """Best state loaded, eval mode, result reported; its gradients let go (the group holds a finished model to
        its end: its weights only)."""
        model = m.spec.model
        model.eval()
        model.zero_grad(set_to_none=True)
        model.load_state_dict({**model.state_dict(), **self.engine.best_state(row)})  # its own constant buffers
        self._report(m, m.finish(time.perf_counter() - self.t0))  # its own steps and seconds

    def _report(self, m: LockstepMember, result: FitResult) -> None:
        if self.store is not None:
            self.finished[m.name] = (m.spec.model, result)
        if self.on_finish is not None:
            self.on_finish(m.index, m.spec.model, result)
        self.bar.update(1)
        self.bar.set_postfix(step=self.step)

    def _save(self) -> None:
        """The group's whole state at this step boundary: the live members', the rows' schedule, the plan, the engine,
        and each finished member's result and best state (its block may not be saved by the caller yet)."""
        assert self.store is not None
        schedule = {**self.schedule.state_dict(), "queue": [self.names[k] for k in self.schedule.queue]}
        state = {"kind": "group", "format": GROUP_FORMAT, "engine_kind": self.engine_kind, "shapes": self._shapes(),
                 "step": self.step, "refill": self.refill,
                 "elapsed": time.perf_counter() - self.t0, "schedule": schedule,
                 "live": [m.name for m in self.live], "members": {m.name: m.state_dict() for m in self.live},
                 "finished": {n: {"result": dataclasses.asdict(res), "best": snapshot(model)}
                              for n, (model, res) in self.finished.items()},
                 "plan": self.plan.state_dict(), "engine": self.engine.state_dict(),
                 "stops": self.stops.state_dict(), "pending": self.pending, "unpolled": self.unpolled,
                 "rng": _global_rng() if self.random else None}
        path = self.store.save(self.names, state)
        if self.restored_from is not None and self.restored_from != path:
            self.store.delete(self.restored_from)  # superseded
            self.restored_from = None

    def _matches(self, saved: Saved) -> bool:
        """Whether a saved group continues as this one: this group's members that are not finished there are its
        live and pending members, with the same training sets, on the same engine."""
        names, state = saved.names, saved.state
        if saved.kind != "group" or state.get("format") != GROUP_FORMAT or state["engine_kind"] != self.engine_kind:
            return False
        live, finished, queue = state["live"], state["finished"], state["schedule"]["queue"]
        sizes = {m.name: m.size for m in self.members}
        return (state["shapes"] == self._shapes() and set(self.names) <= set(names)
                and sorted(n for n in self.names if n not in finished) == sorted(live + queue)
                and all(state["members"][n]["size"] == sizes[n] for n in live))

    def _shapes(self) -> dict[str, list[int]]:
        """The members' parameter shapes (a checkpoint of other code with the same config does not fit)."""
        return {n: list(p.shape) for n, p in self.members[0].spec.model.state_dict().items()}

    def _restore(self) -> dict | None:
        """This group's checkpoint, if an earlier attempt saved one: finished members are reported again (best
        state loaded), the saved live members take the rows (`_load` then restores the step's state)."""
        assert self.store is not None
        found = next(((s.path, s.state) for s in self.store.saved() if fits_safely(self._matches, s)), None)
        if found is None:
            self.store.unfit(self.names)
            return None
        path, state = found
        done = [m for m in self.members if m.name in state["finished"]]
        for m in done:
            saved = state["finished"][m.name]
            m.spec.model.eval()
            m.spec.model.load_state_dict(saved["best"])
            m.result = FitResult(**{**saved["result"], "curve": [tuple(c) for c in saved["result"]["curve"]]})
            self._report(m, m.result)
        by_name = {m.name: m for m in self.members}
        self.live = [by_name[n] for n in state["live"]]
        self.schedule.load_state_dict({**state["schedule"],
                                       "queue": [self.names.index(n) for n in state["schedule"]["queue"]]})
        self.refill = bool(state["refill"])
        self.restored_from = path
        log.info("resuming %d model(s) at step %d from %s (%d finished there)", len(self.live), state["step"], path,
                 len(done))
        return state

    def _load(self, state: dict) -> None:
        """The saved step's members, plan, engine, global RNG, step and clock (after `_restore` and `_build`, whose
        plan drew an epoch from each live member's generator: the saved generators replace them)."""
        for m in self.live:
            m.load_state_dict(state["members"][m.name])
        if self.live:
            self.plan.load_state_dict(state["plan"])
            self.engine.load_state_dict(state["engine"])
            self.stops.load_state_dict(state["stops"])
        self.pending, self.unpolled = [(s, r, e, v.to(self.y.device)) for s, r, e, v in state["pending"]], \
            bool(state["unpolled"])
        if self.random:
            _set_global_rng(state["rng"])
        self.step = int(state["step"])
        self.t0 = time.perf_counter() - float(state["elapsed"])
