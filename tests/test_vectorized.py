"""Vectorised training (training/engine/group.py) equals training the same models one by one.

The `loop` engine runs exactly the kernels of sequential training: results are bitwise equal (tolerance 0).
The `stacked` engine (vmap over stacked parameters), float32 on CPU: validation losses within 1e-5 relative
(measured <= 2e-7), identical early-stopping epochs, final parameters within 1e-4 of their scale (measured
<= 5e-5). The float32 differences are rounding of batched vs single matmuls/convolutions; Adam can amplify
them (a gradient that is 0 in one order of summation and 1e-12 in another gets normalised to a full step),
so at a higher lr float32 runs drift apart by ~1e-3 after a few epochs. The same runs in float64 agree to
1e-12 relative: the arithmetic is the same.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from models import build_model
from tests.helpers import fit_settings, group_options, job_config, optimizer, result_of
from training.app.schema import ArchConfig, group_config
from training.engine.batches import DeviceData, compact
from training.engine.fit import FitResult, Member, Regularizer, TrainData, cross_entropy_sum, fit, snapshot
from training.engine.flat_optim import cpu_compiler
from training.engine.group import (
    balanced_parts,
    fit_group,
    resolve_engine,
    resolve_workers,
    why_not_vectorized,
)
from training.engine.seeding import generator, seeded_global_rng
from training.tasks.mdl.job import run_job

# (loss rtol, parameter tol / scale) of the stacked engine; the loop engine must be exact.
TOL = {torch.float32: (1e-5, 1e-4), torch.float64: (1e-12, 1e-10), "exact": (0.0, 0.0)}
LOSS_RTOL = TOL[torch.float32][0]
SHAPE, K = (3, 8, 8), 4


def _arch(name: str) -> ArchConfig:
    # width != base_width: μP readout multiplier and MuAdam's per-group lr / width_mult are exercised.
    return group_config("arch", name, width=48, depth=2, base_width=32)


def _data(n: int = 520, dtype: torch.dtype = torch.float32, device: str = "cpu",
          ) -> tuple[DeviceData, Tensor, Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    y = torch.randint(0, K, (n,), generator=g)
    x = torch.rand(n, *SHAPE, generator=g) * 0.7
    x[:, 0, :4] += 0.1 * (y[:, None, None] % 2)  # learnable but noisy: early stopping triggers
    x = ((x * 255).round() / 255).to(dtype)
    data = DeviceData(x, device)
    y = y.to(device)
    return data, y, data.all(torch.arange(80)), y[:80]


def _models(arch: str, tags: list[int], lr: float = 4e-3, dtype: torch.dtype = torch.float32,
            device: str = "cpu") -> list[tuple[torch.nn.Module, torch.optim.Optimizer]]:
    out = []
    for t in tags:
        with seeded_global_rng(0, "init", t):
            model = build_model(_arch(arch), SHAPE, K).to(device=device, dtype=dtype)
        out.append((model, optimizer(model, lr=lr, beta1=0.9, warmup_steps=7)))
    return out


def _compare(arch: str, augment: bool, engine: str, eval_every: int | None = None, lr: float = 4e-3,
             dtype: torch.dtype = torch.float32, own_val: bool = False, device: str = "cpu",
             compile: str | None = None, regularizer: Regularizer | None = None, workers: int = 1,
             fused: str = "false") -> None:
    exact = engine == "loop" and device == "cpu" and not compile and fused == "false"
    loss_rtol, param_tol = TOL["exact" if exact else dtype]
    data, y, xv, yv = _data(dtype=dtype, device=device)
    sizes, patience = [45, 150, 440], [1, 2, 50]  # partial last batches; different stop epochs
    subsets = [torch.arange(80, 80 + s) for s in sizes]
    cfgs = [fit_settings(batch_size=32, patience=p, max_epochs=9, augment=augment, eval_every_steps=eval_every,
                      progress=False) for p in patience]
    val_idx = [torch.arange(80) + (20 * k if own_val else 0) for k in range(3)]  # own_val: 3 different sets
    seq = []
    for k, (model, opt) in enumerate(_models(arch, [0, 1, 2], lr, dtype, device)):
        # its own validation set through the member's val_idx, as fit_group's members below
        res = fit(Member(model, opt, subsets[k], generator(0, "b", k), cfgs[k], val_idx=val_idx[k]), TrainData(data, y),
                  regularizer)
        seq.append((model, res))
    members = [Member(m, o, subsets[k], generator(0, "b", k), cfgs[k], val_idx=val_idx[k])
               for k, (m, o) in enumerate(_models(arch, [0, 1, 2], lr, dtype, device))]
    order: list[int] = []
    shared = (None, None) if own_val else (xv, yv)
    vec = fit_group(members, TrainData(data, y, *shared),
                    group_options(on_finish=lambda k, model, res: order.append(k), engine=engine, compile=compile,
                                 regularizer=regularizer, workers=workers, fused_optimizer=fused))
    assert sorted(order) == [0, 1, 2]
    epochs = [r.epochs for _, r in seq]
    assert len(set(epochs)) > 1 and min(epochs) < 9, epochs  # the test really covers early stopping
    for (ms, rs), mv, rv in zip(seq, members, vec, strict=True):
        assert (rv.epochs, rv.best_epoch, rv.steps) == (rs.epochs, rs.best_epoch, rs.steps)
        assert rv.best_val_loss == pytest.approx(rs.best_val_loss, rel=loss_rtol)
        assert [s for s, _ in rv.curve] == [s for s, _ in rs.curve]
        assert [v for _, v in rv.curve] == pytest.approx([v for _, v in rs.curve], rel=loss_rtol)
        assert not mv.model.training
        for name, a in ms.state_dict().items():
            b = mv.model.state_dict()[name]
            assert (a - b).abs().max() <= param_tol * (a.abs().max() + 1e-3), name
        coded = data.all(torch.arange(80, 200, device=device))
        assert cross_entropy_sum(mv.model, coded, y[80:200]) == pytest.approx(
            cross_entropy_sum(ms, coded, y[80:200]), rel=loss_rtol)


def _step_penalty(logits: Tensor, y: Tensor, step: int) -> Tensor:
    return (0.05 if step >= 4 else 0.0) * logits.square().mean()


# _compare's arguments for each case; the loop engine bitwise, the stacked one within its tolerance
COMPARED: dict[str, dict[str, Any]] = {
    **{f"mlp-{e}": dict(arch="mlp", augment=False, engine=e) for e in ("loop", "stacked")},
    # stacked at lr 4e-3: rounding amplified to ~1e-3
    **{f"lenet-augment-{e}": dict(arch="lenet", augment=True, engine=e, lr=2e-3) for e in ("loop", "stacked")},
    **{f"eval-every-own-val-{e}": dict(arch="mlp", augment=True, engine=e, eval_every=3, own_val=True)
       for e in ("loop", "stacked")},
    # lr 1e-2: float32 stacked runs drift from sequential (Adam amplifies rounding); float64 agrees to 1e-12
    **{f"{a}-float64-chaotic": dict(arch=a, augment=a == "lenet", engine="stacked", lr=1e-2, dtype=torch.float64)
       for a in ("mlp", "lenet")},
    # training.workers=2: the members split over two threads (one core each); still bitwise exact
    **{f"{a}-workers": dict(arch=a, augment=a == "lenet", engine="loop", workers=2, own_val=a == "mlp", lr=2e-3)
       for a in ("mlp", "lenet")},
    # a regularizer that depends on the step (like SD's start_step): the loop engine is still bitwise exact
    "regularizer-loop": dict(arch="mlp", augment=False, engine="loop", regularizer=_step_penalty),
    # training.compile=true (CPU inductor here; minutes to compile): same numbers within the float32 tolerance
    **{f"compiled-{e}": dict(arch="mlp", augment=True, engine=e, compile="default") for e in ("loop", "stacked")},
    # training.fused_optimizer: the flat schedule-free step (numba on CPU, or torch.compile) within float32 rounding
    # of the library's, so within the stacked engine's tolerance of sequential training
    **{f"fused-{f}": dict(arch="mlp", augment=True, engine="loop", fused=f, workers=2) for f in ("true", "compile")},
    # torch.compile (Triton) on GPU. CUDA vs sequential: tests/test_numerics_contract.py (the GPU promise is the
    # numerics contract's tolerance)
    "cuda-fused": dict(arch="mlp", augment=True, engine="loop", device="cuda", fused="true"),
}
MARKS = {"compiled-loop": pytest.mark.slow, "compiled-stacked": pytest.mark.slow, "cuda-fused": pytest.mark.gpu}


@pytest.mark.parametrize("case", [pytest.param(case, marks=MARKS.get(case, ())) for case in COMPARED])
def test_group_equals_sequential(case: str) -> None:
    if COMPARED[case].get("fused") == "compile" and cpu_compiler() is None:
        pytest.skip("no C++ compiler for torch.compile on CPU")
    _compare(**COMPARED[case])


@pytest.mark.parametrize("engine", ["loop", "stacked"])
def test_members_finishing_apart_are_each_reported_as_if_trained_alone(engine: str) -> None:
    """Five members stop at different steps for both reasons, two on the same step, while the others go on:
    `on_finish` comes in step order, each time with that member's model in eval mode holding exactly the state
    (and result) of training it alone, although the group has been compacted around it."""
    loss_rtol, param_tol = TOL["exact" if engine == "loop" else torch.float32]
    data, y, xv, yv = _data()
    sizes, patience = [45, 300, 64, 440, 100], [1, 3, 50, 1, 2]
    subsets = [torch.arange(80, 80 + s) for s in sizes]
    cfgs = [fit_settings(batch_size=32, patience=p, max_epochs=9, min_steps=30, progress=False) for p in patience]
    alone = _models("mlp", list(range(5)))
    seq = [fit(Member(m, o, subsets[k], generator(0, "b", k), cfgs[k]), TrainData(data, y, xv, yv))
           for k, (m, o) in enumerate(alone)]
    steps, reasons = [r.steps for r in seq], {r.stop_reason for r in seq}
    assert len(set(steps)) < len(steps) and reasons == {"patience", "max_epochs"}, (steps, reasons)
    members = [Member(m, o, subsets[k], generator(0, "b", k), cfgs[k])
               for k, (m, o) in enumerate(_models("mlp", list(range(5))))]
    seen: list[tuple[int, FitResult, bool, dict[str, Tensor]]] = []
    vec = fit_group(members, TrainData(data, y, xv, yv), group_options(
        engine=engine, on_finish=lambda k, model, res: seen.append((k, res, model.training, snapshot(model)))))
    assert [k for k, *_ in seen] == sorted(range(5), key=lambda k: (steps[k], k))
    assert [r.seconds for _, r, *_ in seen] == sorted(r.seconds for _, r, *_ in seen)
    for k, res, training, state in seen:
        s = seq[k]
        assert res is vec[k] and not training
        assert (res.epochs, res.best_epoch, res.steps, res.stop_reason) == (s.epochs, s.best_epoch, s.steps,
                                                                             s.stop_reason)
        assert [t for t, _ in res.curve] == [t for t, _ in s.curve]
        assert [v for _, v in res.curve] == pytest.approx([v for _, v in s.curve], rel=loss_rtol)
        for name, a in alone[k][0].state_dict().items():
            assert (a - state[name]).abs().max() <= param_tol * (a.abs().max() + 1e-3), (k, name)


def test_a_failing_worker_stops_the_others() -> None:
    """An error in one worker (here in on_finish) is raised once and the other worker stops early."""
    data, y, xv, yv = _data()
    models = _models("mlp", [0, 1])
    cfgs = [fit_settings(batch_size=32, patience=1, max_epochs=1, progress=False),
            fit_settings(batch_size=32, patience=10_000, max_epochs=10_000, progress=False)]
    members = [Member(m, o, torch.arange(80, 200), generator(0, "b", k), cfgs[k]) for k, (m, o) in enumerate(models)]
    finished: list[int] = []

    def on_finish(k: int, model: torch.nn.Module, res: FitResult) -> None:
        finished.append(k)
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        fit_group(members, TrainData(data, y, xv, yv), group_options(on_finish=on_finish, workers=2))
    assert finished == [0]  # member 1 (10k epochs) was cancelled, not trained to the end
    assert torch.get_num_threads() == 1  # the caller's thread setting is restored


def test_engines_workers_and_partition() -> None:
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert resolve_workers("auto", cpu, "loop", 9) == min(torch.get_num_threads(), 9)
    assert resolve_workers("auto", cuda, "stacked", 9) == 1
    assert resolve_workers(4, cpu, "loop", 3) == 3
    with pytest.raises(ValueError, match="loop engine"):
        resolve_workers(2, cpu, "stacked", 9)
    with pytest.raises(ValueError, match="positive"):
        resolve_workers(0, cpu, "loop", 9)
    costs = [float(c) for c in torch.randint(1, 1000, (13,), generator=torch.Generator().manual_seed(0))]
    for n in (1, 2, 3, 5):
        parts = balanced_parts(costs, n)
        assert sorted(i for p in parts for i in p) == list(range(13))
        loads = [sum(costs[i] for i in p) for p in parts]
        assert max(loads) - min(loads) <= max(costs), (n, loads)
    assert balanced_parts([5.0, 3.0, 2.0], 2) == [[0], [1, 2]]  # 5 | 3+2, not LPT's first guess
    assert balanced_parts([1.0], 4) == [[0]]
    assert resolve_engine("auto", torch.device("cpu")) == "loop"
    assert resolve_engine("auto", torch.device("cuda")) == "stacked"
    with pytest.raises(ValueError):
        resolve_engine("bogus", torch.device("cpu"))
    model, opt = _models("mlp", [0])[0]  # a regularizer or a batch norm is not vectorised
    assert why_not_vectorized(model, opt) is None
    assert why_not_vectorized(model, opt, lambda z, y, s: z.sum(), engine="loop") is None
    assert "regularizer" in str(why_not_vectorized(model, opt, lambda z, y, s: z.sum(), engine="stacked"))
    bn = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(4, 2), torch.nn.BatchNorm1d(2))
    assert why_not_vectorized(bn, torch.optim.SGD(bn.parameters(), lr=0.1)) is not None


def test_storage_is_exact_and_compact() -> None:
    pixels = torch.randint(0, 256, (50, 1, 4, 4)).float() / 255
    assert compact(pixels).dtype == torch.uint8
    sixteenths = torch.randint(0, 17, (50, 1, 4, 4)).float() / 16 * 3  # > 1: not uint8/255, exact in float16
    assert compact(sixteenths).dtype == torch.float16
    erased = pixels + 1e-3 * torch.randn_like(pixels)
    assert compact(erased).dtype == torch.float32
    for x in (pixels, sixteenths, erased):
        d = DeviceData(x)
        assert torch.equal(d.all(), x)
        idx = torch.tensor([[3, 1], [0, 49]])
        assert torch.equal(d.batch(idx), x[idx])
    with pytest.raises(ValueError, match="exactly"):
        compact(erased, "uint8")


def test_job_parallel_equals_one_at_a_time(tmp_path: Path) -> None:
    """A job's block models + full-data run in one group (default) give the one-at-a-time numbers."""
    quick = ["dataset=digits", "mdl=quick", "mdl.max_epochs=4", "optim.warmup_steps=10", "certificate=false",
             "mdl.eval_every_steps=5"]
    par = result_of(run_job(job_config(tmp_path / "par", quick)))
    one = result_of(run_job(job_config(tmp_path / "one", [*quick, "training.parallel_models=1"])))
    assert par["mdl"]["block_ce_bits"] == one["mdl"]["block_ce_bits"]  # CPU default engine: loop, bitwise equal
    assert par["final"]["val_loss_curve"] == one["final"]["val_loss_curve"]
    assert [b["epochs"] for b in par["mdl"]["blocks"]] == [b["epochs"] for b in one["mdl"]["blocks"]]
    assert [b["block"] for b in par["mdl"]["blocks"]] == list(range(2, len(par["mdl"]["block_sizes"]) + 1))
    thr = result_of(run_job(job_config(tmp_path / "thr", [*quick, "training.workers=2"])))
    assert thr["mdl"]["block_ce_bits"] == one["mdl"]["block_ce_bits"]  # two worker threads: still bitwise
    assert thr["final"]["val_loss_curve"] == one["final"]["val_loss_curve"]
    blocks_only = [o for o in quick if not o.startswith("mdl.eval_every_steps")]  # the full run's cadence only
    stk = result_of(run_job(job_config(tmp_path / "stk", [*blocks_only, "training.engine=stacked",
                                                          "mdl.full_run=false"])))
    assert stk["mdl"]["block_ce_bits"] == pytest.approx(one["mdl"]["block_ce_bits"], rel=LOSS_RTOL)


@pytest.mark.parametrize("override, message", [("training.workers=0",
                                                r"training.workers=0 is not allowed: "
                                                r"training.workers must be auto or an integer"),
                                               ("training.fused_optimizer=maybe",
                                                r"training.fused_optimizer='maybe' is not allowed: "
                                                r"training.fused_optimizer must be one of"),
                                               ("training.engine=warp",
                                                r"training.engine='warp' is not allowed: "
                                                r"training.engine must be one of auto, loop")])
def test_bad_training_options_fail_before_any_data_is_loaded(tmp_path: Path, override: str, message: str) -> None:
    """cifar10 files are absent here: the option error must come first (nothing loaded or erased in vain)."""
    with pytest.raises(ValueError, match=message):
        run_job(job_config(tmp_path, ["dataset=cifar10", f"paths.data_dir={tmp_path}/none", override]))
