"""`make gpu-report`: every GPU check in one process; all figures in one JSON file plus a markdown summary.

    python3 scripts/gpu_report.py --out "$OUT"                 # on the GPU machine (installs .whl/ if needed)
    .venv/bin/python scripts/gpu_report.py                      # no CUDA here: the same steps on CPU, toy sizes
    python3 scripts/gpu_report.py --steps erasers,bench_mdl --out "$OUT"   # a second call: what the first skipped

Writes `<out>/gpu_report.json`, `<out>/gpu_report.md` and one log per subprocess under `<out>/logs/`. Both
files are rewritten after every step (and before it: a step the report dies in reads "failed: did not
finish", steps after it "skipped: not reached"), so a killed run loses nothing it finished. A step that fails
records its one-line error and the tail of its output, and the next step runs. Each step has its own time
budget (`--budget` caps the whole run: a step gets at most what is left).

Steps, in priority order (groups in brackets; `--steps`/`--skip` take step or group names). On a GPU the whole
report has a default budget of 540 s (one 10-minute device call with its start); steps it does not reach are
listed as skipped, with the reason:
  tests [tests]              pytest -m gpu (GPU: gpu-marked tests that skip count as failures; --pytest-m)
  job_<arch> [jobs]          one `python -m training.run` MDL job per architecture at the paper's base size on
                             CIFAR-shaped synthetic data (50 000 × 3×32×32, 10 classes), capped epochs
  throughput [speed]         samples/s per architecture through the job's own paths: one model by fit() (as a job
                             trains it), the vectorised group by fit_group (where the job vectorises), eval
  cell [sweep]               one MLP cell, 5 seeds: 5 one-seed `training.run` processes at once vs one job of the
                             cell (seeds=5): wall times, ratio, memory, and the numbers against the numerics
                             contract's tolerance (largest deviation vs seed SD)
  erasers_device [erasers]   LEACE, QLEACE, ALF-QLEACE fitted in float64 on the device vs CPU: max |Δ| erased
  bench_mdl [speed]          scripts/bench_mdl.py: ours vs the naive loop, device read bandwidth vs an MLP epoch
  bench_erasers_device, bench_erasers_cpu_reference [erasers]
                             scripts/bench_erasers.py: ours on the device beside concept-erasure's float64 CPU fit
  sweep_cost [sweep]         per architecture: GPU-seconds per epoch per job, memory per job, jobs per GPU
                             (by memory, and measured: aggregate samples/s of 1, 2, 4 processes at once)

Without CUDA (or with --toy) every step runs on CPU at toy sizes in about a minute, so the path is known to
work before a GPU sees it (tests/test_gpu_report.py runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if not __package__:  # run as a plain script (the GPU machine installs nothing): its pieces are this checkout's
    sys.path.insert(0, str(ROOT))
# before any import below: they reach training/ (hydra, omegaconf, mup), absent on the bare GPU machine
from scripts.gpu_report_bootstrap import bootstrap  # noqa: E402

BOOTSTRAP = bootstrap()

from scripts.gpu_report_env import ensure_packages, environment  # noqa: E402
from scripts.gpu_report_model import Report, as_json  # noqa: E402
from scripts.gpu_report_output import JSON_NAME, MD_NAME, now, write_report  # noqa: E402
from scripts.gpu_report_pack import step_cell  # noqa: E402
from scripts.gpu_report_pytest import step_tests  # noqa: E402
from scripts.gpu_report_runner import Context, Killed, Step, run_steps  # noqa: E402
from scripts.gpu_report_sizes import ARCHS, GPU, TOY, Sizes  # noqa: E402
from scripts.gpu_report_steps import (  # noqa: E402
    make_job_step,
    step_bench_erasers_cpu,
    step_bench_erasers_device,
    step_bench_mdl,
    step_erasers_device,
    step_sweep_cost,
    step_throughput,
)

DEFAULT_BUDGET = 540.0  # GPU mode: one 10-minute device call less the wheels' install and start-up


def all_steps(sizes: Sizes) -> list[Step]:
    """In priority order: a budget that runs out skips the last ones (--budget; GPU default DEFAULT_BUDGET)."""
    t = sizes.timeouts
    return [
        Step("tests", "tests", step_tests, t["tests"], "test suite (gpu-marked tests included on CUDA)"),
        *[Step(f"job_{a}", "jobs", make_job_step(a), t["job"], f"one MDL job, {a}, base size, synthetic CIFAR shape")
          for a in ARCHS],
        Step("throughput", "speed", step_throughput, t["throughput"],
             "train/eval samples/s per architecture: one model (fit) and the vectorised group"),
        Step("cell", "sweep", step_cell, t["cell"], "5 seeds: 5 one-seed processes at once vs one job of the cell"),
        Step("erasers_device", "erasers", step_erasers_device, t["erasers_device"],
             "LEACE/QLEACE/ALF-QLEACE float64 fit on the device vs CPU"),
        Step("bench_mdl", "speed", step_bench_mdl, t["bench_mdl"], "scripts/bench_mdl.py: ours vs naive, bandwidth"),
        Step("bench_erasers_device", "erasers", step_bench_erasers_device, t["bench_erasers_device"],
             "scripts/bench_erasers.py, ours on the device"),
        Step("sweep_cost", "sweep", step_sweep_cost, t["sweep_cost"], "GPU-s per epoch per job, jobs per GPU"),
        Step("bench_erasers_cpu_reference", "erasers", step_bench_erasers_cpu, t["bench_erasers_cpu_reference"],
             "scripts/bench_erasers.py, concept-erasure float64 on CPU"),
    ]


def select(steps: list[Step], only: str | None, skip: str | None) -> list[Step]:
    def names(spec: str | None) -> set[str]:
        return {s.strip() for s in (spec or "").split(",") if s.strip()}

    want, drop = names(only), names(skip)
    known = {s.name for s in steps} | {s.group for s in steps}
    if unknown := (want | drop) - known:
        raise SystemExit(f"gpu_report: unknown step(s) {sorted(unknown)}; known: {sorted(known)}")
    return [s for s in steps if (not want or s.name in want or s.group in want) and not {s.name, s.group} & drop]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or "outputs/gpu_report",
                   help="output folder (default: $OUT if set, else outputs/gpu_report)")
    p.add_argument("--device", default="auto", help="auto | cuda | cuda:N | cpu (auto: cuda when available)")
    p.add_argument("--toy", action="store_true", help="toy sizes even on a GPU (default without CUDA)")
    p.add_argument("--steps", help="only these steps or groups (comma-separated)")
    p.add_argument("--skip", help="leave out these steps or groups")
    p.add_argument("--budget", type=float, default=None,
                   help=f"seconds for the whole report: a step gets at most what is left, and is skipped when under "
                   f"30 s are left (default on a GPU: {DEFAULT_BUDGET:.0f}, one 10-minute device call with its start; "
                   f"toy mode: none)")
    p.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every step's own time budget")
    p.add_argument("--pytest-m", default="gpu", help='GPU mode: the tests step\'s marker expression (default '
                   '"gpu": the tests that need CUDA, within one call; "not slurm": the whole suite, slow tests '
                   'included, in a call of its own)')
    p.add_argument("--commit", default=None, help="the commit to record where this machine has no .git")
    p.add_argument("--job-override", action="append", default=[], help="extra training.run override for the "
                   "architecture jobs (repeatable), e.g. mdl.max_epochs=3")
    p.add_argument("--work", default=None, help="scratch folder (default: a temp dir; eraser cache, flags)")
    p.add_argument("--previous", action="append", default=[], metavar="JSON",
                   help="an earlier report (another device call) whose finished steps sweep_cost may use")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="join reports of several device calls (later files "
                   "win per step) into --out/gpu_report.{json,md}, then exit")
    p.add_argument("--list", action="store_true", help="list the steps and exit")
    return p.parse_args(argv)


def merge(paths: list[str], out: Path) -> int:
    """One report from several (the device allows 10 minutes a call): steps in order of first appearance, each
    from the last report that ran it (not "not reached"); env and mode from the first; all runs listed."""
    reports = [Report.from_json(json.loads(Path(p).read_text())) for p in paths]
    merged = dataclasses.replace(reports[0], steps={}, merged_from=[
        {"path": p, "started": r.started, "argv": r.argv, "device": as_json(r.env.device),
         "commit": r.env.git.commit} for p, r in zip(paths, reports, strict=True)])
    for r in reports:
        for name, rec in r.steps.items():
            if rec.ran or name not in merged.steps:
                merged.steps[name] = rec
    merged.total_s = sum(r.total_s for r in reports)
    merged.finished = all(r.finished for r in reports)
    out.mkdir(parents=True, exist_ok=True)
    write_report(merged, out)
    print(f"[gpu-report] merged {len(paths)} reports → {out / JSON_NAME}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        return merge(args.merge, Path(args.out))
    report = Report(started=now(), argv=sys.argv[1:] if argv is None else argv)
    env, install = ensure_packages(BOOTSTRAP)
    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_report: --device cuda but torch sees no CUDA device")
    toy = args.toy or not args.device.startswith("cuda")
    sizes = TOY if toy else GPU
    sizes = dataclasses.replace(sizes, timeouts={k: v * args.timeout_scale for k, v in sizes.timeouts.items()})
    steps = select(all_steps(sizes), args.steps, args.skip)
    if args.list:
        for s in steps:
            print(f"{s.name:30s} [{s.group}] {s.timeout:5.0f} s  {s.title}")
        return 0
    report.mode, report.device, report.sizes = "toy" if toy else "gpu", args.device, dataclasses.asdict(sizes)
    report.env = environment(args, install)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu_report_") as tmp:
        args.work = args.work or tmp
        Path(args.work).mkdir(parents=True, exist_ok=True)
        ctx = Context(args, sizes, report, env)

        def killed(signum: int, frame: Any) -> None:
            raise Killed(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, killed)
        signal.signal(signal.SIGINT, killed)
        print(f"[gpu-report] {report.mode} mode on {report.env.device.name}; writing {out / JSON_NAME}",
              flush=True)
        try:
            run_steps(steps, ctx, report, args.budget if args.budget is not None or toy else DEFAULT_BUDGET)
        except Killed:
            print("[gpu-report] stopped; the report holds every finished step", flush=True)
            return 130
        report.finished = True
        write_report(report, out)
    c = report.counts
    print(f"[gpu-report] done in {report.total_s:.0f} s: {c['ok']} ok, {c['failed']} failed, "
          f"{c['skipped']} skipped → {out / JSON_NAME}, {out / MD_NAME}", flush=True)
    return 1 if c["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
