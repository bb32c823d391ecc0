"""Benchmark: one cell's seeds trained as one job (`seeds=N`) vs the same seeds as N one-seed jobs, each in its own
process (`seed=k`), interleaved (a shared machine's load hits every way alike), each way in a fresh out_dir (so each
fits its eraser) and one process at a time with the same threads (OMP_NUM_THREADS, default 1). Prints the wall times,
their ratios to the N processes and where the time went (summed from every job's result.json `timings`), and checks
that every seed's result.json is == across the ways (wall times, dates and the numerics signature's group size aside;
exit 1 if not). docs/speed.md ("The cell") has the measurements.

    .venv/bin/python -m tools.bench_sweep             # MNIST-5k MLP quick MDL (the demo's), leace, 5 seeds
    .venv/bin/python -m tools.bench_sweep --quick        # digits, tiny MDL, 3 seeds: seconds
    .venv/bin/python -m tools.bench_sweep --repeats 3    # interleaved runs, medians
    .venv/bin/python -m tools.bench_sweep --before ../old --before-way "name=ARGS"  # and an older checkout (its
                        # own venv or this python) running the seeds as one sweep, `-m seed=0,...,N-1 ARGS`
    .venv/bin/python -m tools.bench_sweep --demo --before ../old --demo-before-args "..."  # `make demo` before
                        # (with the launcher arguments of its Makefile) and after, two worker processes each
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.bench_worker import write_json

ROOT = Path(__file__).resolve().parents[1]
# wall times, dates, the code's commit and the group size in the numerics signature (how many models trained
# together: the way's choice)
VOLATILE = ("seconds", "timings.", "provenance.ended", "provenance.started", "provenance.code.",
            "provenance.numerics.models_together", "eraser.cache_hit")
SPEED_ONLY = "config.training."  # a key here in one checkout's stored config only: a speed option of its own
FULL = ["experiment=demo", "logger=none", "progress=false"]  # demo's MNIST-5k, MLP, quick MDL
QUICK = ["experiment=smoke", "mdl.max_epochs=4", "logger=none", "progress=false"]
DEMO = [["-m", "experiment=demo", "logger=none", "progress=false"],  # `make demo`'s two sweeps
        ["-m", "experiment=demo", "logger=none", "progress=false", "dataset.permute_labels=true", "seed=0"]]


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
    """Lines naming every job missing on one side and every key (but VOLATILE ones) whose values are not ==."""
    out = [f"{job}: only in {'the first' if job in a else 'the second'} run" for job in sorted(set(a) ^ set(b))]
    for job in sorted(set(a) & set(b)):
        x, y = a[job], b[job]
        for key in sorted(set(x) | set(y)):
            if any(part in key for part in VOLATILE):
                continue
            if key not in x or key not in y:
                if not key.startswith(SPEED_ONLY):
                    out.append(f"{job}: {key} only in {'the first' if key in x else 'the second'} run")
            elif x[key] != y[key]:
                out.append(f"{job}: {key} {x[key]!r} != {y[key]!r}")
    return out


def time_split(res: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The jobs' own time, summed: before MDL (data, eraser, certificates), of which erasing, MDL, full run."""
    keys = ("total_s", "before_mdl_s", "erase_s", "mdl_s", "full_run_s")
    return {k: sum(float(r[f"timings.{k}"] or 0.0) for r in res.values() if f"timings.{k}" in r) for k in keys}


def run_way(root: Path, commands: list[list[str]], out_dir: Path) -> float:
    """Run `commands` (each a `training.run` argument list) one after another in checkout `root` (with its own venv
    if it has one, else this python); the wall time."""
    venv = root / ".venv" / "bin" / "python"
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "WANDB_MODE": "disabled",
           "PYTHONPATH": str(root)}
    t0 = time.perf_counter()
    for args in commands:
        cmd = [str(venv) if venv.exists() else sys.executable, "-m", "training.run", *args, f"paths.out_dir={out_dir}"]
        proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            sys.exit(f"bench_sweep: {' '.join(cmd)} failed (exit {proc.returncode}):\n"
                     f"{(proc.stdout + proc.stderr)[-3000:]}")
    return time.perf_counter() - t0


def ways(args: argparse.Namespace) -> dict[str, tuple[Path, list[list[str]]]]:
    """name -> (checkout, its commands)."""
    if args.demo:  # as `make demo` runs them: two worker processes
        out = {"demo": (ROOT, [[*c, "hydra/launcher=parallel", "hydra.launcher.n_jobs=2"] for c in DEMO])}
        if args.before is not None:  # as the older checkout's Makefile ran them (--demo-before-args)
            out["demo_before"] = (args.before, [[*c, *args.demo_before_args.split()] for c in DEMO])
        return out
    base = (QUICK if args.quick else FULL) + [f"eraser={args.eraser}"]
    seeds = args.seeds or (3 if args.quick else 5)
    one_each = [["-m", *base, f"seed={k}"] for k in range(seeds)]
    out = {"cell": (ROOT, [["-m", *base, f"seeds={seeds}"]]), "processes": (ROOT, one_each)}
    if args.before is not None:
        for way in args.before_way:
            name, _, extra = way.partition("=")
            out[f"{name}_before"] = (args.before, [["-m", *base, f"seed={','.join(map(str, range(seeds)))}",
                                                   *extra.split()]])
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="digits, tiny MDL, 3 seeds (seconds)")
    p.add_argument("--eraser", default="leace")
    p.add_argument("--seeds", type=int, default=None, help="seeds 0..N-1 (default 5; quick: 3)")
    p.add_argument("--repeats", type=int, default=1, help="runs of each way, interleaved; medians are reported")
    p.add_argument("--demo", action="store_true", help="`make demo`'s two sweeps (needs --before to compare)")
    p.add_argument("--before", type=Path, default=None, help="an older checkout whose ways run beside this one's "
                   "(--demo: its `make demo`)")
    p.add_argument("--before-way", action="append", default=[], help="NAME=ARGS: the older checkout runs the seeds "
                   "as one sweep, `-m seed=0,...,N-1 ARGS` (repeat for more ways)")
    p.add_argument("--demo-before-args", default="hydra/launcher=parallel hydra.launcher.n_jobs=2",
                   help="--demo: the launcher arguments of the older checkout's `make demo`")
    p.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = p.parse_args(argv)
    todo = ways(args)
    names = list(todo)
    walls: dict[str, list[float]] = {name: [] for name in names}
    runs: dict[str, list[dict[str, dict[str, Any]]]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory(prefix="bench_sweep_") as tmp:
        for r in range(args.repeats):  # interleaved, the order rotating: a busy machine slows all alike
            for name in names[r % len(names):] + names[:r % len(names)]:
                out_dir = Path(tmp) / f"{name}{r}"
                root, commands = todo[name]
                walls[name].append(run_way(root, commands, out_dir))
                runs[name].append(results(out_dir))
    median = {name: statistics.median(walls[name]) for name in names}
    ref = "demo_before" if args.demo and "demo_before" in median else "processes" if "processes" in median else names[0]
    jobs = len(runs[names[0]][0])
    print(f"{'demo' if args.demo else 'cell'}: {jobs} seed results per way, {args.repeats} repeat(s) interleaved, "
          f"medians, OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS', '1')}, one process at a time")
    if args.repeats > 1:
        print("  each (s): " + "; ".join(f"{k} {', '.join(f'{w:.1f}' for w in v)}" for k, v in walls.items()))
    for name in names:
        print(f"  {name:<18} {median[name]:7.1f} s   {median[ref] / median[name]:5.2f}x  (vs {ref})")
    split = {name: time_split(runs[name][0]) for name in names}  # the first repeat's
    print("  summed over jobs (s)  total  before-MDL  erase   MDL  full-run")
    for name in names:
        s = split[name]
        print(f"  {name:<20} {s['total_s']:6.1f} {s['before_mdl_s']:10.1f} {s['erase_s']:6.1f} {s['mdl_s']:5.1f} "
              f"{s['full_run_s']:8.1f}")
    first = runs[names[0]][0]
    diff = [line for name in names for other in runs[name] for line in differences(first, other)]
    if args.json is not None:
        write_json(args.json, {"jobs": jobs, "medians": median, "walls": walls, "reference": ref,
                               "ratios": {n: median[ref] / median[n] for n in names}, "split": split,
                               "equal": not diff})
    if not jobs:
        print("FAIL: no result.json", file=sys.stderr)
        return 1
    if diff:
        print(f"FAIL: numbers differ in {len(diff)} places:\n  " + "\n  ".join(diff[:20]), file=sys.stderr)
        return 1
    print(f"  numbers: all {jobs} seed results' result.json == across the ways (wall times aside)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
