"""Many independent models in one vectorised step: the block models of an MDL sweep and/or several seeds.

Each member keeps its own init, training subset, batch order, augmentation stream, schedule-free state and
early stopping, exactly as `training.fit.fit` would train it alone; only the arithmetic is batched:

* parameters are stacked per name (M, *shape) and the model's own forward runs under `torch.func.vmap` +
  `functional_call` (a Linear becomes a batched matmul, a Conv a grouped conv);
* members train on different-size sets, so every step takes one batch per member, padded to the batch
  size with zero-weight rows (a member's last, partial batch of an epoch has the same gradient as alone);
* the optimizer is the members' own optimizer class over the stacked tensors, with the members' μP param
  groups (MuAdam's per-parameter lr = lr / width_mult is kept per group). Schedule-free AdamW is
  elementwise except its per-group scalars (step count k, lr_max, weight_sum): all members start together
  and every live member steps on every step, so those scalars are identical for all of them;
* validation mirrors `optimizer.eval()` / `.train()` on the members that end an epoch (only on their slices);
* a member that early-stops is removed from the stack (parameters and optimizer state compacted), so it
  stops computing and no Adam-type update ever touches it again; its best state goes back into its module.

Equality with sequential training is tested in tests/test_vectorized.py (float32, CPU).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from mup import MuReadout
from torch import Tensor, nn
from torch.func import functional_call, vmap
from tqdm.auto import tqdm

from training.batches import DeviceData, augment_pad, draw_epoch
from training.fit import FitConfig, FitResult, Regularizer

VAL_CHUNK = 1024  # as training.fit.predict_logits


@dataclass
class Member:
    """One model to train: a fresh module (its init drawn), its own optimizer (read, never stepped), its
    training subset (indices into the data) and its generator (batch order + augmentation)."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    idx: Tensor
    gen: torch.Generator
    cfg: FitConfig


OnFinish = Callable[[int, nn.Module, FitResult], None]  # (member index, model in eval mode with best state, result)


def why_not_vectorized(model: nn.Module, optimizer: torch.optim.Optimizer,
                       regularizer: Regularizer | None = None) -> str | None:
    """None when `model` can be trained by `fit_group`, else the reason (the caller falls back to `fit`)."""
    if regularizer is not None:
        return "a regularizer is set (padded batches would change its batch mean)"
    if any(True for _ in model.buffers()):
        return "the model has buffers (e.g. batch norm)"
    if any(isinstance(m, (nn.modules.dropout._DropoutNd, nn.modules.batchnorm._NormBase)) for m in model.modules()):
        return "the model has dropout or batch norm"
    if not all(k in optimizer.param_groups[0] for k in ("k", "weight_sum", "betas", "train_mode")):
        return f"{type(optimizer).__name__} is not a schedule-free AdamW"
    return None


def _group_signature(opt: torch.optim.Optimizer, names: dict[int, str]) -> list[tuple[tuple[str, ...], str]]:
    return [(tuple(names[id(p)] for p in g["params"]), repr({k: v for k, v in g.items() if k != "params"}))
            for g in opt.param_groups]


class _Stack:
    """Stacked parameters + one optimizer over them, for the live members (slice j = member live[j])."""

    def __init__(self, params: dict[str, Tensor], opt_cls: type, groups: list[tuple[list[str], dict]]) -> None:
        self.params = params
        self.groups = groups
        self.opt = opt_cls([{**hp, "params": [params[n] for n in names]} for names, hp in groups])

    @classmethod
    def from_members(cls, members: Sequence[Member]) -> _Stack:
        ref = members[0]
        names = {id(p): n for n, p in ref.model.named_parameters()}
        sig = _group_signature(ref.optimizer, names)
        for m in members[1:]:
            other = _group_signature(m.optimizer, {id(p): n for n, p in m.model.named_parameters()})
            if other != sig:
                raise ValueError("members of one vectorised group need identical optimizer param groups")
        params = {n: torch.stack([dict(m.model.named_parameters())[n].detach() for m in members]).requires_grad_()
                  for n in names.values()}
        groups = [([names[id(p)] for p in g["params"]], {k: v for k, v in g.items() if k != "params"})
                  for g in ref.optimizer.param_groups]
        return cls(params, type(ref.optimizer), groups)

    def state(self, name: str) -> dict[str, Tensor]:
        return self.opt.state[self.params[name]]

    def lerp_to_z(self, sel: Tensor, rows: dict[str, Tensor], weight_of_beta1: Callable[[float], float]
                  ) -> dict[str, Tensor]:
        """`rows` (= rows `sel` of the parameters) lerped towards z as schedule-free eval()/train() would."""
        out: dict[str, Tensor] = {}
        for names, hp in self.groups:
            w = weight_of_beta1(hp["betas"][0])
            for n in names:
                z = self.state(n).get("z")
                out[n] = rows[n] if z is None else rows[n].lerp(z[sel], w)
        return out

    def rows(self, sel: Tensor) -> dict[str, Tensor]:
        return {n: p.detach()[sel] for n, p in self.params.items()}

    def write_rows(self, sel: Tensor, values: dict[str, Tensor]) -> None:
        with torch.no_grad():
            for n, v in values.items():
                self.params[n][sel] = v

    def compact(self, keep: Tensor) -> _Stack:
        """A new stack holding only rows `keep`, optimizer state and per-group scalars carried over."""
        params = {n: p.detach()[keep].requires_grad_() for n, p in self.params.items()}
        new = _Stack(params, type(self.opt), [(names, dict(hp)) for names, hp in self.groups])
        for g_old, g_new in zip(self.opt.param_groups, new.opt.param_groups, strict=True):
            g_new.update({k: v for k, v in g_old.items() if k != "params"})
        for n in params:
            new.opt.state[params[n]] = {k: (v[keep] if torch.is_tensor(v) and v.dim() > 0 else v)
                                        for k, v in self.state(n).items()}
        return new


class _ReadoutConstants:
    """functional_call swaps in batched weights that carry no `infshape`: pin each MuReadout's width_mult."""

    def __init__(self, model: nn.Module) -> None:
        self.heads = [m for m in model.modules() if isinstance(m, MuReadout)]

    def __enter__(self) -> None:
        for h in self.heads:
            h.width_mult = (lambda v: (lambda: v))(h.width_mult())  # instance attribute shadows the method

    def __exit__(self, *exc: object) -> None:
        for h in self.heads:
            del h.width_mult


def fit_group(
    members: Sequence[Member],
    data: DeviceData,
    y: Tensor,
    x_val: Tensor,
    y_val: Tensor,
    on_finish: OnFinish | None = None,
    progress: bool = False,
    compile: bool = False,
) -> list[FitResult]:
    """Train all members at once; each ends as `training.fit.fit` would (best state loaded, eval mode)."""
    if not members:
        return []
    dev = data.device
    y, x_val, y_val = y.to(dev), x_val.to(dev), y_val.to(dev)
    bs, augment = members[0].cfg.batch_size, members[0].cfg.augment
    if any(m.cfg.batch_size != bs or m.cfg.augment != augment for m in members):
        raise ValueError("members of one group share the batch size and the augmentation flag")
    template = members[0].model
    pads = [augment_pad(data, m.cfg.augment) for m in members]
    sizes = [len(m.idx) for m in members]
    if min(sizes) == 0:
        raise ValueError("cannot fit on an empty training set")
    steps_per_epoch = [math.ceil(n / bs) for n in sizes]
    slots = max(steps_per_epoch) * bs
    idxs = [m.idx.to(dev) for m in members]

    # Per member (row): the epoch's global indices, sample weights (0 = padding) and augmentation, padded.
    plan_idx = torch.stack([torch.cat([i, i[:1].expand(slots - len(i))]) for i in idxs])
    plan_w = torch.stack([(torch.arange(slots, device=dev) < n).float() for n in sizes])
    plan_off = torch.zeros(len(members), slots, 2, dtype=torch.long, device=dev)
    plan_flip = torch.zeros(len(members), slots, dtype=torch.bool, device=dev)

    def new_epoch(k: int, row: int) -> None:
        ep = draw_epoch(sizes[k], members[k].gen, members[k].cfg.augment, pads[k])
        plan_idx[row, : sizes[k]] = idxs[k][ep.perm.to(dev)]
        if ep.offsets is not None and ep.flips is not None:
            plan_off[row, : sizes[k]] = ep.offsets.to(dev)
            plan_flip[row, : sizes[k]] = ep.flips.to(dev)

    for k in range(len(members)):
        new_epoch(k, k)

    def member_loss(params: dict[str, Tensor], xb: Tensor, yb: Tensor, wb: Tensor) -> Tensor:
        ce = F.cross_entropy(functional_call(template, params, (xb,)), yb, reduction="none")
        return (ce * wb).sum() / wb.sum()

    def member_logits(params: dict[str, Tensor], xb: Tensor) -> Tensor:
        return functional_call(template, params, (xb,))

    train_loss = vmap(member_loss)
    predict = vmap(member_logits, in_dims=(0, None))
    if compile:
        train_loss = torch.compile(train_loss)

    stack = _Stack.from_members(members)
    live = list(range(len(members)))  # member index of each stack row
    cursor = torch.zeros(len(members), dtype=torch.long, device=dev)  # batch number within the epoch, per row
    host_cursor = [0] * len(members)
    epoch = [1] * len(members)
    since_best = [0] * len(members)
    improved = [False] * len(members)
    best_loss = [math.inf] * len(members)
    best_epoch = [0] * len(members)
    curves: list[list[tuple[int, float]]] = [[] for _ in members]
    best = {n: p.detach().clone() for n, p in stack.params.items()}  # snapshot at init, like fit()
    results: list[FitResult | None] = [None] * len(members)
    slot = torch.arange(bs, device=dev)
    step = 0
    bar = tqdm(total=len(members), desc=f"{len(members)} models", unit="model", leave=False, disable=not progress)
    t0 = time.perf_counter()

    def validate(rows: list[int]) -> list[bool]:
        """Validation loss of stack rows in eval mode (mirrors eval_mode(): eval lerp, forward, train lerp)."""
        sel = torch.tensor(rows, device=dev)
        with torch.no_grad():
            eval_params = stack.lerp_to_z(sel, stack.rows(sel), lambda b1: 1 - 1 / b1)
            template.eval()
            logits = torch.cat([predict(eval_params, x_val[i: i + VAL_CHUNK]).double()
                                for i in range(0, len(x_val), VAL_CHUNK)], dim=1)
            template.train()
            ce = F.cross_entropy(logits.transpose(1, 2), y_val.expand(len(rows), -1), reduction="none")
            losses = (ce.sum(1) / len(y_val)).tolist()
            out = []
            for j, (r, loss) in enumerate(zip(rows, losses, strict=True)):
                k = live[r]
                curves[k].append((step, loss))
                better = loss < best_loss[k]
                if better:
                    best_loss[k], best_epoch[k] = loss, epoch[k]
                    for n in best:
                        best[n][r] = eval_params[n][j]
                out.append(better)
            stack.write_rows(sel, stack.lerp_to_z(sel, eval_params, lambda b1: 1 - b1))
        return out

    with _ReadoutConstants(template):
        template.train()
        stack.opt.train()
        while live:
            pos = cursor[:, None] * bs + slot  # (rows, bs)
            gidx = plan_idx.gather(1, pos)
            wb = plan_w.gather(1, pos)
            if augment:
                off = plan_off.gather(1, pos[..., None].expand(-1, -1, 2))
                xb = data.batch(gidx, off, plan_flip.gather(1, pos), max(pads))
            else:
                xb = data.batch(gidx)
            loss = train_loss(stack.params, xb, y[gidx], wb).sum()
            stack.opt.zero_grad(set_to_none=True)
            loss.backward()
            stack.opt.step()
            step += 1
            cursor += 1
            for r in range(len(live)):
                host_cursor[r] += 1
            to_val = [r for r in range(len(live)) if members[live[r]].cfg.eval_every_steps
                      and step % members[live[r]].cfg.eval_every_steps == 0]  # fmt: skip
            if to_val:
                for r, better in zip(to_val, validate(to_val), strict=True):
                    improved[live[r]] |= better
            ends = [r for r in range(len(live)) if host_cursor[r] == steps_per_epoch[live[r]]]
            if not ends:
                continue
            per_epoch = [r for r in ends if not members[live[r]].cfg.eval_every_steps]
            if per_epoch:
                for r, better in zip(per_epoch, validate(per_epoch), strict=True):
                    improved[live[r]] = better
            done = []
            for r in ends:
                k = live[r]
                since_best[k] = 0 if improved[k] else since_best[k] + 1
                improved[k] = False
                if since_best[k] >= members[k].cfg.patience or epoch[k] >= members[k].cfg.max_epochs:
                    done.append(r)
                else:
                    epoch[k] += 1
                    host_cursor[r] = 0
                    new_epoch(k, r)
            reset = [r for r in ends if r not in done]
            if reset:
                cursor[torch.tensor(reset, device=dev)] = 0
            for r in done:
                k = live[r]
                model = members[k].model
                model.eval()
                model.load_state_dict({n: v[r].clone() for n, v in best.items()})
                results[k] = FitResult(best_loss[k], best_epoch[k], epoch[k], step, curves[k],
                                       time.perf_counter() - t0)
                if on_finish is not None:
                    on_finish(k, model, results[k])
                bar.update(1)
                bar.set_postfix(step=step, s=f"{time.perf_counter() - t0:.0f}")
            if done:
                keep_rows = [r for r in range(len(live)) if r not in done]
                live = [live[r] for r in keep_rows]
                host_cursor = [host_cursor[r] for r in keep_rows]
                if not live:
                    break
                keep = torch.tensor(keep_rows, device=dev)
                stack = stack.compact(keep)
                best = {n: v[keep] for n, v in best.items()}
                plan_idx, plan_w, plan_off, plan_flip, cursor = (t[keep] for t in (plan_idx, plan_w, plan_off,
                                                                                   plan_flip, cursor))
    bar.close()
    for m in members:
        m.model.eval()  # the template's mode was toggled by validations after its own finish
    return [r for r in results if r is not None]
