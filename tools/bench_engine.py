"""Engine counts on CPU: deterministic counts, not timings, that predict how the training step behaves on a GPU.

    .venv/bin/python -m tools.bench_engine --json outputs/bench/bench_engine.json [--quick]

Host reads (`syncs_per_step`, goal 0: `.item()`/`float(t)`, `nonzero`, `unique`, `masked_select`, `equal`, boolean-mask
indexing, `Tensor.tolist()`) and host-made tensors (`uploads_by_path`) per training step on each path, counted by a
TorchDispatchMode as (a run of 2S steps − a run of S steps) / S; aten ops and Python calls per step of the stacked
engine for 1 and 64 models (`ops_per_step`, `py_calls_per_step`); graph breaks of the stacked step per architecture;
host reads per validation epoch; and, from the demo's cells trained here (a few minutes), the share of row-steps that
do work (`occupancy*`) and the validation calls (`validations*`) when their block models go through refilled rows.
docs/speed.md ("The engine, counted") defines each figure; tests/test_engine_counts.py asserts its goals.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import sys
import tempfile
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import erasure
from models import build_model, make_optimizer
from tools.bench_worker import job_config, write_json
from training.app.schema import group_config
from training.engine.backends import StackedEngine
from training.engine.batches import DeviceData
from training.engine.fit import FitConfig, Member, TrainData, fit
from training.engine.group import GroupOptions, fit_group
from training.engine.lockstep_state import replay
from training.engine.numerics import JobNumerics
from training.engine.seeding import generator, seeded_global_rng
from training.inputs.erase import BatchEraser
from training.tasks.mdl.job import run_job

SHAPE, K = (3, 8, 8), 4
SYNC_OPS = {"_local_scalar_dense", "nonzero", "unique", "_unique", "_unique2", "unique_dim", "unique_consecutive",
            "masked_select", "equal", "is_nonzero"}
BOOL_INDEX_OPS = {"index", "index_put", "index_put_", "_index_put_impl_"}
UPLOAD_OPS = {"lift_fresh"}


class Counting(TorchDispatchMode):
    """Every aten op dispatched while active, by name; `syncs` and `uploads` as defined above."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter[str] = Counter()
        self.syncs = self.uploads = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        name = func.overloadpacket.__name__
        self.ops[name] += 1
        self.syncs += name in SYNC_OPS or (name in BOOL_INDEX_OPS and len(args) >= 2 and any(
            isinstance(t, torch.Tensor) and t.dtype == torch.bool for t in (args[1] or ())))
        self.uploads += name in UPLOAD_OPS
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def counting() -> Iterator[Counting]:
    """The dispatch mode, and `Tensor.tolist` counted as a sync (it reads the data without dispatching)."""
    mode = Counting()
    tolist = torch.Tensor.tolist

    def counted(self: torch.Tensor) -> Any:
        mode.syncs += 1
        return tolist(self)

    torch.Tensor.tolist = counted  # type: ignore[method-assign, assignment]
    try:
        with mode:
            yield mode
    finally:
        torch.Tensor.tolist = tolist  # type: ignore[method-assign]


@contextlib.contextmanager
def python_calls() -> Iterator[list[int]]:
    """Python (and builtin) function calls made while active: the host's work, deterministic."""
    box = [0]

    def prof(frame: Any, event: str, arg: Any) -> None:
        if event in ("call", "c_call"):
            box[0] += 1

    sys.setprofile(prof)
    try:
        yield box
    finally:
        sys.setprofile(None)


def _data(n: int = 160) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    y = torch.arange(n) % K
    x = torch.rand(n, *SHAPE, generator=g) * 0.7
    x[:, 0, :4] += 0.1 * (y[:, None, None] % 2)
    x = (x * 255).round() / 255
    return DeviceData(x), y, x[:32].clone(), y[:32].clone()


def _arch(name: str) -> Any:
    extra: dict[str, Any] = {"stages": 3} if name == "swin" else {}
    width = 8 if name in ("convnext", "swin") else 16
    return group_config("arch", name, width=width, depth=1, base_width=width, **extra)


def _model(arch: str, tag: int, shape: tuple[int, ...] = SHAPE) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    with seeded_global_rng(0, "init", tag):
        model = build_model(_arch(arch), shape, K)
    return model, make_optimizer(model, lr=1e-3, beta1=0.9, beta2=0.999, weight_decay=0.0, warmup_steps=3)


ERASER_OF_PATH = {"erase": "qleace", "linear": "leace"}  # a path's per-batch eraser: quadratic, linear


def _run(path: str, models: int, steps: int, *, arch: str = "mlp", bs: int = 8, epochs: int = 1) -> None:
    """Train `models` models for `epochs` epochs of `steps` steps (batch `bs`) on `path`: fit | loop | stacked, with
    "+augment" (crop/flip) and/or "+erase" (per-batch QLEACE) or "+linear" (per-batch LEACE), "+cl" (channels_last)."""
    kind, *extras = path.split("+")
    data, y, xv, yv = _data()
    eraser = next((ERASER_OF_PATH[e] for e in extras if e in ERASER_OF_PATH), None)
    transform = None if eraser is None else BatchEraser(erasure.fit(eraser, data.all(), y))
    cfg = FitConfig(batch_size=bs, patience=5, max_epochs=epochs, augment="augment" in extras, eval_every_steps=None,
                    progress=False, warmup_steps=0, min_steps=0, patience_min_steps=0, lr_schedule="constant",
                    stopping="patience", batch_order="shuffled", batch_transform=transform,
                    numerics=JobNumerics(channels_last=True) if "cl" in extras else None)
    members = []
    for k in range(models):
        m, o = _model(arch, k)
        members.append(Member(m, o, torch.arange(32, 32 + steps * bs), generator(0, "b", k), cfg, name=f"m{k}"))
    inputs = TrainData(data, y, xv, yv)
    if kind == "fit":
        for member in members:
            fit(member, inputs)
        return
    # polled at each epoch end (the one epoch's end): both runs end at their last step, the poll cancels
    fit_group(members, inputs, GroupOptions(engine=kind, progress=False, compile=None, fused_optimizer=False,
                                            workers=1, rows=None, poll_every=1))


def per_step(measure: Callable[[int], float], steps: int = 4) -> float:
    """(measure(2·steps) − measure(steps)) / steps: what one more step costs."""
    return (measure(2 * steps) - measure(steps)) / steps


def _dispatch_counts(path: str, models: int, steps: int, arch: str = "mlp", epochs: int = 1) -> Counting:
    _run(path, models, 1, arch=arch)  # warm-up: lazy imports and caches out of the counted runs
    with counting() as mode:
        _run(path, models, steps, arch=arch, epochs=epochs)
    return mode


def syncs_per_validation(paths: list[str], models: int = 3, steps: int = 4) -> dict[str, float]:
    """Host reads of one more epoch (its validation of every model, the epoch end and, in a group, the host's poll
    of the done vector): a run of 2 epochs − a run of 1 (training steps read nothing back)."""
    return {p: float(_dispatch_counts(p, models, steps, epochs=2).syncs - _dispatch_counts(p, models, steps).syncs)
            for p in paths}


def syncs(paths: list[str], models: int = 3, steps: int = 4) -> tuple[dict[str, float], dict[str, float]]:
    """Host reads and uploads per step on each path (a run of 2·steps steps − a run of `steps`, / steps)."""
    out, up = {}, {}
    for path in paths:
        arch = "lenet" if "augment" in path or path.endswith("+cl") else "mlp"
        two, one = (_dispatch_counts(path, models, s, arch) for s in (2 * steps, steps))
        out[path], up[path] = (two.syncs - one.syncs) / steps, (two.uploads - one.uploads) / steps
    return out, up


def ops(models: list[int], path: str = "stacked") -> tuple[dict[str, float], dict[str, float]]:
    def calls(m: int, s: int) -> float:
        _run(path, m, 1)
        with python_calls() as box:
            _run(path, m, s)
        return box[0]

    n_ops = {str(m): per_step(lambda s, m=m: float(sum(_dispatch_counts(path, m, s).ops.values())))  # type: ignore[misc]
             for m in models}
    n_calls = {str(m): per_step(lambda s, m=m: calls(m, s)) for m in models}  # type: ignore[misc]
    return n_ops, n_calls


def step_callable(arch: str, models: int = 2, shape: tuple[int, ...] = (3, 16, 16)) -> tuple[Callable, tuple]:
    """The stacked engine's training step for `models` tiny models of `arch` and the arguments of one step."""
    pairs = [_model(arch, k, shape) for k in range(models)]
    engine = StackedEngine([m for m, _ in pairs], [o for _, o in pairs])
    engine.__enter__()
    engine.train()
    bs = 4
    xb, yb, wb = torch.rand(models, bs, *shape), torch.randint(0, K, (models, bs)), torch.ones(models, bs)
    done = torch.zeros(models, dtype=torch.bool)  # the group's done vector (training/engine/stopping.py RowStopping)
    return engine.step, (xb, yb, wb, [bs] * models, np.zeros(models, dtype=np.int64), done)


def graph_breaks(archs: list[str]) -> dict[str, int]:
    import torch._dynamo

    out = {}
    for arch in archs:
        fn, args = step_callable(arch)
        torch._dynamo.reset()
        explained = torch._dynamo.explain(fn)(*args)
        out[arch] = int(explained.graph_break_count)
        reasons = sorted({str(b.reason).splitlines()[0][:120] for b in explained.break_reasons})
        print(f"  {arch}: {out[arch]} graph breaks; reasons: {reasons[:4]}", flush=True)
    torch._dynamo.reset()
    return out


def occupancy_of(steps: list[list[int]], sizes: list[list[int]], rows: int | None = None, poll: int = 1) -> float:
    """Σ steps / (rows × the group's steps) over groups, each group's models (their steps, training-set sizes)
    through `rows` refilled rows (None: a row per model, held until the longest model stops), polled every `poll`
    steps."""
    scheds = [replay(s, z, rows, poll) for s, z in zip(steps, sizes, strict=True) if s]
    held = sum(s.rows * s.steps for s in scheds)
    return sum(s.work for s in scheds) / held if held else math.nan


def validations_of(steps: list[list[int]], sizes: list[list[int]], every: list[list[int]], rows: int | None = None,
                   poll: int = 1) -> tuple[int, int]:
    """(steps with a validation, steps) summed over groups: each a validation call of its own (a group per job
    validates apart from the others, even at the same step). `every`: each model's steps per epoch."""
    scheds = [replay(s, z, rows, poll, e) for s, z, e in zip(steps, sizes, every, strict=True) if s]
    return sum(s.validations for s in scheds), sum(s.steps for s in scheds)


def demo_steps(cells: list[str], out_dir: Path) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
    """The block models' steps, training-set sizes and steps per epoch of each demo cell (`eraser:seed`), trained
    here (one job per cell)."""
    groups, sizes, every = [], [], []
    for cell in cells:
        eraser, seed = cell.split(":")
        run_job(job_config([f"paths.out_dir={out_dir}", "logger=none", "progress=false", "experiment=demo",
                            f"eraser={eraser}", f"seed={seed}"]))
        result = next(p for p in out_dir.rglob("result.json") if f"seed{seed}" in str(p) and eraser in str(p))
        res = json.loads(result.read_text())
        full = res.get("full") or {}
        steps = [int(b["steps"]) for b in res["mdl"]["blocks"]]
        groups.append(steps + ([int(full["steps"])] if "steps" in full else []))
        sizes.append([int(b["train_size"]) for b in res["mdl"]["blocks"]]
                     + ([int(res["mdl"]["blocks"][-1]["train_size"]) + 1] if "steps" in full else []))  # full: largest
        every.append([int(b["steps"]) // int(b["epochs"]) for b in res["mdl"]["blocks"]]
                     + ([int(full["steps"]) // int(full["epochs"])] if "steps" in full else []))
        print(f"  demo {cell}: block models' steps {groups[-1]}, training sets {sizes[-1]}, steps per epoch "
              f"{every[-1]}", flush=True)
    return groups, sizes, every


PATHS = ["fit", "loop", "stacked", "fit+augment", "loop+augment", "stacked+augment", "fit+erase", "loop+erase",
         "stacked+erase", "fit+linear", "fit+augment+cl", "loop+augment+cl"]


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", type=Path, help="write the counts here")
    ap.add_argument("--quick", action="store_true", help="no graph-break count of convnext/swin, no demo cells")
    ap.add_argument("--rows", type=int, default=None,
                    help="rows the cells' models share for `occupancy` (default: one cell's number of models)")
    ap.add_argument("--poll", type=int, default=16,
                    help="`occupancy_polled`, `validations_polled`: the host polls the done vector every this many "
                         "steps (training.poll_every)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print("syncs per step (dispatch counts, 3 models):", flush=True)
    by_path, uploads = syncs(PATHS)
    for p in PATHS:
        print(f"  {p:18s} syncs {by_path[p]:6.2f}  uploads {uploads[p]:6.2f}", flush=True)
    print("ops per step of the stacked engine (1 and 64 models):", flush=True)
    n_ops, n_calls = ops([1, 64])
    loop_ops, _ = ops([1, 64], "loop")
    print(f"  aten ops {n_ops}, python calls {n_calls}; loop engine aten ops {loop_ops}", flush=True)
    per_validation = syncs_per_validation(["loop", "stacked"])
    print(f"host reads per epoch of 3 models (their validation, the epoch end, the poll): {per_validation}", flush=True)
    print("graph breaks in the stacked engine's step:", flush=True)
    archs = ["mlp", "lenet"] if args.quick else ["mlp", "lenet", "convnext", "swin"]
    breaks = graph_breaks(archs)
    report = {"device": "cpu", "syncs_per_step": max(by_path.values()), "syncs_by_path": by_path,
              "uploads_by_path": uploads, "ops_per_step": n_ops, "py_calls_per_step": n_calls,
              "loop_ops_per_step": loop_ops, "graph_breaks": breaks, "occupancy": None, "occupancy_rows": None,
              "occupancy_before": None, "occupancy_by_rows": {}, "occupancy_steps": [],
              "syncs_per_validation": per_validation}
    if not args.quick:
        print("occupancy on the demo's cells:", flush=True)
        with tempfile.TemporaryDirectory() as tmp:
            steps, sizes, every = demo_steps(["control:0", "control:1", "control:2"], Path(tmp))
        rows = args.rows or max(len(s) for s in steps)
        one = [sum(steps, [])], [sum(sizes, [])], [sum(every, [])]  # the cells' models through shared rows
        r = report
        r.update(occupancy=occupancy_of(*one[:2], rows), occupancy_rows=rows, occupancy_steps=steps,
                 occupancy_before=occupancy_of(steps, sizes),
                 occupancy_by_rows={str(k): occupancy_of(steps, sizes, k) for k in range(1, max(map(len, steps)) + 1)},
                 occupancy_polled=occupancy_of(*one[:2], rows, args.poll), poll=args.poll,
                 validations_before=validations_of(steps, sizes, every), validations=validations_of(*one, rows),
                 validations_polled=validations_of(*one, rows, args.poll), validations_one_group=validations_of(*one))
        print(f"  before (each job a row per model) {r['occupancy_before']:.3f}; after (the cells' "
              f"{sum(map(len, steps))} models through {rows} refilled rows) {r['occupancy']:.3f}; one job through N "
              f"rows {r['occupancy_by_rows']}", flush=True)
        print(f"  polled every {args.poll} steps: occupancy {r['occupancy_polled']:.3f}; validation calls, steps (each "
              f"job its own group / shared refilled rows / polled / one group, a row each): {r['validations_before']} "
              f"/ {r['validations']} / {r['validations_polled']} / {r['validations_one_group']}", flush=True)
    if args.json is not None:
        write_json(args.json, report)
        print(f"wrote {args.json}")
    return report


if __name__ == "__main__":
    main()
