"""`make gpu-report`: every GPU check in one process; all figures in one JSON file plus a markdown summary.

    python3 tools/gpu_report.py --out "$OUT"                 # on the GPU machine (installs .whl/ if needed)
    .venv/bin/python tools/gpu_report.py                      # no CUDA here: the same steps on CPU, toy sizes
    python3 tools/gpu_report.py --steps erasers,bench_mdl --out "$OUT"   # a second call: what the first skipped

Writes `<out>/gpu_report.json`, `<out>/gpu_report.md` and one log per subprocess under `<out>/logs/`, rewritten
around every step (a killed run loses nothing it finished). The steps run in priority order (`--list`), each within
its own time limit, and `--budget` caps the whole run. docs/speed.md ("GPU report") says what each step measures.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
# The first thing the report does, before it imports anything of the harness or a third-party package: on a machine
# that lacks hydra etc. (the bare GPU machine), pip-install `.whl/` into /tmp/site and put it and this checkout first
# on sys.path (standard library only: tests/test_gpu_report.py runs it under a Python without hydra/omegaconf/mup).
SITE = Path(os.environ.get("GPU_REPORT_SITE", "/tmp/site"))  # where .whl/ is installed (shared/gpu/README.md)
WHEELS = Path(os.environ.get("GPU_REPORT_WHEELS", ROOT / ".whl"))  # `make gpu-wheels` fills it
REQUIRED = ("hydra", "omegaconf", "mup", "schedulefree", "filelock", "mlxtend")  # the harness cannot run without
PACKAGES = ("hydra-core", "omegaconf", "mup", "schedulefree", "timm", "numpy", "scipy", "pytest", "pytest-xdist",
            "concept-erasure", "numba")  # their versions are recorded


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def bootstrap() -> dict[str, Any]:
    """Install `.whl/` where needed (a required package missing, or a floored one, timm, older than its wheel: the
    GPU image's timm 1.0.29) and put /tmp/site and this checkout first on sys.path. What it did: {wheels, pip:
    {rc, tail} | None, seconds}."""
    t0 = time.monotonic()
    if SITE.is_dir() and str(SITE) not in sys.path:  # installed by an earlier call on this (warm) machine
        sys.path.insert(0, str(SITE))
    wheels = sorted(WHEELS.glob("*.whl"))
    floored = [m for m in map(re.compile(r"(timm)-([^-]+)-").match, (w.name for w in wheels))
               if m and _key(_version(m.group(1)) or "0") < _key(m.group(2))]
    pip = None
    if wheels and (floored or any(importlib.util.find_spec(m) is None for m in REQUIRED)):
        proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                               "--upgrade", "--target", str(SITE), *map(str, wheels)], capture_output=True, text=True)
        pip = {"rc": proc.returncode, "tail": proc.stderr.strip()[-1500:]}
        if proc.returncode:
            print(f"[gpu-report] installing .whl/ failed (rc {proc.returncode}): {proc.stderr.strip()[-300:]}",
                  flush=True)
        if str(SITE) not in sys.path:
            sys.path.insert(0, str(SITE))
        importlib.invalidate_caches()
    if str(ROOT) not in sys.path[:1]:
        sys.path.insert(0, str(ROOT))
    return {"wheels": len(wheels), "pip": pip, "seconds": round(time.monotonic() - t0, 2)}


BOOTSTRAP = bootstrap()

from tools import gpu_report_run as frame  # noqa: E402
from tools import gpu_report_steps as measure  # noqa: E402


def git_info(commit: str | None) -> dict[str, Any]:
    """The commit (git's, else --commit or $GIT_COMMIT) and the sha256 of the tracked-looking sources (.py, .yaml,
    Makefile, pyproject), which ties a run on a machine without .git to a commit (compute it on a checkout)."""
    h = hashlib.sha256()
    files = [ROOT / "Makefile", ROOT / "pyproject.toml"] + [
        p for top in ("conf", "erasure", "models", "scripts", "tests", "tools", "training")
        for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts]
    for p in sorted(files):
        if p.is_file():
            h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    info: dict[str, Any] = {"tree_digest": h.hexdigest()[:16], **({"commit_given": commit} if commit else {})}
    found = None
    with suppress(OSError, subprocess.SubprocessError):
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            found = head.stdout.strip()
            info["dirty"] = bool(subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                                capture_output=True, text=True, timeout=10).stdout.strip())
    info["commit"] = found or commit or os.environ.get("GIT_COMMIT") or "unknown (no git here; pass --commit)"
    return info


def environment(args: argparse.Namespace, env: dict[str, str]) -> dict[str, Any]:
    """The machine, the packages and the code; the CUDA device is asked in a subprocess (with the wheels' path in
    `env`): this process holds no CUDA context (memory)."""
    import torch

    cpu = platform.processor() or "?"
    with suppress(OSError, StopIteration):
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    host = {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "platform": platform.platform(),
            "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)}
    if args.device.startswith("cuda"):
        proc = subprocess.run(measure.command("device", measure.Payload(device=args.device)), capture_output=True,
                              text=True, timeout=120, cwd=ROOT, env=env)
        if proc.returncode != 0:
            raise SystemExit(f"gpu_report: cannot read the CUDA device: {frame.tail(proc.stderr, 3)}")
        device = json.loads(proc.stdout.strip().splitlines()[-1].removeprefix("RESULT "))
    else:
        device = {"name": f"CPU: {cpu}", "type": "cpu", "threads": torch.get_num_threads()}
    missing = [m for m in (*REQUIRED, *measure.OPTIONAL) if importlib.util.find_spec(m) is None]
    found = dict(python=platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda,
                 cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                 host=host, git=git_info(args.commit), device=device, install={**BOOTSTRAP, "missing": missing},
                 packages={m: _version(m) for m in PACKAGES})
    return {k: v for k, v in found.items() if v is not None}


DEFAULT_BUDGET = 540.0  # GPU mode: one 10-minute device call less the wheels' install and start-up


def all_steps(sizes: frame.Sizes) -> list[frame.Step]:
    """In priority order: a budget that runs out skips the last ones (--budget; GPU default DEFAULT_BUDGET)."""
    steps: list[tuple[str, str, Callable[[frame.Context], str | None], str]] = [
        ("tests", "tests", measure.step_tests, "test suite (gpu-marked tests included on CUDA)"),
        *[(f"job_{a}", "jobs", functools.partial(measure.run_job, arch=a),
           f"one MDL job, {a}, base size, synthetic CIFAR shape") for a in frame.ARCHS],
        ("throughput", "speed", measure.step_throughput,
         "train/eval samples/s per architecture: one model (fit) and the vectorised group"),
        ("cell", "sweep", measure.step_cell, "5 seeds: 5 one-seed processes at once vs one job of the cell"),
        ("erasers_device", "erasers", measure.step_erasers_device,
         "LEACE/QLEACE/ALF-QLEACE float64 fit on the device vs CPU"),
        ("bench_mdl", "speed", measure.step_bench_mdl, "tools/bench_mdl.py: ours vs naive, bandwidth"),
        ("bench_erasers_device", "erasers", measure.step_bench_erasers, "tools/bench_erasers.py, ours on the device"),
        ("sweep_cost", "sweep", measure.step_sweep_cost, "GPU-s per epoch per job, jobs per GPU"),
        ("bench_erasers_cpu_reference", "erasers", functools.partial(measure.step_bench_erasers, reference=True),
         "tools/bench_erasers.py, concept-erasure float64 on CPU")]
    return [frame.Step(name, group, fn, sizes.timeouts["job" if name.startswith("job_") else name], title)
            for name, group, fn, title in steps]


def select(steps: list[frame.Step], only: str | None, skip: str | None) -> list[frame.Step]:
    want, drop = ({s.strip() for s in (spec or "").split(",") if s.strip()} for spec in (only, skip))
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
                   f"30 s are left (default on a GPU: {DEFAULT_BUDGET:.0f}; toy mode: none)")
    p.add_argument("--pytest-m", default="gpu", help='GPU mode: the tests step\'s marker expression (default "gpu": '
                   'the tests that need CUDA; "not slurm": the whole suite, in a call of its own)')
    p.add_argument("--commit", default=None, help="the commit to record where this machine has no .git")
    p.add_argument("--previous", action="append", default=[], metavar="JSON",
                   help="an earlier report (another device call) whose finished steps sweep_cost may use")
    p.add_argument("--merge", nargs="+", metavar="JSON", help="join reports of several device calls (later files "
                   "win per step) into --out/gpu_report.{json,md}, then exit")
    p.add_argument("--list", action="store_true", help="list the steps and exit")
    return p.parse_args(argv)


def merge(paths: list[str], out: Path) -> int:
    """One report from several (the device allows 10 minutes a call): steps in order of first appearance, each
    from the last report that ran it (not "not reached"); env and mode from the first; all runs listed."""
    reports = [frame.Report.from_json(json.loads(Path(p).read_text())) for p in paths]
    merged = dataclasses.replace(reports[0], steps={}, merged_from=[
        {"path": p, "started": r.started, "argv": r.argv, "device": r.env.get("device"),
         "commit": r.env.get("git", {}).get("commit")} for p, r in zip(paths, reports, strict=True)])
    for r in reports:
        merged.steps.update({name: rec for name, rec in r.steps.items() if rec.ran or name not in merged.steps})
    merged.total_s = sum(r.total_s for r in reports)
    merged.finished = all(r.finished for r in reports)
    out.mkdir(parents=True, exist_ok=True)
    frame.write_report(merged, out)
    print(f"[gpu-report] merged {len(paths)} reports → {out / frame.JSON_NAME}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        return merge(args.merge, Path(args.out))
    report = frame.Report(started=frame.now(), argv=sys.argv[1:] if argv is None else argv)
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "WANDB_MODE": os.environ.get("WANDB_MODE", "disabled"),
           "PYTHONPATH": os.pathsep.join([str(ROOT), *([str(SITE)] if SITE.is_dir() else []),
                                          *([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])])}
    import torch

    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit("gpu_report: --device cuda but torch sees no CUDA device")
    toy = args.toy or not args.device.startswith("cuda")
    sizes = frame.TOY if toy else frame.GPU
    steps = select(all_steps(sizes), args.steps, args.skip)
    if args.list:
        print("\n".join(f"{s.name:30s} [{s.group}] {s.timeout:5.0f} s  {s.title}" for s in steps))
        return 0
    report.mode, report.device, report.sizes = "toy" if toy else "gpu", args.device, dataclasses.asdict(sizes)
    report.env = environment(args, env)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="gpu_report_") as args.work:  # scratch: eraser cache, memory files

        def killed(signum: int, frame_: Any) -> None:
            raise frame.Killed(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, killed)
        signal.signal(signal.SIGINT, killed)
        print(f"[gpu-report] {report.mode} mode on {report.env['device']['name']}; writing {out / frame.JSON_NAME}",
              flush=True)
        try:
            frame.run_steps(steps, frame.Context(args, sizes, report, env), report,
                            args.budget if args.budget is not None or toy else DEFAULT_BUDGET)
        except frame.Killed:
            print("[gpu-report] stopped; the report holds every finished step", flush=True)
            return 130
        report.finished = True
        frame.write_report(report, out)
    c = report.counts
    print(f"[gpu-report] done in {report.total_s:.0f} s: {c['ok']} ok, {c['failed']} failed, "
          f"{c['skipped']} skipped → {out / frame.JSON_NAME}, {out / frame.MD_NAME}", flush=True)
    return 1 if c["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
