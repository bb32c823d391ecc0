"""The arithmetic of a vectorised group (training/engine/group.py): how M live models take one step together.

* `LoopEngine`: the members' own modules, one forward per member on its slice of the shared batch, one backward
  over the summed losses and **one** optimizer step over all members' parameters (foreach kernels). Every kernel
  sees exactly the shapes it sees in `training.engine.fit.fit`: bitwise sequential training. Best on CPU. Dropout /
  drop path: each member's forward draws from its own stream of the device's global RNG (`rng_seeds`), as alone.
  Every row's activations are held until the one backward (the memory estimate counts them all).
* `StackedEngine`: parameters stacked per name (M, *shape); the forward under `torch.func.vmap` + `functional_call`
  (Linear → batched matmul, Conv → grouped conv): one set of kernels per step for all members, partial batches
  padded with zero-weight rows, the same arithmetic up to float32 rounding. Best on GPU. Its step (gradients and
  the schedule-free update, training/engine/stacked_optim.py) has no read back and host work that does not grow
  with M; `training.compile` compiles it whole. Dropout / drop path draw per member (vmap randomness="different");
  constant buffers (SwinV2's relative positions) are the template's.

Both keep the members' μP param groups and schedule-free AdamW's formulas, whose per-group scalars (k, lr_max,
weight_sum) members that start together share: the loop engine keeps one optimizer per such cohort; the stacked
engine computes them on the host, or per row on the device where rows are refilled (`replace`) or the step is
compiled. Validation mirrors `optimizer.eval()` / `.train()` on the validated members only. A finished member is
dropped (its parameters leave the optimizer).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from mup import MuReadout
from torch import Tensor, nn
from torch.func import functional_call, grad, vmap

from training.engine.batches import DeviceData
from training.engine.fit import Regularizer, cross_entropy_total, keep_best, snapshot
from training.engine.flat_optim import LibraryOptim, make_member_optim
from training.engine.numerics import in_format
from training.engine.stacked_optim import StackedScheduleFree, StepScalars


class EngineOptions(Protocol):
    """What an engine reads of a group's options (training/engine/group.py GroupOptions)."""

    @property
    def regularizer(self) -> Regularizer | None: ...
    @property
    def compile(self) -> bool | str | None: ...
    @property
    def fused_optimizer(self) -> bool | str: ...


VAL_CHUNK = 1024  # as training.engine.fit.predict_logits
# (rows validated: a slice or index tensor, their float64 losses) -> which rows keep their state as the best so far
Judge = Callable[[Tensor | slice, Tensor], Tensor]


def EVAL_W(beta1: float) -> float:  # noqa: N802 - schedule-free eval(): p.lerp_(z, 1 - 1/β1) maps y → x
    return 1 - 1 / beta1


def TRAIN_W(beta1: float) -> float:  # noqa: N802 - schedule-free train(): p.lerp_(z, 1 - β1) maps x → y
    return 1 - beta1


def compile_mode(flag: bool | str | None) -> str | None:
    """`training.compile`: false/null → None (eager), true → "default", or a torch.compile mode such as
    "reduce-overhead" (CUDA graphs) or "max-autotune"."""
    if flag is None or flag is False or str(flag).lower() in ("false", "none", "null", ""):
        return None
    return "default" if flag is True or str(flag).lower() == "true" else str(flag)


class ValSet:
    """Each member's validation data: one shared (x, y), or per-member indices into the data (cached)."""

    def __init__(self, data: DeviceData, y: Tensor, x_val: Tensor | None, y_val: Tensor | None,
                 val_idx: Sequence[Tensor | None]) -> None:
        self.data, self.y = data, y
        self.shared = x_val is not None and y_val is not None
        self.x_val, self.y_val = x_val, y_val
        self.val_idx = list(val_idx)
        self._cache: dict[int, Tensor] = {}
        if not self.shared and any(v is None for v in self.val_idx):
            raise ValueError("without a shared x_val/y_val every member needs a val_idx")

    def xy(self, k: int) -> tuple[Tensor, Tensor]:
        if self.shared:
            return self.x_val, self.y_val  # type: ignore[return-value]
        idx = self.val_idx[k]
        assert idx is not None
        key = id(idx)  # members of one seed share one index tensor: decode it once
        if key not in self._cache:
            self._cache[key] = self.data.all(idx)
        return self._cache[key], self.y[idx.to(self.y.device)]


def _optimizer_groups(model: nn.Module, opt: torch.optim.Optimizer) -> list[tuple[list[str], dict]]:
    names = {id(p): n for n, p in model.named_parameters()}
    return [([names[id(p)] for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
            for g in opt.param_groups]


def check_same_groups(models: Sequence[nn.Module], opts: Sequence[torch.optim.Optimizer]
                      ) -> list[tuple[list[str], dict]]:
    """The members' (identical) μP param groups as (parameter names, hyperparameters)."""
    groups = _optimizer_groups(models[0], opts[0])
    for m, o in zip(models[1:], opts[1:], strict=True):
        check_joins(groups, m, o)
    return groups


def check_joins(groups: list[tuple[list[str], dict]], model: nn.Module, opt: torch.optim.Optimizer) -> None:
    """A member taking a row has the group's param groups (`groups`, as `check_same_groups` gave them)."""
    if [(n, repr(g)) for n, g in _optimizer_groups(model, opt)] != [(n, repr(g)) for n, g in groups]:
        raise ValueError("members of one vectorised group need identical optimizer param groups")


class LoopEngine:
    """Members' own modules; one shared optimizer step (see the module docstring)."""

    def __init__(self, models: Sequence[nn.Module], opts: Sequence[torch.optim.Optimizer], options: EngineOptions,
                 rng_seeds: Sequence[int] | None = None, memory_format: torch.memory_format | None = None) -> None:
        groups = check_same_groups(models, opts)
        self.models = list(models)  # per live row
        self.fmt = memory_format  # training.channels_last: the members' parameters and batches in this layout
        for m in self.models:
            self._in_format(m)
        self.regularizer = options.regularizer
        self.mode = mode = compile_mode(options.compile)
        # Compiled wrappers share the modules' parameters (one graph for all: same structure, params as inputs).
        self.forward = [torch.compile(m, mode=mode) if mode else m for m in self.models]
        self.opt = make_member_optim(str(options.fused_optimizer), type(opts[0]), groups,
                                     [dict(m.named_parameters()) for m in self.models])
        self.best: list[dict[str, Tensor]] = [snapshot(m) for m in self.models]
        self.loss_sum = torch.zeros(len(self.models), device=next(self.models[0].parameters()).device)
        # each row's state of the global RNG its forward draws dropout / drop path masks from (None: it draws none)
        self.rng = None if rng_seeds is None else [_rng_state(self.loss_sum.device, s) for s in rng_seeds]

    def _in_format(self, model: nn.Module) -> None:
        if self.fmt is not None:
            model.to(memory_format=self.fmt)  # in place: the optimizer's parameters are these

    def train(self) -> None:
        for m in self.models:
            m.train()
        self.opt.train()

    def _forward(self, r: int, x: Tensor) -> Tensor:
        """Row r's forward, drawing its masks from its own stream (swapped into the device's global RNG)."""
        if self.rng is None:
            return self.forward[r](x)
        rng = (torch.cuda.default_generators[x.device.index if x.device.index is not None else
                                             torch.cuda.current_device()]
               if x.device.type == "cuda" else torch.random.default_generator)  # the RNG dropout draws from
        rng.set_state(self.rng[r])
        out = self.forward[r](x)
        self.rng[r] = rng.get_state()
        return out

    def step(self, xb: Tensor, yb: Tensor, wb: Tensor, counts: list[int] | None, steps: np.ndarray,
             done: Tensor | None = None) -> None:
        """One step of every row; `steps`: each row's own steps so far (the regularizer's); `done`: rows that stopped
        (not yet polled): their training losses are not checked."""
        assert counts is not None
        # Each member sees exactly its batch as in fit(); d(sum)/d(loss_r) = 1 keeps every gradient as alone.
        loss: Tensor | int = 0
        parts = []
        for r, c in enumerate(counts):
            logits, yr = self._forward(r, in_format(xb[r, :c], self.fmt)), yb[r, :c]
            loss_r = F.cross_entropy(logits, yr)
            if self.regularizer is not None:
                loss_r = loss_r + self.regularizer(logits, yr, int(steps[r]))
            loss = loss + loss_r
            parts.append(loss_r.detach())
        self.opt.zero_grad()
        loss.backward()  # type: ignore[union-attr]
        self.opt.step()
        losses = torch.stack(parts)
        self.loss_sum += losses if done is None else losses.masked_fill(done, 0)  # checked at a poll: no sync here

    def validate(self, rows: list[int], members: list[int], val: ValSet, judge: Judge) -> Tensor:
        """Validation loss (float64, on the device) of each row (member) in eval mode; the rows `judge` finds
        better keep this state as their best (`torch.where`: no read back)."""
        losses = []
        for r, k in zip(rows, members, strict=True):
            model = self.models[r]
            self.opt.lerp_member(r, EVAL_W)
            model.eval()
            x, y = val.xy(k)
            loss = cross_entropy_total(model, x, y).view(1) / len(y)  # = cross_entropy_sum(...) / len(y), bitwise
            better = judge(slice(r, r + 1), loss).view(())
            keep_best(self.best[r], model, better)
            model.train()
            self.opt.lerp_member(r, TRAIN_W)
            losses.append(loss)
        return torch.cat(losses)

    def best_state(self, r: int) -> dict[str, Tensor]:
        return self.best[r]

    def state_dict(self) -> dict:
        """Every live row's parameters (train mode), optimizer state, best state and unchecked loss sum."""
        return {"params": [{n: p.detach().clone() for n, p in m.named_parameters()} for m in self.models],
                "opt": self.opt.state_dict(), "best": self.best, "loss_sum": self.loss_sum.clone(), "rng": self.rng}

    @torch.no_grad()
    def load_state_dict(self, saved: dict) -> None:
        dev = self.loss_sum.device
        for m, params in zip(self.models, saved["params"], strict=True):
            for n, p in m.named_parameters():
                p.copy_(params[n])
        self.opt.load_state_dict(saved["opt"])
        self.best = [{k: v.to(dev) for k, v in b.items()} for b in saved["best"]]
        self.loss_sum = saved["loss_sum"].to(dev)
        if saved.get("rng") is not None:
            self.rng = list(saved["rng"])

    def keep(self, rows: list[int]) -> None:
        self.models = [self.models[r] for r in rows]
        self.forward = [self.forward[r] for r in rows]
        self.best = [self.best[r] for r in rows]
        self.loss_sum = self.loss_sum[torch.tensor(rows, device=self.loss_sum.device)]
        self.opt.keep(rows)
        if self.rng is not None:
            self.rng = [self.rng[r] for r in rows]

    def replace(self, r: int, model: nn.Module, opt: torch.optim.Optimizer, rng_seed: int = 0) -> None:
        """Row r takes a new member (its model, fresh optimizer, its masks' seed): it trains as alone, from step 1."""
        if not isinstance(self.opt, LibraryOptim):
            raise ValueError("rows are refilled with the library's optimizer step (not training.fused_optimizer)")
        check_joins(self.opt.groups, model, opt)
        self._in_format(model)
        self.models[r] = model
        self.forward[r] = torch.compile(model, mode=self.mode) if self.mode else model
        self.best[r] = snapshot(model)
        self.loss_sum[r] = 0
        self.opt.replace(r, dict(model.named_parameters()))
        if self.rng is not None:
            self.rng[r] = _rng_state(self.loss_sum.device, rng_seed)


def _rng_state(device: torch.device, seed: int) -> Tensor:
    """The state of `device`'s global RNG right after `torch.manual_seed(seed)` (as `seeded_global_rng` leaves it)."""
    return torch.Generator(device=device).manual_seed(seed).get_state()


class StackedEngine:
    """Stacked parameters, vmapped forward (see the module docstring); the step is one function of tensors and
    host-known floats, which `training.compile` compiles whole (`fullgraph=True`)."""

    def __init__(self, models: Sequence[nn.Module], opts: Sequence[torch.optim.Optimizer],
                 compile: bool | str | None = None, per_row: bool = False) -> None:
        self.groups = check_same_groups(models, opts)
        self.template = models[0]
        for m in models[1:]:
            self._check_buffers(m)
        self.readouts = [m for m in self.template.modules() if isinstance(m, MuReadout)]
        self.params = {n: torch.stack([dict(m.named_parameters())[n].detach() for m in models])
                       for n, _ in self.template.named_parameters()}
        self.compiled = compile_mode(compile)
        # per-row scalars on the device: compiled (no changing Python float) or rows refilled (`replace`)
        self.opt = StackedScheduleFree(self.groups, self.params, per_row=per_row or self.compiled is not None)
        self.best = {n: p.clone() for n, p in self.params.items()}  # snapshot at init, like fit()
        dev = next(iter(self.params.values())).device
        self.loss_sum = torch.zeros(len(models), device=dev)
        template = self.template

        def member_loss(params: dict[str, Tensor], xb: Tensor, yb: Tensor, wb: Tensor) -> Tensor:
            ce = F.cross_entropy(functional_call(template, params, (xb,)), yb, reduction="none")
            return (ce * wb).sum() / wb.sum()

        def total_loss(params: dict[str, Tensor], xb: Tensor, yb: Tensor, wb: Tensor) -> tuple[Tensor, Tensor]:
            # randomness="different": a member's dropout / drop path draws its own masks
            losses = vmap(member_loss, randomness="different")(params, xb, yb, wb)
            return losses.sum(), losses.detach()

        def member_logits(params: dict[str, Tensor], xb: Tensor) -> Tensor:
            return functional_call(template, params, (xb,))

        self.grads = grad(total_loss, has_aux=True)
        self.predict_shared = vmap(member_logits, in_dims=(0, None))
        self.predict_own = vmap(member_logits)
        self._step: Callable[..., None] = self._train_step
        if self.compiled:
            self._step = torch.compile(self._train_step, mode=self.compiled, fullgraph=True)
            self._mark_static()

    def _check_buffers(self, model: nn.Module) -> None:
        buffers = dict(self.template.named_buffers())
        if any(not torch.equal(b, buffers[n]) for n, b in model.named_buffers()):
            raise ValueError("members of one stacked group need equal buffers (the template's serve them all)")

    def _train_step(self, xb: Tensor, yb: Tensor, wb: Tensor, scalars: list[StepScalars] | None,
                    done: Tensor | None) -> None:
        if scalars is None:  # per-row scalars on the device
            scalars = self.opt.row_scalars()
        grads, losses = self.grads(self.params, xb, yb, wb)
        # checked at a poll (the group's), not here: no sync per step; a done row's are not checked
        self.loss_sum += losses if done is None else losses.masked_fill(done, 0)
        self.opt.update(self.params, grads, scalars)

    def _mark_static(self) -> None:
        """Parameters and optimizer state live at fixed addresses between compactions: CUDA graphs copy none."""
        if self.compiled:
            rows = () if self.opt.rows is None else tuple(self.opt.rows.values())
            for t in (*self.params.values(), *self.opt.z.values(), *self.opt.v.values(), *rows, self.loss_sum):
                torch._dynamo.mark_static_address(t)

    def __enter__(self) -> StackedEngine:
        """functional_call swaps in batched weights that carry no `infshape`: pin each MuReadout's width_mult."""
        for h in self.readouts:
            h.width_mult = (lambda v: (lambda: v))(h.width_mult())  # instance attribute shadows the method
        return self

    def __exit__(self, *exc: object) -> None:
        for h in self.readouts:
            del h.width_mult

    def train(self) -> None:
        self.template.train()

    @torch.no_grad()
    def step(self, xb: Tensor, yb: Tensor, wb: Tensor, counts: list[int] | None, steps: np.ndarray,
             done: Tensor | None = None) -> None:
        self._step(xb, yb, wb, None if self.opt.rows is not None else self.opt.scalars(), done)

    def _lerped(self, sel: Tensor, rows: dict[str, Tensor], weight: Callable[[float], float]) -> dict[str, Tensor]:
        out = {}
        for names, g in self.opt.groups:
            w = weight(g["betas"][0])
            for n in names:
                out[n] = rows[n].lerp(self.opt.z[n][sel], w)
        return out

    @torch.no_grad()
    def validate(self, rows: list[int], members: list[int], val: ValSet, judge: Judge) -> Tensor:
        sel = torch.tensor(rows, device=next(iter(self.params.values())).device)
        eval_params = self._lerped(sel, {n: p[sel] for n, p in self.params.items()}, EVAL_W)
        self.template.eval()
        if val.shared:
            x, y = val.xy(members[0])
            logits = torch.cat([self.predict_shared(eval_params, x[i: i + VAL_CHUNK]).double()
                                for i in range(0, len(y), VAL_CHUNK)], dim=1)
            targets = y.expand(len(rows), -1)
        else:
            xs, ys = zip(*(val.xy(k) for k in members), strict=True)
            if len({len(t) for t in ys}) != 1:
                raise ValueError("per-member validation sets of one group must have one size")
            n = len(ys[0])
            logits = torch.cat([self.predict_own(eval_params, torch.stack([x[i: i + VAL_CHUNK] for x in xs])).double()
                                for i in range(0, n, VAL_CHUNK)], dim=1)
            targets = torch.stack(ys)
        self.template.train()
        losses = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none").sum(1) / targets.shape[1]
        better = judge(sel, losses)  # float64: the values the host's early stopping compares
        for name, v in eval_params.items():
            self.best[name][sel] = torch.where(better.view(-1, *[1] * (v.dim() - 1)), v, self.best[name][sel])
        back = self._lerped(sel, eval_params, TRAIN_W)
        for name, v in back.items():
            self.params[name][sel] = v
        return losses  # on the device: the group reads it at its next poll

    def best_state(self, r: int) -> dict[str, Tensor]:
        return {n: v[r].clone() for n, v in self.best.items()}

    def state_dict(self) -> dict:
        """The stacked parameters (train mode), optimizer state and scalars, best states and unchecked loss sums."""
        return {"params": {n: p.clone() for n, p in self.params.items()}, "opt": self.opt.state_dict(),
                "best": {n: v.clone() for n, v in self.best.items()}, "loss_sum": self.loss_sum.clone()}

    @torch.no_grad()
    def load_state_dict(self, saved: dict) -> None:
        dev = self.loss_sum.device
        for n, p in self.params.items():
            p.copy_(saved["params"][n])  # in place: a compiled step's static addresses stay valid
        self.opt.load_state_dict(saved["opt"], dev)
        self.best = {n: v.to(dev) for n, v in saved["best"].items()}
        self.loss_sum.copy_(saved["loss_sum"])

    def keep(self, rows: list[int]) -> None:
        keep = torch.tensor(rows, device=next(iter(self.params.values())).device)
        self.params = {n: p[keep] for n, p in self.params.items()}
        self.opt.keep(keep)
        self.best = {n: v[keep] for n, v in self.best.items()}
        self.loss_sum = self.loss_sum[keep]
        self._mark_static()

    @torch.no_grad()
    def replace(self, r: int, model: nn.Module, opt: torch.optim.Optimizer, rng_seed: int = 0) -> None:
        """Row r takes a new member, in place (a compiled step's static addresses stay valid): its parameters, z = y,
        second moment 0, best state = init, its row's scalars from the start (`rng_seed`: unused, vmap draws masks)."""
        if self.opt.rows is None:
            raise ValueError("rows are refilled with per-row optimizer scalars (StackedEngine(per_row=True))")
        check_joins(self.groups, model, opt)
        self._check_buffers(model)
        for n, p in model.named_parameters():
            for t in (self.params[n], self.opt.z[n], self.best[n]):
                t[r] = p.detach()
            self.opt.v[n][r] = 0
        self.loss_sum[r] = 0
        self.opt.reset_row(r)
