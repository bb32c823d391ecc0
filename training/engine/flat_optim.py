"""Schedule-free AdamW for the loop engine: the library's own step, or one fused kernel over flat buffers.

`LibraryOptim` steps the members' parameters with their optimizer class (schedulefree's AdamWScheduleFree): bitwise
what `training.engine.fit.fit` does. `FlatScheduleFree` (`training.fused_optimizer`) keeps every parameter group of
all members in one flat buffer (parameters and gradients are views into it) and does the whole update in one pass:
a numba loop on CPU (sf_kernel.py; it releases the GIL for `training.workers` threads) or `torch.compile` (Triton on
GPU). Same formulas and per-group scalars as the library, up to float32 rounding where one side contracts a
multiply-add into an FMA (tests/test_flat_optim.py). Both keep a member's parameters contiguous within each group
(evaluation's lerp touches one member only) and `keep(rows)` drops finished members.
"""

from __future__ import annotations

import functools
import shutil
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch
from torch import Tensor

from training.common import env
from training.engine.stacked_optim import Groups, StepScalars, next_scalars


class LibraryOptim:
    """The members' own optimizer class over the members' parameters (foreach kernels): one optimizer per cohort
    (the members that started at the same step share the library's per-group scalars k, lr_max, weight_sum)."""

    def __init__(self, opt_cls: Callable[..., torch.optim.Optimizer], groups: Groups, params: list[dict[str, Tensor]]):
        self.opt_cls, self.groups, self.params = opt_cls, groups, params
        self.cohort = [0] * len(params)  # per row: its cohort (an id)
        self.opts = {0: self._build(range(len(params)))}

    def _build(self, rows: Iterable[int]) -> torch.optim.Optimizer:
        rows = list(rows)
        return self.opt_cls([{**group, "params": [self.params[r][n] for r in rows for n in names]}
                             for names, group in self.groups])

    def _rows(self, c: int) -> list[int]:
        return [r for r, k in enumerate(self.cohort) if k == c]

    def _of(self, r: int) -> torch.optim.Optimizer:
        return self.opts[self.cohort[r]]

    def train(self) -> None:
        for opt in self.opts.values():
            opt.train()  # type: ignore[attr-defined]

    def zero_grad(self) -> None:
        for opt in self.opts.values():
            opt.zero_grad(set_to_none=True)

    def step(self) -> None:
        for opt in self.opts.values():
            opt.step()

    @torch.no_grad()
    def lerp_member(self, r: int, weight: Callable[[float], float]) -> None:
        state = self._of(r).state
        for names, group in self.groups:
            w = weight(group["betas"][0])
            for n in names:
                p = self.params[r][n]
                if "z" in state[p]:
                    p.lerp_(state[p]["z"], w)

    def state_dict(self) -> dict[str, Any]:
        """Per cohort its per-group scalars (k, lr_max, weight_sum, train_mode, ...); each row's cohort and
        per-parameter state."""
        return {"cohort": list(self.cohort),
                "groups": {c: [{k: v for k, v in g.items() if k != "params"} for g in opt.param_groups]
                           for c, opt in self.opts.items()},
                "state": [{n: {k: v.detach().clone() if torch.is_tensor(v) else v
                               for k, v in self._of(r).state[p].items()}
                           for n, p in ps.items() if p in self._of(r).state} for r, ps in enumerate(self.params)]}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        self.cohort = [int(c) for c in saved["cohort"]]
        self.opts = {c: self._build(self._rows(c)) for c in sorted(set(self.cohort))}
        for c, opt in self.opts.items():
            for g, scalars in zip(opt.param_groups, saved["groups"][c], strict=True):
                g.update(scalars)
        for r, (ps, state) in enumerate(zip(self.params, saved["state"], strict=True)):
            for n, st in state.items():
                p = ps[n]
                self._of(r).state[p] = {k: v.to(p.device) if torch.is_tensor(v) else v for k, v in st.items()}

    def keep(self, rows: list[int]) -> None:
        old = self.opts
        self.params = [self.params[r] for r in rows]
        self.cohort = [self.cohort[r] for r in rows]
        self.opts = {}
        for c in sorted(set(self.cohort)):
            self._rebuild(c, old[c])

    def replace(self, r: int, params: dict[str, Tensor]) -> None:
        """Row r takes a new member (`params`): a cohort of its own, from the library's initial scalars; the old
        cohort loses the finished member's parameters (no update touches them again)."""
        old, new = self.cohort[r], max(self.opts) + 1
        self.params[r], self.cohort[r] = params, new
        self.opts[new] = self._build([r])
        if old in self.cohort:
            self._rebuild(old, self.opts[old])
        else:
            del self.opts[old]

    def _rebuild(self, c: int, carry: torch.optim.Optimizer) -> None:
        """Cohort c's optimizer over its rows now, with `carry`'s scalars and per-parameter state."""
        opt = self.opts[c] = self._build(self._rows(c))
        for g_old, g_new in zip(carry.param_groups, opt.param_groups, strict=True):  # k, lr_max, weight_sum, ...
            g_new.update({k: v for k, v in g_old.items() if k != "params"})
        for p in (p for r in self._rows(c) for p in self.params[r].values()):
            if p in carry.state:
                opt.state[p] = carry.state[p]


def _sf_update(y: Tensor, z: Tensor, v: Tensor, g: Tensor, t: tuple[Tensor, Tensor, Tensor, Tensor],
               hp: tuple[float, float, float]) -> None:
    """One schedule-free AdamW step, in place, with the library's formulas (schedulefree 1.4); `t`: the step's
    (lr, ckp1, bc2, y coefficient) as tensors of y's dtype, `hp`: (beta2, eps, weight decay)."""
    (lr, ckp1, bc2, y_coef), (beta2, eps, decay) = t, hp
    v.mul_(beta2).addcmul_(g, g, value=1 - beta2)
    gn = g / ((v / bc2).sqrt() + eps)
    if decay != 0:
        gn = gn + y * decay
    y.lerp_(z, ckp1)
    y.add_(gn * y_coef)
    z.sub_(gn * lr)


def cpu_compiler() -> str | None:
    """The C++ compiler torch.compile (inductor) would use for CPU kernels, if one is installed."""
    named = env.cxx()
    candidates = [named] if named is not None else ["g++", "c++", "clang++"]
    return next((c for c in candidates if shutil.which(c)), None)


@functools.cache
def _compiled_update() -> Callable[..., None]:
    return torch.compile(_sf_update, dynamic=True, fullgraph=True)


Update = Callable[[Tensor, Tensor, Tensor, Tensor, StepScalars, Mapping[str, Any]], None]  # y, z, v, g, step, group
BACKENDS = ("numba", "compile", "eager")


def update_fn(backend: str, device: torch.device) -> Update:
    """The step kernel: "numba" (CPU: one loop, releases the GIL), "compile" (torch.compile: Triton on GPU, C++
    on CPU, which holds the GIL while it runs), "eager" (the same formulas op by op; tests)."""
    if backend == "numba":
        if device.type != "cpu":
            raise ValueError("the numba optimizer kernel runs on CPU; on GPU use training.fused_optimizer=compile")
        from training.engine.sf_kernel import sf_update_numba

        return sf_update_numba
    if backend not in ("compile", "eager"):
        raise ValueError(f"unknown optimizer kernel {backend!r}: one of {BACKENDS}")
    if backend == "compile" and device.type == "cpu" and cpu_compiler() is None:
        raise RuntimeError("training.fused_optimizer=compile uses torch.compile, which on CPU needs a C++ compiler "
                           "(g++ or clang++, or $CXX): none found. Install one, or use numba (the CPU default)")
    kernel: Callable[..., None] = _compiled_update() if backend == "compile" else _sf_update

    def update(y: Tensor, z: Tensor, v: Tensor, g: Tensor, s: StepScalars, group: Mapping[str, Any]) -> None:
        t = tuple(torch.tensor(x, dtype=y.dtype, device=y.device) for x in (s.lr, s.ckp1, s.bc2, s.coef))
        kernel(y, z, v, g, t, (group["betas"][1], group["eps"], group["weight_decay"]))

    return update


class FlatScheduleFree:
    """Schedule-free AdamW over flat per-group buffers of all members; one compiled kernel per group."""

    def __init__(self, groups: Groups, params: list[dict[str, Tensor]], backend: str = "numba") -> None:
        self.groups = groups
        self.group_settings = [dict(group) for _, group in groups]
        for group in self.group_settings:
            if group.get("r", 0.0) != 0.0 or group.get("k", 0) != 0:
                raise ValueError("fused_optimizer supports schedule-free AdamW with r=0, from its first step")
        self.params = params
        self.update = update_fn(backend, next(iter(params[0].values())).device)
        # set by _pack, per group: y (params), g (grads), z (None until the first step), v, each member's [start, end)
        self.y: list[Tensor]
        self.g: list[Tensor]
        self.z: list[Tensor | None]
        self.v: list[Tensor]
        self.spans: list[list[tuple[int, int]]]
        self._pack([[p[n].detach() for p in params for n in names] for names, _ in groups], None, None)
        self.train_mode = False

    def _pack(self, tensors: list[list[Tensor]], z: list[Tensor | None] | None, v: list[Tensor] | None) -> None:
        """Build the buffers from the live members' current values (and z, v slices) and point params at them."""
        self.y, self.g, self.spans = [], [], []
        new_z: list[Tensor | None] = []
        new_v: list[Tensor] = []
        for gi, (names, _) in enumerate(self.groups):
            y = torch.cat([t.reshape(-1) for t in tensors[gi]])
            g = torch.zeros_like(y)
            spans, offset = [], 0
            for p in self.params:
                start = offset
                for n in names:
                    size = p[n].numel()
                    p[n].data = y[offset: offset + size].view_as(p[n])
                    p[n].grad = g[offset: offset + size].view_as(p[n])
                    offset += size
                spans.append((start, offset))
            self.y.append(y)
            self.g.append(g)
            self.spans.append(spans)
            new_z.append(None if z is None else z[gi])
            new_v.append(torch.zeros_like(y) if v is None else v[gi])
        self.z, self.v = new_z, new_v

    def train(self) -> None:
        if not self.train_mode:
            for r in range(len(self.params)):
                self.lerp_member(r, lambda b1: 1 - b1)
        self.train_mode = True

    def zero_grad(self) -> None:
        for g in self.g:
            g.zero_()  # gradients accumulate into these views (autograd adds in place into an existing .grad)

    @torch.no_grad()
    def step(self) -> None:
        if not self.train_mode:
            raise RuntimeError("optimizer step in eval mode: call train() first")
        for gi, group in enumerate(self.group_settings):
            z = self.z[gi]
            if z is None:
                z = self.z[gi] = self.y[gi].clone()
            self.update(self.y[gi], z, self.v[gi], self.g[gi], next_scalars(group), group)

    @torch.no_grad()
    def lerp_member(self, r: int, weight: Callable[[float], float]) -> None:
        for gi, group in enumerate(self.group_settings):
            z = self.z[gi]
            if z is not None:
                s, e = self.spans[gi][r]
                self.y[gi][s:e].lerp_(z[s:e], weight(group["betas"][0]))

    def state_dict(self) -> dict[str, Any]:
        """The flat buffers (y, z, v), the per-group scalars and the mode."""
        return {"y": [y.clone() for y in self.y], "z": [None if z is None else z.clone() for z in self.z],
                "v": [v.clone() for v in self.v], "hp": [dict(group) for group in self.group_settings],
                "train_mode": self.train_mode}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        dev = self.y[0].device
        self._pack([[y.to(dev)] for y in saved["y"]], [None if z is None else z.to(dev) for z in saved["z"]],
                   [v.to(dev) for v in saved["v"]])
        self.group_settings = [dict(group) for group in saved["hp"]]
        self.train_mode = bool(saved["train_mode"])

    def keep(self, rows: list[int]) -> None:
        def take(buf: Tensor, gi: int) -> Tensor:
            return torch.cat([buf[slice(*self.spans[gi][r])] for r in rows])

        ys = [[take(self.y[gi], gi)] for gi in range(len(self.groups))]
        zs = [None if z is None else take(z, gi) for gi, z in enumerate(self.z)]
        vs = [take(v, gi) for gi, v in enumerate(self.v)]
        old = self.params
        # Finished members keep their values: detach them from the shared buffers first.
        for r in range(len(old)):
            if r not in rows:
                for p in old[r].values():
                    p.data = p.data.clone()
                    p.grad = None
        self.params = [old[r] for r in rows]
        self._pack(ys, zs, vs)


def fused_backend(flag: bool | str | None, device: torch.device) -> str | None:
    """The kernel a `training.fused_optimizer` value asks for on `device`: None (false/none: the library's
    step), numba | compile | eager; true → numba on CPU, compile on GPU. Raises on anything else."""
    kind = str(flag).lower()
    if kind in ("false", "none", ""):
        return None
    if kind == "true":
        return "numba" if device.type == "cpu" else "compile"
    if kind not in BACKENDS:
        raise ValueError(f"training.fused_optimizer must be true, false or one of {BACKENDS}, got {flag!r}")
    return kind


def make_member_optim(kind: str, opt_cls: Callable[..., torch.optim.Optimizer], groups: Groups,
                      params: list[dict[str, Tensor]]) -> LibraryOptim | FlatScheduleFree:
    """`training.fused_optimizer` (see `fused_backend`): the library's step or the flat kernel."""
    backend = fused_backend(kind, next(iter(params[0].values())).device)
    if backend is None:
        return LibraryOptim(opt_cls, groups, params)
    return FlatScheduleFree(groups, params, backend=backend)
