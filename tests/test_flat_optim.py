"""The flat schedule-free step (training/engine/flat_optim.py) against schedulefree's own AdamWScheduleFree.

Same formulas and scalars: parameters agree to float32 rounding (measured <= 3e-7 relative after 40 steps
for all three kernels - numba, torch.compile, eager; FMA contraction differs), the per-group scalars
exactly. Dropping members and the eval/train lerp behave as with the library.
"""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from tests.helpers import optimizer
from tests.test_vectorized import _models
from training.engine.backends import check_same_groups
from training.engine.flat_optim import FlatScheduleFree, LibraryOptim, cpu_compiler, make_member_optim

RTOL = 1e-5  # on max |a - b| / max |a| per tensor; measured <= 3e-7


Twin = tuple[list[torch.nn.Module], list[tuple[list[str], dict]], type[torch.optim.Optimizer]]


def _pair(n_members: int = 3, weight_decay: float = 0.0) -> list[Twin]:
    """Twin sets of members (same init): one for the library, one for the flat optimizer."""
    twins: list[Twin] = []
    for _ in range(2):
        models = [m for m, _ in _models("mlp", list(range(n_members)))]
        opts = [optimizer(m, lr=3e-3, beta1=0.9, weight_decay=weight_decay, warmup_steps=5) for m in models]
        twins.append((models, check_same_groups(models, opts), type(opts[0])))
    return twins


def _grads(models: list[torch.nn.Module], step: int) -> list[dict[str, Tensor]]:
    g = torch.Generator().manual_seed(step)
    return [{n: torch.randn(p.shape, generator=g) for n, p in m.named_parameters()} for m in models]


def _step(opt: LibraryOptim | FlatScheduleFree, models: list[torch.nn.Module], grads: list[dict[str, Tensor]]) -> None:
    opt.zero_grad()
    for m, gs in zip(models, grads, strict=True):
        for n, p in m.named_parameters():
            (p * gs[n]).sum().backward()  # accumulate the gradient through autograd, as training does


def _assert_close(a: list[torch.nn.Module], b: list[torch.nn.Module]) -> None:
    for ma, mb in zip(a, b, strict=True):
        for (n, pa), pb in zip(ma.named_parameters(), mb.parameters(), strict=True):
            err = float(((pa - pb).abs().max() / pa.abs().max()).detach())
            assert err <= RTOL, (n, err)


@pytest.mark.parametrize("backend", ["numba", "eager", "compile"])
@pytest.mark.parametrize("weight_decay", [0.0, 0.1])
def test_flat_step_matches_the_library(backend: str, weight_decay: float) -> None:
    if backend == "compile" and cpu_compiler() is None:
        pytest.skip("no C++ compiler for torch.compile on CPU")
    (lib_models, groups, cls), (flat_models, _, _) = _pair(weight_decay=weight_decay)
    lib = LibraryOptim(cls, groups, [dict(m.named_parameters()) for m in lib_models])
    flat = FlatScheduleFree(groups, [dict(m.named_parameters()) for m in flat_models], backend=backend)
    lib.train()
    flat.train()
    for step in range(40):
        grads = _grads(lib_models, step)
        _step(lib, lib_models, grads)
        _step(flat, flat_models, grads)
        lib.step()
        flat.step()
    _assert_close(lib_models, flat_models)
    moved = max(float((a - b).detach().abs().max()) for a, b in zip(lib_models[0].parameters(),
                                                            _models("mlp", [0])[0][0].parameters(), strict=True))
    assert moved > 1e-2  # the test really trains
    for g_lib, group in zip(lib.opts[0].param_groups, flat.group_settings, strict=True):  # one cohort
        assert (g_lib["k"], g_lib["weight_sum"], g_lib["lr_max"]) == (group["k"], group["weight_sum"], group["lr_max"])
    # Parameters and gradients are views into the flat buffers: one kernel updates all members.
    buffers = {b.untyped_storage().data_ptr() for b in flat.y}
    assert len(buffers) == len(groups)
    assert all(p.untyped_storage().data_ptr() in buffers for m in flat_models for p in m.parameters())


def test_eval_lerp_and_dropping_members_match_the_library() -> None:
    (lib_models, groups, cls), (flat_models, _, _) = _pair()
    lib = LibraryOptim(cls, groups, [dict(m.named_parameters()) for m in lib_models])
    flat = FlatScheduleFree(groups, [dict(m.named_parameters()) for m in flat_models], backend="numba")
    lib.train()
    flat.train()
    for step in range(6):
        grads = _grads(lib_models, step)
        for opt, models in ((lib, lib_models), (flat, flat_models)):
            _step(opt, models, grads)
            opt.step()
    y1 = [p.detach().clone() for p in flat_models[1].parameters()]
    y0 = [p.detach().clone() for p in flat_models[0].parameters()]
    for opt in (lib, flat):  # member 1 in eval mode (x), then back (y)
        opt.lerp_member(1, lambda b1: 1 - 1 / b1)
    _assert_close(lib_models, flat_models)
    assert any(not torch.equal(a, p) for a, p in zip(y1, flat_models[1].parameters(), strict=True))
    assert all(torch.equal(a, p) for a, p in zip(y0, flat_models[0].parameters(), strict=True))  # only member 1
    for opt in (lib, flat):
        opt.lerp_member(1, lambda b1: 1 - b1)
        opt.keep([0, 2])  # member 1 finishes
    frozen = {n: p.detach().clone() for n, p in flat_models[1].named_parameters()}
    for step in range(6, 12):
        grads = _grads(lib_models, step)
        for opt, models in ((lib, [lib_models[0], lib_models[2]]), (flat, [flat_models[0], flat_models[2]])):
            _step(opt, models, grads[:2])
            opt.step()
    _assert_close(lib_models, flat_models)
    for n, p in flat_models[1].named_parameters():
        assert torch.equal(p, frozen[n]), n  # a finished member is never updated again
    assert sum(b.numel() for b in flat.y) == sum(p.numel() for m in (flat_models[0], flat_models[2])
                                                 for p in m.parameters())


def test_bad_flag_missing_compiler_and_step_in_eval_mode(monkeypatch: pytest.MonkeyPatch) -> None:
    (models, groups, cls), _ = _pair(1)
    with pytest.raises(ValueError, match="fused_optimizer"):
        make_member_optim("maybe", cls, groups, [dict(m.named_parameters()) for m in models])
    fused = make_member_optim("True", cls, groups, [dict(m.named_parameters()) for m in models])
    assert isinstance(fused, FlatScheduleFree) and fused.update.__name__ == "sf_update_numba"  # true on CPU: numba
    flat = make_member_optim("eager", cls, groups, [dict(m.named_parameters()) for m in models])
    with pytest.raises(RuntimeError, match="eval mode"):
        flat.step()
    monkeypatch.setattr("training.engine.flat_optim.cpu_compiler", lambda: None)
    with pytest.raises(RuntimeError, match="C\\+\\+ compiler"):
        make_member_optim("compile", cls, groups, [dict(m.named_parameters()) for m in models])
