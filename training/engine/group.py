"""Many independent models trained in lockstep: the block models of an MDL sweep and/or several seeds.

Each member keeps its own init, training subset, batch order, augmentation stream, schedule-free state and
early stopping, exactly as `training.engine.fit.fit` would train it alone (it draws the same `draw_epoch` streams).
One step takes one batch per live member: the batches of all members are gathered, cropped/flipped and
decoded in one go; a member whose epoch ends is validated (eval mode), and one that early-stops leaves the
group. How the step's arithmetic is shared is the engine's business (training/engine/backends.py): `loop` (bitwise
equal to sequential training; default on CPU) or `stacked` (vmap over stacked parameters; default on GPU).
Equality with sequential training is tested in tests/test_vectorized.py.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from contextlib import nullcontext
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from training.common.progress import progress_bar
from training.engine.backends import LoopEngine, StackedEngine, ValSet
from training.engine.batches import DeviceData, augment_pad, draw_epoch
from training.engine.fit import FitConfig, FitResult, Regularizer
from training.engine.flat_optim import fused_backend

ENGINES = ("auto", "loop", "stacked")


@dataclass
class Member:
    """One model to train: a fresh module (its init drawn), its own optimizer (read, never stepped), its
    training subset (indices into the data) and its generator (batch order + augmentation)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    idx: Tensor
    gen: torch.Generator
    cfg: FitConfig
    val_idx: Tensor | None = None  # own validation set (indices into the data), e.g. another seed's split


OnFinish = Callable[[int, nn.Module, FitResult], None]  # (member index, model in eval mode with best state, result)


def why_not_vectorized(model: nn.Module, optimizer: torch.optim.Optimizer,
                       regularizer: Regularizer | None = None, engine: str = "loop") -> str | None:
    """None when `model` can be trained by `fit_group` with `engine`, else the reason (the caller falls back
    to `fit`)."""
    if regularizer is not None and engine == "stacked":
        return "a regularizer is set (the stacked engine's padded batches would change its batch mean)"
    if any(True for _ in model.buffers()):
        return "the model has buffers (e.g. batch norm)"
    if any(isinstance(m, (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._NormBase)) for m in model.modules()):
        return "the model has dropout or batch norm"
    if not all(k in optimizer.param_groups[0] for k in ("k", "weight_sum", "betas", "train_mode")):
        return f"{type(optimizer).__name__} is not a schedule-free AdamW"
    return None


def resolve_engine(engine: str, device: torch.device) -> str:
    if engine not in ENGINES:
        raise ValueError(f"training.engine must be one of {ENGINES}, got {engine!r}")
    if engine == "auto":
        return "stacked" if device.type == "cuda" else "loop"
    return engine


def fit_group(
    members: Sequence[Member],
    data: DeviceData,
    y: Tensor,
    x_val: Tensor | None = None,
    y_val: Tensor | None = None,
    on_finish: OnFinish | None = None,
    progress: bool = False,
    compile: bool | str | None = None,
    engine: str = "auto",
    regularizer: Regularizer | None = None,
    workers: int | str = 1,
    fused_optimizer: bool | str = False,
) -> list[FitResult]:
    """Train all members at once; each ends as `training.engine.fit.fit` would (best state loaded, eval mode).

    Validation on the shared (x_val, y_val), or, when those are None, on each member's `val_idx`.
    `on_finish(k, model, result)` is called as member k ends (members end in any order). `compile`: see
    `training.engine.backends.compile_mode` ("reduce-overhead" = CUDA graphs on GPU). `regularizer` (as in `fit`):
    loop engine only. `workers` (CPU, loop engine): split the members over this many threads, each a
    lockstep group on its own core (see `resolve_workers`); the numbers do not change. `fused_optimizer`
    (loop engine): the optimizer step as one kernel over flat buffers (training/engine/flat_optim.py).
    """
    if not members:
        return []
    kind = check_options(engine, workers, fused_optimizer, data.device)
    n_workers = resolve_workers(workers, data.device, kind, len(members))
    if n_workers > 1:
        return _fit_threads(members, n_workers, data, y, x_val, y_val, on_finish, progress, compile, kind,
                            regularizer, fused_optimizer)
    return _fit_lockstep(members, data, y, x_val, y_val, on_finish, progress, compile, kind, regularizer,
                         fused_optimizer)


def check_options(engine: str, workers: int | str, fused_optimizer: bool | str, device: torch.device) -> str:
    """One clear error for a bad `training.engine` / `workers` / `fused_optimizer` (run_job checks them before
    any data is loaded); returns the resolved engine."""
    kind = resolve_engine(engine, device)
    backend = fused_backend(fused_optimizer, device)
    if kind == "stacked" and backend is not None:
        raise ValueError("training.fused_optimizer applies to the loop engine (the stacked engine already steps "
                         "all members with a few batched kernels); set training.engine=loop or drop it")
    resolve_workers(workers, device, kind, 1)
    return kind


def resolve_workers(workers: int | str, device: torch.device, engine: str, n_members: int) -> int:
    """`training.workers`: auto → on CPU with the loop engine, one thread per intra-op thread torch would use
    (`torch.get_num_threads()`, i.e. OMP_NUM_THREADS or the cores), at most one per member; else 1.

    Why: a small MLP/LeNet step is a chain of small kernels; two cores split one matmul poorly and an
    elementwise optimizer op on a 20k-element tensor not at all, while two disjoint groups of models, one
    per core, scale almost linearly. Each worker runs with one intra-op thread.
    """
    if str(workers) == "auto":
        if device.type != "cpu" or engine != "loop":
            return 1
        return max(1, min(torch.get_num_threads(), n_members))
    n = int(workers)
    if n < 1:
        raise ValueError(f"training.workers must be auto or a positive integer, got {workers!r}")
    if n > 1 and (device.type != "cpu" or engine != "loop"):
        raise ValueError(f"training.workers={n} needs the CPU and the loop engine (got {device.type}, {engine})")
    return min(n, n_members)


def balanced_parts(costs: Sequence[float], n: int) -> list[list[int]]:
    """Indices split into at most n parts of about equal summed cost: largest first to the lightest part,
    then single moves and pairwise swaps between parts while they lower the heavier part's load."""
    def load(p: list[int]) -> float:
        return sum(costs[i] for i in p)

    parts: list[list[int]] = [[] for _ in range(n)]
    for k in sorted(range(len(costs)), key=lambda k: (-costs[k], k)):
        min(parts, key=load).append(k)

    improved = True
    while improved:
        improved = False
        for a in parts:
            for b in parts:
                gap = load(a) - load(b)
                if gap <= 0:
                    continue
                # move i from a to b, or swap i (in a) with j (in b): the best that shrinks the gap
                options = [(abs(gap - 2 * costs[i]), i, None) for i in a]
                options += [(abs(gap - 2 * (costs[i] - costs[j])), i, j) for i in a for j in b]
                best, i, j = min(options, key=lambda o: o[0])
                if best < gap - 1e-9:
                    a.remove(i)
                    b.append(i)
                    if j is not None:
                        b.remove(j)
                        a.append(j)
                    improved = True
    return [sorted(p) for p in parts if p]


class Cancelled(Exception):
    """A sibling worker failed (or the run was interrupted): this worker stopped early."""


def _fit_threads(members: Sequence[Member], n_workers: int, data: DeviceData, y: Tensor, x_val: Tensor | None,
                 y_val: Tensor | None, on_finish: OnFinish | None, progress: bool, compile: bool | str | None,
                 engine: str, regularizer: Regularizer | None, fused_optimizer: bool | str) -> list[FitResult]:
    """Members split over `n_workers` threads, each one lockstep group with one intra-op thread.

    Torch kernels release the GIL, so the groups run on separate cores. `on_finish` calls are serialised
    (one lock); if a worker fails the others stop at their next step and the first error is raised.
    """
    # Cost of a member: training samples + validation samples (a forward only: about half) per epoch, times the
    # epochs it may take (max_epochs, or more when warm-up / min_steps keep a small model going).
    n_val = [len(x_val) if x_val is not None else len(m.val_idx) if m.val_idx is not None else 0 for m in members]

    def cost(m: Member, nv: int) -> float:
        spe = math.ceil(len(m.idx) / m.cfg.batch_size)
        return (len(m.idx) + nv / 2) * m.cfg.max_steps_estimate(spe) / spe

    parts = balanced_parts([cost(m, nv) for m, nv in zip(members, n_val, strict=True)], n_workers)
    results: list[FitResult | None] = [None] * len(members)
    lock, stop = threading.Lock(), threading.Event()
    bar = progress_bar(total=len(members), desc=f"{len(members)} models, {len(parts)} workers", unit="model",
                       disable=not progress)

    def work(part: list[int]) -> None:
        torch.set_num_threads(1)

        def done(j: int, model: nn.Module, res: FitResult) -> None:
            with lock:
                results[part[j]] = res
                if on_finish is not None:
                    on_finish(part[j], model, res)
                bar.update(1)

        _fit_lockstep([members[k] for k in part], data, y, x_val, y_val, done, False, compile, engine, regularizer,
                      fused_optimizer, stop)

    threads = torch.get_num_threads()
    try:
        with ThreadPoolExecutor(len(parts), thread_name_prefix="fit-worker") as pool:
            futures = [pool.submit(work, p) for p in parts]
            try:
                wait(futures, return_when=FIRST_EXCEPTION)
            finally:  # an error, or e.g. KeyboardInterrupt while waiting: the other workers stop too
                stop.set()
            errors = [f.exception() for f in futures]
            first = next((e for e in errors if e is not None and not isinstance(e, Cancelled)), None)
            if first is not None:
                raise first
    finally:
        stop.set()
        torch.set_num_threads(threads)
        bar.close()
    return [r for r in results if r is not None]


class _Plan:
    """Each live member's (row's) epoch: its global sample indices, sample weights (0 = padding) and
    augmentation, padded to the longest epoch; `cursor` is the batch number within the epoch per row."""

    def __init__(self, members: Sequence[Member], data: DeviceData) -> None:
        dev = data.device
        self.members, self.data, self.dev = members, data, dev
        self.bs, self.augment = members[0].cfg.batch_size, members[0].cfg.augment
        if any(m.cfg.batch_size != self.bs or m.cfg.augment != self.augment for m in members):
            raise ValueError("members of one group share the batch size and the augmentation flag")
        self.pad = augment_pad(data, self.augment)
        self.sizes = [len(m.idx) for m in members]
        if min(self.sizes) == 0:
            raise ValueError("cannot fit on an empty training set")
        self.steps_per_epoch = [math.ceil(n / self.bs) for n in self.sizes]
        slots = max(self.steps_per_epoch) * self.bs
        self.idxs = [m.idx.to(dev) for m in members]
        self.idx = torch.stack([torch.cat([i, i[:1].expand(slots - len(i))]) for i in self.idxs])
        self.w = torch.stack([(torch.arange(slots, device=dev) < n).float() for n in self.sizes])
        self.off = torch.zeros(len(members), slots, 2, dtype=torch.long, device=dev)
        self.flip = torch.zeros(len(members), slots, dtype=torch.bool, device=dev)
        self.cursor = torch.zeros(len(members), dtype=torch.long, device=dev)
        self.host_cursor = [0] * len(members)
        self.slot = torch.arange(self.bs, device=dev)
        for k in range(len(members)):
            self.new_epoch(k, k)

    def new_epoch(self, k: int, row: int) -> None:
        """Member k (in `row`) starts an epoch: its batch order and augmentation drawn as `fit` draws them."""
        size = self.sizes[k]
        ep = draw_epoch(size, self.members[k].gen, self.augment, self.pad)
        self.idx[row, :size] = self.idxs[k][ep.perm.to(self.dev)]
        if ep.offsets is not None and ep.flips is not None:
            self.off[row, :size] = ep.offsets.to(self.dev)
            self.flip[row, :size] = ep.flips.to(self.dev)
        self.host_cursor[row] = 0

    def batch(self, live: list[int]) -> tuple[Tensor, Tensor, Tensor, list[int]]:
        """The step's batch of every row: (global indices, inputs, sample weights, real samples per row)."""
        pos = self.cursor[:, None] * self.bs + self.slot  # (rows, bs)
        gidx = self.idx.gather(1, pos)
        if self.augment:
            off = self.off.gather(1, pos[..., None].expand(-1, -1, 2))
            xb = self.data.batch(gidx, off, self.flip.gather(1, pos), self.pad)
        else:
            xb = self.data.batch(gidx)
        counts = [min(self.bs, self.sizes[k] - self.host_cursor[r] * self.bs) for r, k in enumerate(live)]
        return gidx, xb, self.w.gather(1, pos), counts

    def advance(self) -> None:
        self.cursor += 1
        self.host_cursor = [c + 1 for c in self.host_cursor]

    def epoch_ends(self, live: list[int]) -> list[int]:
        return [r for r, k in enumerate(live) if self.host_cursor[r] == self.steps_per_epoch[k]]

    def restart(self, rows: list[int]) -> None:
        """Rows whose new epoch was drawn (`new_epoch`) read from its first batch again."""
        if rows:
            self.cursor[torch.tensor(rows, device=self.dev)] = 0

    def keep(self, rows: list[int]) -> None:
        keep = torch.tensor(rows, device=self.dev)
        self.idx, self.w, self.off, self.flip, self.cursor = (t[keep] for t in (self.idx, self.w, self.off,
                                                                               self.flip, self.cursor))
        self.host_cursor = [self.host_cursor[r] for r in rows]


def _fit_lockstep(
    members: Sequence[Member],
    data: DeviceData,
    y: Tensor,
    x_val: Tensor | None,
    y_val: Tensor | None,
    on_finish: OnFinish | None,
    progress: bool,
    compile: bool | str | None,
    kind: str,
    regularizer: Regularizer | None,
    fused_optimizer: bool | str = False,
    stop: threading.Event | None = None,
) -> list[FitResult]:
    """One lockstep group on the current thread: every live member takes one batch per step; a member whose
    epoch ends is validated and asked whether to stop (`EarlyStopping`), and a stopped one leaves the group."""
    dev = data.device
    y = y.to(dev)
    val = ValSet(data, y, None if x_val is None else x_val.to(dev), None if y_val is None else y_val.to(dev),
                 [m.val_idx for m in members])
    plan = _Plan(members, data)
    if regularizer is not None and kind == "stacked":
        raise ValueError("the stacked engine does not support a regularizer; use engine='loop'")
    models, opts = [m.model for m in members], [m.optimizer for m in members]
    eng = (StackedEngine(models, opts, compile) if kind == "stacked"
           else LoopEngine(models, opts, compile, regularizer, fused_optimizer))
    live = list(range(len(members)))  # member index of each row
    epoch = [1] * len(members)
    stoppers = [m.cfg.stopper(spe) for m, spe in zip(members, plan.steps_per_epoch, strict=True)]
    curves: list[list[tuple[int, float]]] = [[] for _ in members]
    reasons = [""] * len(members)
    results: list[FitResult | None] = [None] * len(members)
    step = 0
    bar = progress_bar(total=len(members), desc=f"{len(members)} models", unit="model", disable=not progress)
    t0 = time.perf_counter()

    def validate(rows: list[int]) -> None:
        if not rows:
            return
        ks = [live[r] for r in rows]
        losses = eng.validate(rows, ks, val, [stoppers[k].best_loss for k in ks])
        for k, loss in zip(ks, losses, strict=True):
            curves[k].append((step, loss))
            stoppers[k].record(loss, epoch[k])

    def end_epochs(ends: list[int]) -> list[int]:
        """Validate the rows whose epoch just ended (per-epoch validation); the rows that stop."""
        validate([r for r in ends if not members[live[r]].cfg.eval_every_steps])
        done = []
        for r in ends:
            k = live[r]
            if (reason := stoppers[k].end_epoch(epoch[k], step)) is not None:
                reasons[k] = reason
                done.append(r)
            else:
                epoch[k] += 1
                plan.new_epoch(k, r)
        plan.restart([r for r in ends if r not in done])
        return done

    def finish(r: int) -> None:
        k = live[r]
        model = members[k].model
        model.eval()
        model.load_state_dict(eng.best_state(r))
        results[k] = FitResult(stoppers[k].best_loss, stoppers[k].best_epoch, epoch[k], step, curves[k],
                               time.perf_counter() - t0, reasons[k])
        if on_finish is not None:
            on_finish(k, model, results[k])
        bar.update(1)
        bar.set_postfix(step=step)

    with eng if isinstance(eng, StackedEngine) else nullcontext():
        eng.train()
        while live:
            if stop is not None and stop.is_set():
                raise Cancelled
            gidx, xb, wb, counts = plan.batch(live)
            eng.step(xb, y[gidx], wb, counts, step)
            step += 1
            plan.advance()
            validate([r for r, k in enumerate(live)
                      if members[k].cfg.eval_every_steps and step % members[k].cfg.eval_every_steps == 0])
            ends = plan.epoch_ends(live)
            done = end_epochs(ends) if ends else []
            for r in done:
                finish(r)
            if done:
                rows = [r for r in range(len(live)) if r not in done]
                live = [live[r] for r in rows]
                if not live:
                    break
                eng.keep(rows)
                plan.keep(rows)
                eng.train()  # a finished member may have shared the template module (stacked engine)
    bar.close()
    for m in members:
        m.model.eval()
    return [r for r in results if r is not None]
