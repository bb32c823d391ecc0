"""Benchmark: one sweep run job-per-process (`make demo`'s way: hydra/launcher=parallel, 2 workers), packed
(hydra/launcher=packed hydra.launcher.inner=parallel, 2 workers) and packed with a pack group (training.pack_group=
true: each pack's seeds train in one lockstep group), side by side, each in a fresh out_dir (so each fits its
erasers once). Prints the wall times and their ratios to job-per-process, where the time went (summed from every job's
result.json `timings`), and checks every job's result.json is == between the two (exit 1 if not).

    .venv/bin/python -m tools.bench_sweep            # MNIST-5k, control/leace/qleace x seeds 0-4, quick MDL
    .venv/bin/python -m tools.bench_sweep --quick    # digits, tiny MDL, 2 erasers x 3 seeds: seconds
    .venv/bin/python -m tools.bench_sweep --repeats 3  # interleaved runs, medians (a shared machine is noisy)
    .venv/bin/python -m tools.bench_sweep --bucket   # and bucket workers: hydra.launcher.pack_by=shape, one
                                                       # bucket of the sweep's jobs per worker
    .venv/bin/python -m tools.bench_sweep --after-augment  # erase each training batch (the paper presets' way)

Each way also counts, from its jobs' run.log files, the eraser fits and what was read back from the disk cache or
taken from the process's pack (`cache_counts`): deterministic counts, not timings.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# wall times, dates, the stored config's pack size (unhashed, speed only) and whether this job or another of the
# sweep fitted the shared eraser (scheduling decides): the keys allowed to differ
VOLATILE = ("seconds", "timings.", "provenance.", "config.training.pack_size", "config.training.pack_group",
            "eraser.cache_hit")
FULL = ["experiment=demo", "logger=none", "progress=false"]  # demo's MNIST-5k, MLP, quick MDL
QUICK = ["experiment=smoke", "mdl.max_epochs=4", "logger=none", "progress=false"]


def flat(value: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flat(item, f"{prefix}{key}.").items()}
    if isinstance(value, list):
        return {k: v for i, item in enumerate(value) for k, v in flat(item, f"{prefix}{i}.").items()}
    return {prefix.rstrip("."): value}


def results(out_dir: Path) -> dict[str, dict[str, Any]]:
    """Every job's result.json under `out_dir`/runs, by job directory, flattened, its out_dir replaced by OUT."""
    out = {}
    for path in sorted((out_dir / "runs").rglob("result.json")):
        out[str(path.parent.relative_to(out_dir / "runs"))] = {
            k: v.replace(str(out_dir), "OUT") if isinstance(v, str) else v
            for k, v in flat(json.loads(path.read_text())).items()}
    return out


def differences(a: dict[str, dict[str, Any]], b: dict[str, dict[str, Any]]) -> list[str]:
    """Lines naming every job missing on one side and every key (but wall times) whose values are not ==."""
    out = [f"{job}: only in {'the first' if job in a else 'the second'} run" for job in sorted(set(a) ^ set(b))]
    for job in sorted(set(a) & set(b)):
        x, y = a[job], b[job]
        for key in sorted(set(x) | set(y)):
            if any(part in key for part in VOLATILE):
                continue
            if key not in x or key not in y:
                out.append(f"{job}: {key} only in {'the first' if key in x else 'the second'} run")
            elif x[key] != y[key]:
                out.append(f"{job}: {key} {x[key]!r} != {y[key]!r}")
    return out


CACHE_LINES = {  # what each job's run.log says about its eraser and erased data (training/data/cache.py,
    # training/inputs/erase.py)
    "fits": r"fitting eraser \w+ on",
    "erasers_read": r"cache hit: \S*/erasers/",
    "erasers_shared": r"cache hit \(shared in this process\): \S*/erasers/",
    "erased_read": r"cache hit: \S*/erased/",
    "erased_shared": r"cache hit \(shared in this process\): \S*/erased/",
}


def cache_counts(out_dir: Path) -> dict[str, int]:
    """Eraser fits, fitted erasers and erased data read from the disk cache or taken from the pack, over every
    job's run.log under `out_dir`/runs."""
    text = "".join(p.read_text(errors="replace") for p in sorted((out_dir / "runs").rglob("run.log")))
    return {name: len(re.findall(pattern, text)) for name, pattern in CACHE_LINES.items()}


def time_split(res: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The jobs' own time, summed: before MDL (data, eraser, certificates), of which erasing, MDL, full run."""
    keys = ("total_s", "before_mdl_s", "erase_s", "mdl_s", "full_run_s")
    return {k: sum(float(r[f"timings.{k}"] or 0.0) for r in res.values() if f"timings.{k}" in r) for k in keys}


def run_sweep(out_dir: Path, base: list[str], sweep: list[str], launcher: list[str]) -> float:
    cmd = [sys.executable, "-m", "training.run", "-m", *base, f"paths.out_dir={out_dir}", *sweep, *launcher]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "WANDB_MODE": "disabled"}
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stdout + proc.stderr)[-3000:]
        sys.exit(f"bench_sweep: {' '.join(cmd)} failed (exit {proc.returncode}):\n{tail}")
    return wall


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="digits, tiny MDL, control/leace x 3 seeds (seconds)")
    p.add_argument("--erasers", default=None, help="comma list (default control,leace,qleace; quick: control,leace)")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 5; quick: 3)")
    p.add_argument("--n-jobs", type=int, default=2, help="worker processes of both runs")
    p.add_argument("--pack-size", type=int, default=None, help="training.pack_size (default: seeds / 2, rounded up, "
                   "so the packs spread over the workers)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each, interleaved; medians are reported")
    p.add_argument("--no-pack-group", action="store_true", help="skip the packed run with training.pack_group=true")
    p.add_argument("--bucket", action="store_true", help="also run bucket workers (hydra.launcher.pack_by=shape: "
                   "every cell of one model shape in one process, the sweep cut into one bucket per worker)")
    p.add_argument("--after-augment", action="store_true", help="eraser.after_augment=true: each training batch "
                   "erased by the fitted eraser (every paper preset)")
    p.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = p.parse_args(argv)
    erasers = args.erasers or ("control,leace" if args.quick else "control,leace,qleace")
    seeds = args.seeds or (3 if args.quick else 5)
    pack_size = args.pack_size or math.ceil(seeds / 2)
    base = QUICK if args.quick else FULL
    sweep = [f"eraser={erasers}", f"seed={','.join(map(str, range(seeds)))}"]
    if args.after_augment:
        sweep.append("eraser.after_augment=true")
    launchers = {"per_process": ["hydra/launcher=parallel", f"hydra.launcher.n_jobs={args.n_jobs}"],
                 "packed": ["hydra/launcher=packed", "hydra.launcher.inner=parallel",
                            f"++hydra.launcher.inner_options.n_jobs={args.n_jobs}", f"training.pack_size={pack_size}"]}
    if not args.no_pack_group:
        launchers["pack_group"] = [*launchers["packed"], "training.pack_group=true"]
    if args.bucket:  # every job has one shape here: a bucket per worker
        per_worker = math.ceil(len(erasers.split(",")) * seeds / args.n_jobs)
        launchers["bucket"] = [*launchers["packed"][:-1], "hydra.launcher.pack_by=shape",
                               f"training.pack_size={per_worker}"]
    names = list(launchers)
    walls: dict[str, list[float]] = {name: [] for name in names}
    runs: dict[str, list[dict[str, dict[str, Any]]]] = {name: [] for name in names}
    counts: dict[str, dict[str, int]] = {}  # the first repeat's
    with tempfile.TemporaryDirectory(prefix="bench_sweep_") as tmp:
        for r in range(args.repeats):  # interleaved, the order rotating: a busy machine slows all alike
            for name in names[r % len(names):] + names[:r % len(names)]:
                out_dir = Path(tmp) / f"{name}{r}"
                walls[name].append(run_sweep(out_dir, base, sweep, launchers[name]))
                runs[name].append(results(out_dir))
                counts.setdefault(name, cache_counts(out_dir))
    a, b = runs["per_process"][0], runs["packed"][0]
    median = {name: statistics.median(walls[name]) for name in names}
    lone, packed = median["per_process"], median["packed"]
    jobs = len(a)
    print(f"sweep: {' '.join(base + sweep)}: {jobs} jobs, {args.n_jobs} workers, pack_size {pack_size}, "
          f"{args.repeats} repeat(s), medians")
    if args.repeats > 1:
        print("  each (s): " + "; ".join(f"{k} {', '.join(f'{w:.1f}' for w in v)}" for k, v in walls.items()))
    print(f"  job-per-process  {lone:7.1f} s")
    print(f"  packed           {packed:7.1f} s   {lone / packed:5.2f}x")
    if "pack_group" in median:
        print(f"  + pack group     {median['pack_group']:7.1f} s   {lone / median['pack_group']:5.2f}x  "
              "(training.pack_group=true: a pack's seeds in one lockstep group)")
    if "bucket" in median:
        print(f"  bucket workers   {median['bucket']:7.1f} s   {lone / median['bucket']:5.2f}x  "
              "(hydra.launcher.pack_by=shape: a worker runs every cell of one model shape)")
    split = {name: time_split(runs[name][0]) for name in names}  # the first repeat's
    print("  summed over jobs (s)  total  before-MDL  erase   MDL  full-run | outside jobs (workers x wall - total)")
    for name, wall in ((name, walls[name][0]) for name in names):
        s = split[name]
        print(f"  {name:<20} {s['total_s']:6.1f} {s['before_mdl_s']:10.1f} {s['erase_s']:6.1f} {s['mdl_s']:5.1f} "
              f"{s['full_run_s']:8.1f} | {args.n_jobs * wall - s['total_s']:6.1f}")
    print("  erasers (counts)     " + "  ".join(f"{k:>14}" for k in CACHE_LINES))
    for name in names:
        print(f"  {name:<20} " + "  ".join(f"{counts[name][k]:14d}" for k in CACHE_LINES))
    diff = [line for name in runs for other in runs[name] for line in differences(a, other)]
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"jobs": jobs, "n_jobs": args.n_jobs, "pack_size": pack_size,
                                         "per_process_s": lone, "packed_s": packed, "ratio": lone / packed,
                                         "medians": median,
                                         "walls": walls,
                                         "split": split, "cache_counts": counts, "equal": not diff}, indent=1))
    if not jobs or len(b) != jobs:
        print(f"FAIL: {jobs} and {len(b)} result.json files", file=sys.stderr)
        return 1
    if diff:
        print(f"FAIL: numbers differ in {len(diff)} places:\n  " + "\n  ".join(diff[:20]), file=sys.stderr)
        return 1
    print(f"  numbers: all {jobs} jobs' result.json == (wall times aside)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
