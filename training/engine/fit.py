"""The fit loop: schedule-free training with early stopping on a validation set, evaluated in eval mode.

Schedule-free optimizers keep two parameter sequences; the averaged one (used for evaluation) is only in the model
after `optimizer.eval()`: every validation, coding and snapshot here happens in eval mode. torch's AdamW
(`optim.name=adamw`) has no modes: it is evaluated as trained, its `lr_schedule` stepped once per epoch. The paper
code's stopping (`stopping="backtrack"`, EleutherAI/mdl `Probe.fit`): the untrained model is validated too, and after
every epoch without a new best the best epoch's model and optimizer state are reloaded (the same stop rule).
`batch_order="fixed"`: every epoch takes the training rows in the order given.
"""

from __future__ import annotations

import copy
import dataclasses
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from training.common import interrupt
from training.common.progress import progress_bar
from training.engine.batches import ClassSegments, DeviceData, Epoch, augment_pad, class_segments, draw_epoch, host_copy
from training.engine.checkpoint import CheckpointStore, Saved, fits_safely
from training.engine.numerics import JobNumerics, in_format
from training.engine.stopping import EarlyStopping
from training.errors import NonFiniteError

log = logging.getLogger(__name__)
Regularizer = Callable[[Tensor, Tensor, int], Tensor]  # (logits, y, step) -> penalty added to CE


class BatchTransform(Protocol):
    """(batch, labels, class segments) -> the batch the model trains on, after augmentation (`eraser.after_augment`:
    training/inputs/erase.py BatchEraser). `needs_labels`: the loops pass the batch's `ClassSegments`, worked out on
    the host (no read back). Validation data is never transformed."""

    needs_labels: bool

    def __call__(self, x: Tensor, y: Tensor, segments: ClassSegments | None = None) -> Tensor: ...


NONFINITE_HINT = "lr too high or bad data; nothing was written as a result"
NEEDS_SHARED_VAL = ("members with a batch transform need a shared x_val/y_val or val_data (their validation images "
                    "are not drawn from the training data, which the transform maps)")


def nonfinite_loss(what: str, name: str, step: int, epoch: int) -> NonFiniteError:
    """The one line for a NaN/inf `what` ("training loss", "validation loss") of model `name`. The training loss is
    summed on the device (no sync) and checked where the loop syncs anyway: it went non-finite by `step`."""
    when = f"by step {step}" if what.startswith("training") else f"at step {step}"
    return NonFiniteError(f"non-finite {what} in {name} {when} (epoch {epoch}): {NONFINITE_HINT}")


@dataclass(frozen=True)
class FitConfig:
    """The fit loop's settings, all given: the job builds them from its typed config (training/tasks/mdl/job.py
    `fit_config`), where every default lives once (training/app/schema.py; tests/test_defaults_once.py checks)."""

    batch_size: int
    patience: int
    max_epochs: int
    augment: bool
    eval_every_steps: int | None  # None: once per epoch
    progress: bool
    # step-aware early stopping (training/engine/stopping.py); all 0: the plain rule
    warmup_steps: int  # the optimiser's warm-up: no stop before it has ended
    min_steps: int  # no stop before this many optimizer steps (even past max_epochs)
    patience_min_steps: int  # patience in steps = max(patience × steps per epoch, patience_min_steps)
    lr_schedule: str  # constant | cosine: the learning rate annealed to 0 over max_epochs, stepped per epoch
    stopping: str  # patience | backtrack: also reload the best model and optimizer state after an epoch without one
    batch_order: str  # shuffled (drawn each epoch) | fixed (the training rows in the order given, every epoch)
    batch_transform: BatchTransform | None = None  # applied to each (augmented) training batch, on its device
    # the job's numerics (training.precision; what its signature records), None outside a job: fp32
    numerics: JobNumerics | None = field(default=None, compare=False)

    def stopper(self, steps_per_epoch: int) -> EarlyStopping:
        """A fresh early-stopping rule for a model taking `steps_per_epoch` optimizer steps per epoch."""
        return EarlyStopping(self.patience, self.max_epochs, steps_per_epoch, self.warmup_steps, self.min_steps,
                             self.patience_min_steps)

    def one_at_a_time(self) -> str | None:
        """Why models with these settings train one at a time through `fit` (None: a lockstep group may take
        them): a group steps schedule-free AdamW with a shuffled order and never reloads a state."""
        if self.stopping != "patience":
            return f"mdl.stopping={self.stopping} reloads a model's best state (the fit loop does, one model at a time)"
        if self.batch_order != "shuffled" or self.lr_schedule != "constant":
            return "mdl.batch_order / optim.schedule are the fit loop's (one model at a time)"
        return None

    def max_steps_estimate(self, steps_per_epoch: int) -> int:
        """The most steps a model can take unless `min_steps`/warm-up keep it going (a cost estimate)."""
        return max(self.max_epochs * steps_per_epoch, self.warmup_steps, self.min_steps)


@dataclass
class FitResult:
    best_val_loss: float  # nats
    best_epoch: int
    epochs: int
    steps: int
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, val loss in nats)
    seconds: float = 0.0  # wall time until this model finished (in a vectorised group: since the group began)
    stop_reason: str = ""  # why training stopped: "patience" or "max_epochs" (training/engine/stopping.py)


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
    name: str = ""  # how errors name it ("block model 3"); empty: "model <its index in the group>"
    rng_seed: int | None = None  # its dropout / drop path masks' global RNG seed, alone and in a group (None: `gen`'s)


@dataclass(frozen=True)
class TrainData:
    """What a model (or a group, `training.engine.group.fit_group`) trains and validates on: the data (a tensor is
    kept as float32 on its device), its labels and an optional shared validation set (None: each member's `val_idx`
    into `val_data`, by default the data; with a batch transform, `val_data` holds the images already mapped)."""

    data: DeviceData
    y: Tensor
    x_val: Tensor | None = None
    y_val: Tensor | None = None
    val_data: DeviceData | None = None

    def __post_init__(self) -> None:
        if isinstance(self.data, Tensor):
            object.__setattr__(self, "data", DeviceData(self.data, self.data.device, storage="float32"))

    def validation(self, member: Member) -> tuple[Tensor, Tensor]:
        """The validation set of `member`: the shared one, else its own `val_idx`."""
        if self.x_val is not None and self.y_val is not None:
            return self.x_val, self.y_val
        if member.cfg.batch_transform is not None and self.val_data is None:
            raise ValueError(NEEDS_SHARED_VAL)
        if member.val_idx is None:
            raise ValueError("no validation set: give TrainData x_val/y_val or the member a val_idx")
        idx = member.val_idx.to(self.data.device)
        return (self.data if self.val_data is None else self.val_data).all(idx), self.y.to(self.data.device)[idx]


def optimizer_mode(optimizer: torch.optim.Optimizer, mode: str) -> None:
    """A schedule-free optimizer to `mode` ("train" | "eval"); an optimizer without modes (AdamW) stays as it is."""
    if hasattr(optimizer, mode):
        getattr(optimizer, mode)()


@contextmanager
def eval_mode(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> Iterator[None]:
    """Model and schedule-free optimizer both in eval mode inside; both back in train mode after."""
    model.eval()
    if optimizer is not None:
        optimizer_mode(optimizer, "eval")
    try:
        yield
    finally:
        model.train()
        if optimizer is not None:
            optimizer_mode(optimizer, "train")


def lr_scheduler(optimizer: torch.optim.Optimizer, cfg: FitConfig) -> torch.optim.lr_scheduler.LRScheduler | None:
    """`cfg.lr_schedule`: None (constant) or torch's cosine annealing over `cfg.max_epochs` epochs."""
    if cfg.lr_schedule == "constant":
        return None
    if cfg.lr_schedule == "cosine":
        return torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, cfg.max_epochs)
    raise ValueError(f"lr_schedule must be constant or cosine, got {cfg.lr_schedule!r}")


@torch.no_grad()
def predict_logits(model: nn.Module, x: Tensor, batch_size: int = 1024) -> Tensor:
    """Float64 logits in eval mode. The caller must have put the model (and optimizer) in eval mode."""
    if model.training:
        raise RuntimeError("evaluation must happen in eval mode (model.eval() and optimizer.eval())")
    return torch.cat([model(x[i: i + batch_size]).double() for i in range(0, len(x), batch_size)])


def cross_entropy_sum(model: nn.Module, x: Tensor, y: Tensor, batch_size: int = 1024,
                      temperature: float = 1.0) -> float:
    """Summed cross-entropy in nats of logits / temperature."""
    return float(cross_entropy_total(model, x, y, batch_size, temperature))


def cross_entropy_total(model: nn.Module, x: Tensor, y: Tensor, batch_size: int = 1024,
                        temperature: float = 1.0) -> Tensor:
    """`cross_entropy_sum` on the device (no read back), in float64: the same value."""
    return F.cross_entropy(predict_logits(model, x, batch_size) / temperature, y, reduction="sum").double()


def fit_temperature(model: nn.Module, x_val: Tensor, y_val: Tensor) -> float:
    """One temperature T > 0 minimising the validation cross-entropy of logits / T (Guo et al. 2017): codes of models
    whose confidence differs by construction (e.g. Spectral Decoupling) compare."""
    logits = predict_logits(model, x_val)
    log_t = torch.zeros((), dtype=torch.float64, requires_grad=True)
    opt = torch.optim.LBFGS([log_t], lr=0.5, max_iter=100, line_search_fn="strong_wolfe")

    def closure() -> Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(logits / log_t.exp(), y_val)
        loss.backward()
        return loss

    opt.step(closure)
    return float(log_t.detach().exp())


def to_device(t: Tensor, device: torch.device) -> Tensor:
    """A host tensor drawn for an epoch on `device` without blocking the host (pinned first on CUDA)."""
    if device.type == "cuda":
        t = t.pin_memory()
    return t.to(device, non_blocking=True)


def snapshot(model: nn.Module) -> dict[str, Tensor]:
    """A copy of the state dict (never deepcopy a μP module: it drops infshape)."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@torch.no_grad()
def keep_best(best: dict[str, Tensor], model: nn.Module, better: Tensor | None = None) -> None:
    """`model`'s state copied into `best` (a `snapshot`), in place: no second snapshot while the first is held.
    `better` (a boolean on the device, no read back): copied only where true."""
    for k, v in model.state_dict().items():
        best[k].copy_(v if better is None else torch.where(better, v, best[k]))


def fit(member: Member, data: TrainData, regularizer: Regularizer | None = None, desc: str = "fit",
        checkpoint: CheckpointStore | None = None, compile: str | None = None) -> FitResult:
    """Train `member` on `member.idx` into `data` until `patience` evaluations without improvement (validation on
    `data`'s shared set, else `member.val_idx`); return with the best state loaded, model and optimizer in eval mode.
    Each epoch draws its batch order and augmentation from `member.gen` in one go (`draw_epoch`, as a group does);
    `cfg.batch_transform` maps each augmented batch. A NaN/inf loss raises NonFiniteError naming the model
    (`member.name`, else `desc`). `checkpoint`: a stop request (training/common/interrupt.py) saves the whole state
    there before the next batch and raises `Interrupted`; a later call with the same model name goes on from it.
    `compile`: a torch.compile mode for the training forward (`training.engine.backends.compile_mode`; None: eager).
    """
    model, optimizer, gen, cfg = member.model, member.optimizer, member.gen, member.cfg
    train, (x_val, y_val) = data.data, data.validation(member)
    dev = train.device
    idx, y = member.idx.to(dev), data.y.to(dev)
    transform = cfg.batch_transform
    # a label-dependent transform gets each batch's class segments from the host's copy of the labels
    host = (host_copy(member.idx), host_copy(data.y)) if transform is not None and transform.needs_labels else None
    n = len(idx)
    if n == 0:
        raise ValueError("cannot fit on an empty training set")
    pad = augment_pad(train, cfg.augment)
    t0 = time.perf_counter()
    name = member.name or desc
    model.train()
    optimizer_mode(optimizer, "train")  # schedule-free optimizers (untyped) start in eval mode
    numerics = cfg.numerics  # training.channels_last, training.precision (training/engine/numerics.py; None: fp32)
    fmt = None if numerics is None else numerics.memory_format(model, dev)
    if fmt is not None:
        model.to(memory_format=fmt)  # in place: the optimizer's parameters are these
    net = model if compile is None else torch.compile(model, mode=compile)  # shares the model's parameters
    backtrack = cfg.stopping == "backtrack"
    st = FitState(cfg.stopper(math.ceil(n / cfg.batch_size)), snapshot(model), torch.zeros((), device=dev),
                  sched=lr_scheduler(optimizer, cfg))
    restored_from = None
    found = None if checkpoint is None else st.find(checkpoint, member, name)
    if checkpoint is not None and found is None:
        checkpoint.unfit([name])
    elif found is not None:
        restored_from, saved = found
        st.restore(saved, member)
        t0 -= float(saved["elapsed"])
        log.info("resuming %s at step %d (epoch %d) from %s", name, st.step, st.epoch, restored_from)
    stopper, curve = st.stopper, st.curve

    def check_training_loss() -> None:
        if not math.isfinite(float(st.loss_sum)):
            raise nonfinite_loss("training loss", name, st.step, st.epoch)
        st.loss_sum.zero_()

    def validate() -> None:
        with eval_mode(model, optimizer):
            loss = cross_entropy_sum(model, x_val, y_val) / len(y_val)
            check_training_loss()  # here, where the loop syncs anyway (float above)
            if not math.isfinite(loss):
                raise nonfinite_loss("validation loss", name, st.step, st.epoch)
            curve.append((st.step, loss))
            if stopper.record(loss, st.epoch):
                keep_best(st.best_state, model)
                if backtrack:  # in eval mode, as the model's state (schedule-free: its averaged iterate)
                    st.best_opt = copy.deepcopy(optimizer.state_dict())

    bar = progress_bar(total=cfg.max_epochs, desc=desc, unit="ep", leave=False, disable=not cfg.progress)
    reason: str | None = None
    with interrupt.checkpointing() if checkpoint is not None else nullcontext():
        if backtrack and st.step == 0 and not curve:  # the untrained model is a candidate too (step 0, epoch 0)
            validate()
            stopper.improved = False
        while reason is None:  # at most max_epochs epochs, unless warm-up / min_steps keep a small model going
            if st.epoch_draw is None:  # a resumed attempt goes on in its saved epoch
                st.epoch += 1
                st.epoch_draw, st.batch = draw_epoch(n, gen, cfg.augment, pad), 0
                if cfg.batch_order == "fixed":
                    st.epoch_draw = dataclasses.replace(st.epoch_draw, perm=torch.arange(n))
            ep = st.epoch_draw
            order = idx[to_device(ep.perm, dev)]
            offsets = None if ep.offsets is None else to_device(ep.offsets, dev)
            flips = None if ep.flips is None else to_device(ep.flips, dev)
            labels = None if host is None else host[1][host[0][ep.perm.numpy()]]  # the epoch's labels in order
            for i in range(st.batch * cfg.batch_size, n, cfg.batch_size):
                if checkpoint is not None and interrupt.requested():
                    path = checkpoint.save([name], st.state_dict(member, time.perf_counter() - t0))
                    if restored_from is not None and restored_from != path:
                        checkpoint.delete(restored_from)
                    raise interrupt.Interrupted(interrupt.signum())
                sl = slice(i, i + cfg.batch_size)
                bi = order[sl]
                yb = y[bi]
                xb = train.batch(bi, None if offsets is None else offsets[sl], None if flips is None else flips[sl],
                                 pad)
                if transform is not None:
                    xb = transform(xb, yb, None if labels is None else class_segments(yb, labels[sl]))
                xb = in_format(xb, fmt)
                logits = net(xb) if numerics is None else numerics.forward(net, xb)
                loss = F.cross_entropy(logits, yb)
                if regularizer is not None:
                    loss = loss + regularizer(logits, yb, st.step)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                st.loss_sum.add_(loss.detach())
                st.step += 1
                st.batch += 1
                if cfg.eval_every_steps and st.step % cfg.eval_every_steps == 0:
                    validate()
            st.epoch_draw = None
            if st.sched is not None:
                st.sched.step()  # the next epoch's rate (a backtrack reloads the best epoch's with its state)
            if not cfg.eval_every_steps:
                validate()
            bar.update(1)
            if cfg.progress:
                bar.set_postfix(val=f"{curve[-1][1]:.4f}" if curve else "-", best=f"{stopper.best_loss:.4f}")
            improved = stopper.improved
            reason = stopper.end_epoch(st.epoch, st.step)
            if backtrack and reason is None and not improved:  # the best epoch's model and optimizer state again
                assert st.best_opt is not None  # the untrained model was validated first: there is always a best
                optimizer_mode(optimizer, "eval")  # schedule-free: loaded in eval mode, mapped back to its training y
                model.load_state_dict(st.best_state)
                optimizer.load_state_dict(st.best_opt)
                optimizer_mode(optimizer, "train")
    bar.close()
    check_training_loss()  # the steps after the last validation (eval_every_steps)
    # the optimizer first: eval() maps the train-mode weights to the averaged ones (the best state already is)
    optimizer_mode(optimizer, "eval")
    model.eval()
    model.load_state_dict(st.best_state)
    if checkpoint is not None:
        checkpoint.delete(checkpoint.path([name]), restored_from)
    return FitResult(stopper.best_loss, stopper.best_epoch, st.epoch, st.step, curve, time.perf_counter() - t0,
                     reason)


@dataclass
class FitState:
    """What `fit` keeps between batches, which a checkpoint saves (with the model, optimizer, generator and RNG)."""

    stopper: EarlyStopping
    best_state: dict[str, Tensor]
    loss_sum: Tensor  # training losses since the last check, summed without a sync
    curve: list[tuple[int, float]] = field(default_factory=list)
    step: int = 0
    epoch: int = 0
    batch: int = 0  # batches taken in the current epoch
    epoch_draw: Epoch | None = None  # the current epoch's batch order and augmentation (None between epochs)
    sched: torch.optim.lr_scheduler.LRScheduler | None = None  # the learning-rate schedule (None: constant)
    best_opt: dict[str, Any] | None = None  # stopping=backtrack: the optimizer state of the best epoch

    def state_dict(self, member: Member, elapsed: float) -> dict[str, Any]:
        ep = self.epoch_draw
        return {"kind": "fit", "size": len(member.idx), "elapsed": elapsed, "model": snapshot(member.model),
                "opt": member.optimizer.state_dict(), "gen": member.gen.get_state(), "rng": _global_rng(),
                "stopper": dataclasses.asdict(self.stopper), "best": self.best_state, "loss_sum": self.loss_sum,
                "curve": list(self.curve), "step": self.step, "epoch": self.epoch, "batch": self.batch,
                "sched": None if self.sched is None else self.sched.state_dict(), "best_opt": self.best_opt,
                "draw": None if ep is None else {"perm": ep.perm, "offsets": ep.offsets, "flips": ep.flips}}

    @staticmethod
    def find(store: CheckpointStore, member: Member, name: str) -> tuple[Path, dict[str, Any]] | None:
        """This model's checkpoint: its name, training set size and parameter shapes (other code, same config)."""
        shapes = {k: v.shape for k, v in member.model.state_dict().items()}

        def fits(saved: Saved) -> bool:
            s = saved.state
            return (saved.names == [name] and saved.kind == "fit" and s["size"] == len(member.idx)
                    and {k: v.shape for k, v in s["model"].items()} == shapes)

        return next(((s.path, s.state) for s in store.saved() if fits_safely(fits, s)), None)

    def restore(self, saved: dict[str, Any], member: Member) -> None:
        dev = self.loss_sum.device
        member.model.load_state_dict(saved["model"])
        member.optimizer.load_state_dict(saved["opt"])
        member.gen.set_state(saved["gen"])
        _set_global_rng(saved["rng"])
        self.stopper = EarlyStopping(**saved["stopper"])
        self.best_state = {k: v.to(dev) for k, v in saved["best"].items()}
        self.loss_sum = saved["loss_sum"].to(dev)
        self.curve = [(int(s), float(v)) for s, v in saved["curve"]]
        self.step, self.epoch, self.batch = int(saved["step"]), int(saved["epoch"]), int(saved["batch"])
        if self.sched is not None:
            self.sched.load_state_dict(saved["sched"])
        self.best_opt = saved.get("best_opt")
        draw = saved["draw"]
        self.epoch_draw = None if draw is None else Epoch(draw["perm"], draw["offsets"], draw["flips"])


def _global_rng() -> dict[str, Any]:
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else []
    return {"cpu": torch.get_rng_state(), "cuda": cuda}


def _set_global_rng(saved: dict[str, Any]) -> None:
    torch.set_rng_state(saved["cpu"])
    if saved["cuda"]:
        torch.cuda.set_rng_state_all(saved["cuda"])
