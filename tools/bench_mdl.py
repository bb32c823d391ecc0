"""Benchmark: one full prequential MDL (MLP-128, 9 block models, fixed epoch budget), ours vs a naive loop.

    .venv/bin/python -m tools.bench_mdl                       # CPU: small CIFAR-like data (see output)
    .venv/bin/python -m tools.bench_mdl --device cuda         # GPU: 50k×3×32×32, 5 seeds at once

"naive": one block model (and seed) after another, a Python loop over batches gathered from a float32 tensor on the
device, augmentation per batch, validation in eval mode every epoch, best state kept; torch uses all `--threads` for
each kernel. "ours": the harness's default config, the job's Trainer training all block models of all seeds in one
vectorised group (training/engine/group.py; on CPU `training.workers=auto`, a thread per core). `--fused` adds ours
with `training.fused_optimizer=true`. Same epochs, data, machine and cores; every measurement in a fresh subprocess
(peak memory per variant), variants interleaved, medians reported. On a GPU also the device's read and host→device
copy bandwidth for the float32 data, against one MLP-128 epoch.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.nn.functional as F

from models import build_model, make_optimizer
from tools.bench_worker import peak_mb, rss_mb, run_worker, write_json
from training.app import schema
from training.engine.augment import crop_flip
from training.engine.fit import TrainData, cross_entropy_sum, fit
from training.engine.group import GroupOptions, fit_group
from training.engine.seeding import generator, seeded_global_rng
from training.tasks.mdl.splits import make_split
from training.tasks.mdl.trainer import Trainer, split_of

NUM_CLASSES = 10
T = TypeVar("T")


def image_shape(d: int) -> tuple[int, int, int]:
    side = math.isqrt(d // 3)
    return (3, side, side) if 3 * side * side == d else (1, 1, d)


def synthetic(n: int, d: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """CIFAR-like control data: uint8 pixels / 255 with a class-dependent mean (learnable, not trivial)."""
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    proto = torch.rand(NUM_CLASSES, d, generator=g)
    x = (0.5 * torch.rand(n, d, generator=g) + 0.5 * proto[y]).mul_(255).round_().div_(255)
    return x.reshape(n, *image_shape(d)), y


def job_cfg(args: argparse.Namespace, seed: int) -> schema.JobConfig:
    """The typed config of one benchmark job: MLP 128x2 on the benchmark data, control eraser."""
    group, section = schema.group_config, schema.load_section
    return schema.JobConfig(
        seed=seed, arch=group("arch", "mlp", width=128, depth=2, base_width=128), eraser=group("eraser", "control"),
        dataset=group("dataset", "synthetic", augment=image_shape(args.d)[0] == 3),
        optim=section(schema.OptimConfig, {"lr": 5e-4, "beta1": 0.95, "warmup_steps": 10}),
        mdl=section(schema.MdlConfig, {"patience": args.epochs, "max_epochs": args.epochs, "stop_after_warmup": False}),
        training=section(schema.TrainingConfig, {}), regularizer=group("regularizer", "none"),
        logger=group("logger", "none"), paths=section(schema.PathsConfig, {}), progress=False)


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(device: torch.device, fn: Callable[[], T]) -> tuple[float, T]:
    """Seconds of `fn()` (the device synchronised before and after) and what it returned."""
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return time.perf_counter() - t0, out


# ---------------------------------------------------------------------------------------------- variants


LABELS = {"ours": "ours (default config)", "fused": "ours + training.fused_optimizer=true"}


def run_ours(args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> list[float]:
    """All block models of all seeds in one vectorised group, each with its own seed's split and validation."""
    members, coded = [], []
    data = y_dev = None
    for seed in range(args.seeds):
        cfg = job_cfg(args, seed)
        split = split_of(cfg.mdl, seed, len(y), NUM_CLASSES, tuple(x.shape[1:]))
        trainer = Trainer(cfg, x, y, NUM_CLASSES, split, device, data=data)
        data, y_dev = trainer.data, trainer.y
        for i in range(1, len(split.block_sizes)):
            members.append(trainer.member(split.prefix(i), ("block", i)))
            coded.append(split.block(i + 1).to(device))
    assert data is not None and y_dev is not None
    ce = [0.0] * len(members)

    def code(k: int, model: torch.nn.Module, res: Any) -> None:
        ce[k] = cross_entropy_sum(model, data.all(coded[k]), y_dev[coded[k]]) / len(coded[k]) / math.log(2)

    fit_group(members, TrainData(data, y_dev),
              GroupOptions(on_finish=code, compile=None, engine="auto", workers="auto", progress=False,
                           fused_optimizer=args.worker == "fused", rows=None, poll_every="auto"))
    return ce


def run_naive(args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> list[float]:
    x, y = x.to(device), y.to(device)
    augment = image_shape(args.d)[0] == 3
    ces = []
    for seed in range(args.seeds):
        cfg = job_cfg(args, seed)
        split, o = split_of(cfg.mdl, seed, len(y), NUM_CLASSES, tuple(x.shape[1:])), cfg.optim
        x_val, y_val = x[split.val_idx.to(device)], y[split.val_idx.to(device)]
        for i in range(1, len(split.block_sizes)):
            with seeded_global_rng(seed, "init", ("block", i)):
                model = build_model(cfg.arch, tuple(x.shape[1:]), NUM_CLASSES).to(device)
            opt = make_optimizer(model, lr=o.lr, beta1=o.beta1, beta2=o.beta2, weight_decay=o.weight_decay,
                                 warmup_steps=o.warmup_steps)
            gen = generator(seed, "batches", ("block", i))
            idx = split.prefix(i).to(device)
            xs, ys = x[idx], y[idx]
            best, best_state = math.inf, None
            for _ in range(args.epochs):
                model.train()
                opt.train()
                perm = torch.randperm(len(ys), generator=gen).to(device)
                for b in range(0, len(ys), o.batch_size):
                    bi = perm[b: b + o.batch_size]
                    xb = crop_flip(xs[bi], gen) if augment else xs[bi]
                    loss = F.cross_entropy(model(xb), ys[bi])
                    opt.zero_grad(set_to_none=True)
                    loss.backward()
                    opt.step()
                model.eval()
                opt.eval()
                with torch.no_grad():
                    val = float(F.cross_entropy(model(x_val).double(), y_val))
                if val < best:
                    best, best_state = val, {k: v.clone() for k, v in model.state_dict().items()}
            assert best_state is not None, "every validation loss was NaN"
            model.load_state_dict(best_state)
            coded = split.block(i + 1).to(device)
            with torch.no_grad():
                ces.append(float(F.cross_entropy(model(x[coded]).double(), y[coded])) / math.log(2))
    return ces


# ---------------------------------------------------------------------------------------------- measurement


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """One measurement in this (fresh) process; prints a JSON line."""
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    x, y = synthetic(args.n, args.d)
    if args.worker == "bandwidth":
        return bandwidth(args, x, y, device)
    run = {"ours": run_ours, "fused": run_ours, "naive": run_naive}[args.worker]
    # Warm-up on a slice of the data (imports, allocator, kernels): not part of the measurement.
    warm = argparse.Namespace(**{**vars(args), "epochs": 1})
    run(warm, x[:2400], y[:2400], device)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    base_rss = rss_mb()
    sync(device)
    t0, c0 = time.perf_counter(), time.process_time()
    ce = run(args, x, y, device)
    sync(device)
    seconds, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    return {"variant": args.worker, "seconds": seconds, "cpu_s": cpu_s, "mean_ce_bits": statistics.fmean(ce),
            "models": len(ce), "peak_mb": peak_mb(device.type == "cuda"), "rss_before_mb": base_rss}


def epoch_seconds(trainer: Trainer, idx: torch.Tensor, k: int, models: int, options: GroupOptions | None) -> float:
    """Seconds of `k` epochs of `models` fresh models on rows `idx`, at the job's fit settings without warm-up, early
    stopping or progress: one model by fit() (as a job trains one) when `options` is None, else one fit_group (the
    GPU report's throughput step measures with it too)."""
    members = []
    for j in range(models):
        m = trainer.member(idx, ("epoch", j))
        members.append(dataclasses.replace(m, cfg=dataclasses.replace(
            m.cfg, patience=k, max_epochs=k, progress=False, warmup_steps=0, min_steps=0, patience_min_steps=0)))
    data = trainer.train_set()
    return timed(trainer.device, lambda: fit(members[0], data, trainer.regularizer) if options is None
                 else fit_group(members, data, options))[0]


def bandwidth(args: argparse.Namespace, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> dict[str, Any]:
    """Time to read the float32 data once on the device, to copy it host→device, and one MLP-128 epoch."""

    def median_s(fn: Callable[[], Any], reps: int = 5) -> float:
        timed(device, fn)  # warm-up
        return statistics.median(timed(device, fn)[0] for _ in range(reps))

    xf = x.to(device)
    pinned = x.pin_memory() if device.type == "cuda" else x
    read_s = median_s(lambda: xf.sum())
    h2d_s = median_s(lambda: pinned.to(device, non_blocking=True)) if device.type == "cuda" else float("nan")
    out: dict[str, Any] = {"variant": "bandwidth", "bytes": xf.numel() * 4, "read_s": read_s, "h2d_s": h2d_s}
    cfg = job_cfg(args, 0)
    split = make_split(len(y), 0, val_size=64, val_frac=0.01, num_blocks=2, min_block=64)
    trainer = Trainer(cfg, x, y, NUM_CLASSES, split, device)
    opts = GroupOptions(compile=None, engine="auto", progress=False, workers=1, fused_optimizer=False,
                        rows=None, poll_every="auto")
    rows = torch.arange(len(y))
    epoch_seconds(trainer, rows, 1, 1, opts)  # warm-up
    for seeds in sorted({1, args.seeds}):  # per epoch, start-up cost removed
        out[f"epoch_s_{seeds}"] = (epoch_seconds(trainer, rows, 3, seeds, opts)
                                   - epoch_seconds(trainer, rows, 1, seeds, opts)) / 2
    out["peak_mb"] = peak_mb(device.type == "cuda")
    return out


def spawn(args: argparse.Namespace, variant: str) -> dict[str, Any]:
    payload = {k: getattr(args, k) for k in ("device", "n", "d", "epochs", "seeds", "threads")} | {"worker": variant}
    return run_worker(__file__, payload, threads=str(args.threads), label=f"{variant} worker")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="auto", help="auto | cpu | cuda")
    p.add_argument("--n", type=int, default=None, help="samples (default: 50000 on GPU, 8000 on CPU)")
    p.add_argument("--d", type=int, default=None, help="input features, 3·s² gives 3×s×s images "
                   "(default: 3072 = 3×32×32 on GPU, 768 = 3×16×16 on CPU)")
    p.add_argument("--epochs", type=int, default=None, help="epochs per block model (default: 5 GPU, 20 CPU)")
    p.add_argument("--seeds", type=int, default=None, help="seeds (jobs) trained at once (default: 5 GPU, 1 CPU)")
    p.add_argument("--repeats", type=int, default=5, help="interleaved repeats; medians are reported")
    p.add_argument("--threads", type=int, default=None,
                   help="torch threads = cores used (default: all cores, up to 8 on GPU). Naive: intra-op threads; "
                   "ours: training.workers=auto uses one worker thread per core on CPU")
    p.add_argument("--fused", action="store_true",
                   help="also measure ours with training.fused_optimizer=true (one-kernel optimizer step)")
    p.add_argument("--json", default=None, help="also write the measurements (medians, ratios, bandwidth) here")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)  # JSON: the worker's arguments
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(argparse.Namespace(**json.loads(args.worker)))))
        return
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    gpu = args.device.startswith("cuda")
    args.n = args.n or (50_000 if gpu else 8000)
    args.d = args.d or (3072 if gpu else 768)
    args.epochs = args.epochs or (5 if gpu else 20)
    args.seeds = args.seeds or (5 if gpu else 1)
    args.threads = args.threads or min(8 if gpu else 64, len(os.sched_getaffinity(0)))

    shape = image_shape(args.d)
    print(f"bench_mdl: MLP-128 (depth 2, μP), 10 blocks → 9 block models × {args.seeds} seed(s), {args.epochs} epochs "
          f"each (no early stopping), batch 128, augmentation {'on' if shape[0] == 3 else 'off'}")
    print(f"data: synthetic CIFAR-like uint8/255 control data, {args.n} × {'×'.join(map(str, shape))}"
          + ("" if gpu else " (smaller than CIFAR's 50000 × 3×32×32 because this is a CPU run)"))
    print(f"device: {args.device}" + ("" if gpu else f", {args.threads} torch thread(s), {os.cpu_count()} cores")
          + "; ours: engine auto, workers auto, compile off")
    variants = ["naive", "ours"] + (["fused"] if args.fused else [])
    rows: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    for r in range(args.repeats):
        for variant in variants if r % 2 == 0 else variants[::-1]:
            res = spawn(args, variant)
            rows[variant].append(res)
            print(f"  repeat {r + 1}/{args.repeats} {variant:5s}: {res['seconds']:7.2f} s wall, {res['cpu_s']:7.2f} "
                  f"s CPU, peak {res['peak_mb']:.0f} MB, mean CE {res['mean_ce_bits']:.4f} bits", flush=True)
    med = {v: statistics.median(x["seconds"] for x in rs) for v, rs in rows.items()}
    mem = "GPU max_memory_allocated" if gpu else "process peak RSS (ru_maxrss)"
    for v in variants[1:]:
        ratios = [n["seconds"] / o["seconds"] for n, o in zip(rows["naive"], rows[v], strict=True)]
        cpu_ratios = [n["cpu_s"] / o["cpu_s"] for n, o in zip(rows["naive"], rows[v], strict=True)]
        print(f"{LABELS[v]}: median naive {med['naive']:.2f} s, {v} {med[v]:.2f} s → speed-up "
              f"{med['naive'] / med[v]:.2f}×; median of paired ratios {statistics.median(ratios):.2f}× "
              f"({', '.join(f'{q:.2f}' for q in ratios)}); process CPU time ratio "
              f"{statistics.median(cpu_ratios):.2f}× ({', '.join(f'{q:.2f}' for q in cpu_ratios)})")
    print(f"peak memory ({mem}): " + ", ".join(
        f"{v} {statistics.median(x['peak_mb'] for x in rows[v]):.0f} MB" for v in variants))
    # what --json writes (`make bench`: outputs/bench/bench_mdl.json; `make plan` reads median_s, seeds and the sizes,
    # the GPU report's bench_mdl step speedup and bandwidth)
    summary: dict[str, Any] = {
        "device": args.device, "n": args.n, "d": args.d, "epochs": args.epochs, "seeds": args.seeds,
        "repeats": args.repeats, "threads": args.threads, "median_s": med,
        "speedup": {v: med["naive"] / med[v] for v in variants[1:]},
        "peak_mb": {v: statistics.median(x["peak_mb"] for x in rows[v]) for v in variants}, "runs": rows}
    if gpu:
        bw = spawn(args, "bandwidth")
        gb = bw["bytes"] / 1e9
        print(f"read float32 data once on the GPU: {bw['read_s'] * 1e3:.2f} ms ({gb / bw['read_s']:.0f} GB/s); "
              f"host→device copy (pinned): {bw['h2d_s'] * 1e3:.2f} ms ({gb / bw['h2d_s']:.1f} GB/s)")
        for key in sorted(k for k in bw if k.startswith("epoch_s_")):
            s = bw[key]
            print(f"one epoch, {key.removeprefix('epoch_s_')} MLP-128 model(s) at once: {s * 1e3:.1f} ms = "
                  f"{s / bw['read_s']:.1f}× the device read, {s / bw['h2d_s']:.2f}× the host→device copy")
        print(f"bandwidth worker peak GPU memory: {bw['peak_mb']:.0f} MB")
        summary["bandwidth"] = {**bw, "read_gbps": gb / bw["read_s"], "h2d_gbps": gb / bw["h2d_s"],
                                "epoch_over_read": bw["epoch_s_1"] / bw["read_s"]}
    if args.json:
        write_json(Path(args.json), summary)

if __name__ == "__main__":
    main()
