"""`make gpu-report`: every GPU check in one process; all figures in one JSON file plus a markdown summary.

    python3 scripts/gpu_report.py --out "$OUT"                 # on the GPU machine (installs .whl/ if needed)
    .venv/bin/python scripts/gpu_report.py                      # no CUDA here: the same steps on CPU, toy sizes
    python3 scripts/gpu_report.py --steps tests,erasers --budget 560 --out "$OUT"

Writes `<out>/gpu_report.json`, `<out>/gpu_report.md` and one log per subprocess under `<out>/logs/`. Both
files are rewritten after every step (and before it: a step the report dies in reads "failed: did not
finish", steps after it "skipped: not reached"), so a killed run loses nothing it finished. A step that fails
records its one-line error and the tail of its output, and the next step runs. Each step has its own time
budget (`--budget` caps the whole run: a step gets at most what is left).

Steps (groups in brackets; `--steps`/`--skip` take step or group names):
  tests [tests]              pytest -m "not slurm" (GPU: gpu-marked tests that skip count as failures)
  job_<arch> [jobs]          one `python -m training.run` MDL job per architecture at the paper's base size on
                             CIFAR-shaped synthetic data (50 000 × 3×32×32, 10 classes), capped epochs
  erasers_device [erasers]   LEACE, QLEACE, ALF-QLEACE fitted in float64 on the device vs CPU: max |Δ| erased
  bench_erasers_device, bench_erasers_cpu_reference [erasers]
                             scripts/bench_erasers.py: ours on the device beside concept-erasure's float64 CPU fit
  precision [precision]      training.precision fp32|tf32|bf16 (skipped while the config key does not exist)
  bench_mdl [speed]          scripts/bench_mdl.py: ours vs the naive loop, device read bandwidth vs an MLP epoch
  throughput [speed]         train and eval samples/s per architecture through the job's Trainer
  sweep_cost [sweep]         per architecture: GPU-seconds per epoch per job, memory per job, jobs per GPU
                             (by memory, and measured: aggregate samples/s of 1, 2, 4 processes at once)

Without CUDA (or with --toy) every step runs on CPU at toy sizes in about a minute, so the path is known to
work before a GPU sees it (tests/test_gpu_report.py runs it).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import hashlib
import importlib
import importlib.util
import json
import math
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("GPU_REPORT_SITE", "/tmp/site"))  # where .whl/ is installed (shared/gpu/README.md)
REQUIRED = ("hydra", "omegaconf", "mup", "schedulefree", "filelock", "mlxtend")  # the harness cannot run without
OPTIONAL = ("pytest", "xdist", "concept_erasure", "numba", "submitit", "wandb")  # some tests/steps need them
ARCHS = ("mlp", "lenet", "convnext", "swin")
JSON_NAME, MD_NAME = "gpu_report.json", "gpu_report.md"


# ---------------------------------------------------------------------------------------------------- sizes


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Everything that differs between the GPU run and the CPU toy run."""

    pytest_args: tuple[str, ...]
    job_data: tuple[str, ...]  # dataset overrides of the architecture jobs
    job_mdl: tuple[str, ...]  # mdl overrides (capped epoch budget)
    arch: dict[str, tuple[str, ...]]  # per-architecture overrides (GPU: none, the presets' base sizes)
    shape: tuple[int, int, int]
    n: int
    eraser: dict[str, int]  # erasers_device: n, d, k, alf_max_rank
    bench_erasers: tuple[str, ...]  # shared args of both bench_erasers runs
    bench_erasers_device_methods: str
    bench_erasers_cpu_methods: str
    bench_mdl: tuple[str, ...]
    throughput: dict[str, int]  # subset, val, group
    loop_archs: tuple[str, ...]
    loop_procs: tuple[int, ...]
    loop_seconds: float
    precision_arch: str
    precision_epochs: int
    timeouts: dict[str, float]


GPU_EPOCHS = 2
GPU = Sizes(
    pytest_args=(),  # the marker expression is --pytest-m (default "not slurm": slow and gpu tests included)
    job_data=("dataset=synthetic", "dataset.n=50000", "dataset.channels=3", "dataset.size=32",
              "dataset.num_classes=10", "dataset.augment=true"),
    # the epoch cap is the budget: no step floor keeps a small block (or the MLP's 1000-step warm-up) going
    job_mdl=("mdl=prequential", f"mdl.max_epochs={GPU_EPOCHS}", f"mdl.patience={GPU_EPOCHS}",
             "mdl.stop_after_warmup=false"),
    arch={a: () for a in ARCHS},
    shape=(3, 32, 32), n=50_000,
    eraser={"n": 20_000, "d": 1024, "k": 10, "alf_max_rank": 64},
    bench_erasers=("--n", "50000", "--d", "3072", "--k", "10"),
    bench_erasers_device_methods="ours_leace,ours_qleace,ours_alf",
    bench_erasers_cpu_methods="ce_leace,ce_qleace",
    bench_mdl=("--repeats", "1"),
    throughput={"subset": 10_000, "val": 2048, "group": 10},
    loop_archs=ARCHS, loop_procs=(1, 4), loop_seconds=5.0,
    precision_arch="convnext", precision_epochs=1,
    timeouts={"tests": 480, "job": 300, "erasers_device": 300, "bench_erasers_device": 300,
              "bench_erasers_cpu_reference": 300, "precision": 300, "bench_mdl": 300, "throughput": 240,
              "sweep_cost": 300},
)
TOY = Sizes(
    pytest_args=("tests/test_mdl_math.py",),
    job_data=("dataset=synthetic", "dataset.n=400", "dataset.channels=3", "dataset.size=8",
              "dataset.num_classes=10", "dataset.augment=true"),
    job_mdl=("mdl=quick", "mdl.num_blocks=2", "mdl.min_block=64", "mdl.val_size=64", "mdl.max_epochs=1",
             "mdl.patience=1", "mdl.min_steps=0", "mdl.patience_min_steps=0", "mdl.stop_after_warmup=false"),
    arch={"mlp": ("arch.width=16",), "lenet": ("arch.width=16",),
          "convnext": ("arch.width=8", "arch.depth=1", "arch.base_width=8", "arch.base_depth=1"),
          "swin": ("arch.width=8", "arch.depth=1", "arch.base_width=8", "arch.base_depth=1")},
    shape=(3, 8, 8), n=400,
    eraser={"n": 600, "d": 24, "k": 3, "alf_max_rank": 4},
    bench_erasers=("--n", "600", "--d", "24", "--k", "3", "--rank", "4"),
    bench_erasers_device_methods="ours_leace,ce_leace",  # the device is the CPU: both in one run
    bench_erasers_cpu_methods="",
    bench_mdl=("--n", "1500", "--d", "12", "--epochs", "1", "--seeds", "1", "--repeats", "1", "--threads", "1"),
    throughput={"subset": 128, "val": 64, "group": 2, "quick": 1},
    loop_archs=("mlp",), loop_procs=(1,), loop_seconds=0.3,
    precision_arch="mlp", precision_epochs=1,
    timeouts={"tests": 60, "job": 60, "erasers_device": 60, "bench_erasers_device": 60,
              "bench_erasers_cpu_reference": 60, "precision": 60, "bench_mdl": 60, "throughput": 60,
              "sweep_cost": 60},
)


# ---------------------------------------------------------------------------------------------------- runner


class StepError(Exception):
    """A step failed: `line` is its one-line error, `tail` the end of the output that explains it."""

    def __init__(self, line: str, tail: str = "") -> None:
        super().__init__(line)
        self.line, self.tail = line, tail


class StepSkipped(Exception):
    """The step cannot apply here (its reason is the message)."""


class Killed(BaseException):
    """SIGTERM/SIGINT: the report is being stopped (the tool's time limit)."""


@dataclasses.dataclass
class Step:
    name: str
    group: str
    fn: Callable[[Context], str | None]  # fills ctx.figures; returns a one-line summary
    timeout: float
    title: str


@dataclasses.dataclass
class Proc:
    rc: int
    output: str
    seconds: float
    log: Path


def tail(text: str, lines: int = 40, chars: int = 4000) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])[-chars:]


ERROR_LINE = re.compile(r"^(\w+\.)*\w*(Error|Exception|Interrupt|Exit|Failed)\b.*|^error: .*|^E\s+\w+Error.*")


def error_line(output: str, rc: int) -> str:
    """The last line of `output` that names an error (a Python exception, the harness's `error:` line), else rc."""
    for line in reversed(output.strip().splitlines()):
        if ERROR_LINE.match(line.strip()):
            return line.strip()[:300]
    return f"exit code {rc}"


class Context:
    """What a step function gets: sizes, device, output folders, a subprocess runner bound to the step's budget,
    `figures` to fill (kept even when the step fails half-way) and the report so far."""

    def __init__(self, args: argparse.Namespace, sizes: Sizes, report: dict[str, Any], env: dict[str, str]) -> None:
        self.args, self.sizes, self.report, self.env = args, sizes, report, env
        self.out = Path(args.out)
        self.logs = self.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.work = Path(args.work)
        self.gpu = args.device.startswith("cuda")
        self.device = args.device
        self.figures: dict[str, Any] = {}
        self.deadline = math.inf
        self.step = ""

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def run(self, cmd: list[str], log: str, timeout: float | None = None, env: dict[str, str] | None = None,
            check: bool = True) -> Proc:
        """Run `cmd` in ROOT in its own process group, output to logs/<log>.log; on the step's deadline the whole
        group is stopped and the step fails with the tail of the output."""
        path = self.logs / f"{log}.log"
        limit = min(self.remaining(), timeout if timeout is not None else math.inf)
        if limit <= 1:
            raise StepError(f"no time left in the step's budget before {log}")
        t0 = time.monotonic()
        with open(path, "w") as f:
            f.write("$ " + " ".join(cmd) + "\n")
            f.flush()
            proc = subprocess.Popen(cmd, cwd=ROOT, env=env or self.env, stdout=f, stderr=subprocess.STDOUT,
                                    start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
                timed_out = False
            except subprocess.TimeoutExpired:
                stop(proc)
                rc, timed_out = proc.returncode, True
            except BaseException:
                stop(proc)
                raise
        output = path.read_text(errors="replace")
        seconds = time.monotonic() - t0
        if timed_out:
            raise StepError(f"{log}: timed out after {seconds:.0f} s (time budget)", tail(output))
        if check and rc != 0:
            raise StepError(f"{log}: {error_line(output, rc)}", tail(output))
        return Proc(rc, output, seconds, path)

    def python(self, args: list[str], log: str, **kw: Any) -> Proc:
        return self.run([sys.executable, *args], log, **kw)

    def work_result(self, kind: str, payload: dict[str, Any], log: str, **kw: Any) -> dict[str, Any]:
        """scripts/gpu_report_work.py <kind> in a fresh process; its `RESULT {json}` line."""
        proc = self.python(["-m", "scripts.gpu_report_work", kind, json.dumps(payload)], log, **kw)
        return parse_result(proc)


def parse_result(proc: Proc) -> dict[str, Any]:
    lines = [ln for ln in proc.output.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise StepError(f"{proc.log.stem}: no RESULT line", tail(proc.output))
    return json.loads(lines[-1][len("RESULT "):])


def stop(proc: subprocess.Popen[Any]) -> None:
    """Stop a process we started and its group (pytest-xdist workers, benchmark workers): TERM, then KILL."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def cpu_seconds() -> float:
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def finite(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become None (the JSON stays strict; the test checks figures are finite)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_report(report: dict[str, Any], out: Path) -> None:
    """Both files, atomically (temp file + rename): a kill while writing leaves the previous version."""
    report["updated"] = now()
    counts = {s: sum(r["status"] == s for r in report["steps"].values()) for s in ("ok", "failed", "skipped")}
    report["counts"] = counts
    for name, text in ((JSON_NAME, json.dumps(finite(report), indent=1, allow_nan=False)),
                       (MD_NAME, markdown(report))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text + "\n")
        os.replace(tmp, out / name)


def run_steps(steps: list[Step], ctx: Context, report: dict[str, Any], budget: float | None) -> None:
    """Run each step within its own time budget, recording ok/failed/skipped, and rewrite the report every time."""
    t_start = time.monotonic()
    for step in steps:
        report["steps"][step.name] = {"group": step.group, "title": step.title, "status": "skipped",
                                      "reason": "not reached: the report ended before this step"}
    write_report(report, ctx.out)
    for step in steps:
        rec = report["steps"][step.name]
        left = math.inf if budget is None else budget - (time.monotonic() - t_start)
        if left < min(30.0, step.timeout):
            rec.update(status="skipped", reason=f"no time left in --budget ({max(left, 0):.0f} s)")
            write_report(report, ctx.out)
            continue
        timeout = min(step.timeout, left)
        rec.clear()
        rec.update(group=step.group, title=step.title, status="failed", timeout_s=timeout, started=now(),
                   error="did not finish: the report was stopped during this step")
        write_report(report, ctx.out)
        ctx.figures, ctx.step = {}, step.name
        t0, c0 = time.monotonic(), cpu_seconds()
        ctx.deadline = t0 + timeout
        print(f"[gpu-report] {step.name}: {step.title} (budget {timeout:.0f} s)", flush=True)
        try:
            summary = step.fn(ctx)
            rec.update(status="ok", summary=summary or "")
            rec.pop("error")
        except StepSkipped as err:
            rec.update(status="skipped", reason=str(err))
            rec.pop("error")
        except StepError as err:
            rec.update(error=err.line, tail=err.tail)
        except Killed:
            rec.update(seconds=time.monotonic() - t0, figures=ctx.figures, error="killed (SIGTERM/SIGINT)")
            write_report(report, ctx.out)
            raise
        except Exception as err:
            rec.update(error=f"{type(err).__name__}: {err}".splitlines()[0][:300],
                       tail=tail(traceback.format_exc()))
        rec["seconds"] = round(time.monotonic() - t0, 2)
        rec["cpu_s"] = round(cpu_seconds() - c0, 2)  # this process and its finished children
        rec["figures"] = ctx.figures
        report["total_s"] = round(time.monotonic() - t_start, 1)
        write_report(report, ctx.out)
        line = rec.get("summary") or rec.get("reason") or rec.get("error") or ""
        print(f"[gpu-report] {step.name}: {rec['status']} in {rec['seconds']:.1f} s  {line}", flush=True)


# ---------------------------------------------------------------------------------------------------- markdown


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ", ".join(fmt(x) for x in v[:8]) + (", …" if len(v) > 8 else "") + "]"
    return str(v)


def flat_items(d: dict[str, Any], prefix: str = "", depth: int = 0) -> Iterable[tuple[str, Any]]:
    for k, v in d.items():
        if isinstance(v, dict) and depth < 3:
            yield from flat_items(v, f"{prefix}{k}.", depth + 1)
        else:
            yield f"{prefix}{k}", v


def markdown(report: dict[str, Any]) -> str:
    env = report.get("env", {})
    dev = env.get("device", {})
    c = report.get("counts", {})
    lines = [f"# GPU report: {dev.get('name', '?')} ({report['mode']} mode)", "",
             f"- device: {dev.get('name', '?')}" + (f", {dev['total_memory_gb']:.1f} GB" if dev.get(
                 "total_memory_gb") else "") + f"; host CPU: {env.get('host', {}).get('cpu', '?')}",
             f"- python {env.get('python', '?')}, torch {env.get('torch', '?')} (CUDA {env.get('cuda', '-')}), "
             f"commit {env.get('git', {}).get('commit', '?')}" + (" (with uncommitted changes)" if env.get(
                 "git", {}).get("dirty") else "") + f", source digest {env.get('git', {}).get('tree_digest', '?')}",
             f"- started {report['started']}, updated {report.get('updated', '?')}, "
             f"{report.get('total_s', 0):.0f} s; steps: {c.get('ok', 0)} ok, {c.get('failed', 0)} failed, "
             f"{c.get('skipped', 0)} skipped" + ("" if report.get("finished") else " (not finished)"), ""]
    missing = env.get("install", {}).get("missing")
    if missing:
        lines += [f"- not importable: {', '.join(missing)}", ""]
    lines += ["| step | status | seconds | result |", "|---|---|---:|---|"]
    for name, r in report["steps"].items():
        what = r.get("summary") or r.get("reason") or r.get("error") or ""
        lines.append(f"| {name} | {r['status']} | {r.get('seconds', '')} | {what.replace('|', '/')} |")
    failed = [(n, r) for n, r in report["steps"].items() if r["status"] == "failed"]
    if failed:
        lines += ["", "## Failures"]
        for name, r in failed:
            lines += ["", f"### {name}", "", f"`{r.get('error', '')}`"]
            if r.get("tail"):
                lines += ["", "```", r["tail"], "```"]
    lines += ["", "## Figures"]
    for name, r in report["steps"].items():
        if r.get("figures"):
            lines += ["", f"### {name}", ""]
            lines += [f"- {k}: {fmt(v)}" for k, v in flat_items(r["figures"]) if not k.endswith("failures")]
            for k, v in flat_items(r["figures"]):
                if k.endswith("failures") and v:
                    lines += [f"- {k}:"] + [f"  - {x}" for x in v]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------------- environment


def ensure_packages(report_env: dict[str, Any]) -> dict[str, str]:
    """Make the harness importable here and in subprocesses: on a machine that lacks hydra etc. (the GPU
    machine), pip-install `.whl/` into /tmp/site (shared/gpu/README.md). Returns the subprocess environment."""
    t0 = time.monotonic()
    info: dict[str, Any] = {}
    paths = [str(ROOT)]
    if SITE.is_dir() and str(SITE) not in sys.path:  # installed by an earlier call on this (warm) machine
        sys.path.insert(0, str(SITE))
    missing = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    info["wheels"] = len(wheels)
    if missing and wheels:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--upgrade", "--target", str(SITE), *map(str, wheels)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        info["pip"] = {"rc": proc.returncode, "tail": tail(proc.stderr, 10, 1500)}
        if str(SITE) not in sys.path:
            sys.path.insert(0, str(SITE))
        importlib.invalidate_caches()
    if SITE.is_dir():
        paths.append(str(SITE))
    sys.path.insert(0, str(ROOT))
    info["missing"] = [m for m in (*REQUIRED, *OPTIONAL) if importlib.util.find_spec(m) is None]
    info["seconds"] = round(time.monotonic() - t0, 2)
    report_env["install"] = info
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*paths, *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("WANDB_MODE", "disabled")
    env["PYTHONUNBUFFERED"] = "1"
    return env


def version(module: str) -> str | None:
    try:
        from importlib.metadata import version as dist_version

        return dist_version(module)
    except Exception:
        try:
            return str(getattr(importlib.import_module(module), "__version__", "?"))
        except Exception:
            return None


def tree_digest() -> str:
    """sha256 of the tracked-looking sources (.py, .yaml, Makefile, pyproject): ties a run on a machine without
    .git to a commit (compute it here on a checkout and compare)."""
    h = hashlib.sha256()
    files = [ROOT / "Makefile", ROOT / "pyproject.toml"]
    for top in ("conf", "erasure", "models", "scripts", "tests", "training"):
        files += [p for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts]
    for p in sorted(files):
        if p.is_file():
            h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def git_info(commit: str | None) -> dict[str, Any]:
    info: dict[str, Any] = {"tree_digest": tree_digest()}
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            info["commit"] = head.stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                   capture_output=True, text=True, timeout=10)
            info["dirty"] = bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    if commit:
        info.setdefault("commit", commit)
        info["commit_given"] = commit
    info.setdefault("commit", os.environ.get("GIT_COMMIT") or "unknown (no git here; pass --commit)")
    return info


def environment(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    cpu = platform.processor() or "?"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    env: dict[str, Any] = {
        "python": platform.python_version(), "torch": torch.__version__, "cuda": torch.version.cuda,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "host": {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "platform": platform.platform(),
                 "memory_gb": round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1)},
        "git": git_info(args.commit),
    }
    if args.device.startswith("cuda"):  # asked in a subprocess: this process holds no CUDA context (memory)
        proc = subprocess.run([sys.executable, "-m", "scripts.gpu_report_work", "device",
                               json.dumps({"device": args.device})], capture_output=True, text=True, timeout=120,
                              cwd=ROOT)
        if proc.returncode != 0:
            raise SystemExit(f"gpu_report: cannot read the CUDA device: {tail(proc.stderr, 3)}")
        env["device"] = json.loads(proc.stdout.strip().splitlines()[-1].removeprefix("RESULT "))
    else:
        env["device"] = {"type": "cpu", "name": f"CPU: {cpu}", "threads": torch.get_num_threads()}
    return env


def add_versions(env: dict[str, Any]) -> None:
    env["packages"] = {m: version(m) for m in ("hydra-core", "omegaconf", "mup", "schedulefree", "timm", "numpy",
                                               "scipy", "pytest", "pytest-xdist", "concept-erasure", "numba")}


# ---------------------------------------------------------------------------------------------------- steps


def step_tests(ctx: Context) -> str:
    """The test suite (GPU: all but slurm, gpu-marked included, any gpu test that skips counts as failed)."""
    if importlib.util.find_spec("pytest") is None:
        raise StepError("pytest is not importable: add its wheels to .whl/ (make gpu-wheels)")
    xml = ctx.logs / "pytest.xml"
    args = ["-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", f"--junitxml={xml}", *ctx.sizes.pytest_args]
    if ctx.gpu and importlib.util.find_spec("xdist") is not None:
        args += ["-n", str(min(8, max(1, len(os.sched_getaffinity(0)) // 2))), "--dist", "loadgroup"]
    gpu_ids: set[tuple[str, str]] = set()
    if ctx.gpu:
        coll = ctx.python(["-m", "pytest", "-q", "--collect-only", "-m", "gpu", "-p", "no:cacheprovider"],
                          "pytest-collect-gpu", check=False)
        gpu_ids = {junit_id(ln.strip()) for ln in coll.output.splitlines() if "::" in ln}
        ctx.figures["gpu_tests"] = len(gpu_ids)
    if ctx.gpu and ctx.args.pytest_m:
        args += ["-m", ctx.args.pytest_m]
    env = {**ctx.env, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    try:
        proc = ctx.python(args, "pytest", env=env, check=False)
    except StepError:  # out of time: the verbose lines say how far it got
        outcomes = pytest_progress((ctx.logs / "pytest.log").read_text(errors="replace"))
        ctx.figures["partial"] = {w.lower(): sum(o == w for o, _ in outcomes) for w in OUTCOMES}
        ctx.figures["partial_failures"] = [t for o, t in outcomes if o in ("FAILED", "ERROR")][:40]
        raise
    if not xml.exists():
        raise StepError(f"pytest: {error_line(proc.output, proc.rc)} (no junit xml)", tail(proc.output))
    counts, failures, gpu_skipped = read_junit(xml, gpu_ids)
    # a test that fails only because an optional package is not installed here (numba, wandb without its wheel)
    # is reported apart: it says what to carry, not that the code is wrong
    missing = [f for f in failures if (m := MISSING_MODULE.search(f)) and m.group(1).split(".")[0] in OPTIONAL]
    real = [f for f in failures if f not in missing]
    ctx.figures.update(counts)
    ctx.figures["gpu_skipped"] = len(gpu_skipped)
    ctx.figures["failed_missing_module"] = len(missing)
    ctx.figures["failures"] = real[:40] + [f"{n} (gpu test skipped on CUDA: {why})" for n, why in gpu_skipped]
    ctx.figures["missing_module_failures"] = missing[:20]
    ctx.figures["pytest_rc"] = proc.rc
    summary = (f"{counts['passed']} passed, {counts['failed']} failed, {counts['errors']} errors, "
               f"{counts['skipped']} skipped" + (f" ({len(gpu_skipped)} gpu tests skipped)" if ctx.gpu else "")
               + (f"; {len(missing)} failed only for a package not installed here" if missing else ""))
    if real or gpu_skipped or (proc.rc not in (0, 5) and not missing):
        raise StepError(summary + (f"; first: {ctx.figures['failures'][0]}" if ctx.figures["failures"] else ""),
                        tail(proc.output))
    return summary


MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")
OUTCOMES = ("PASSED", "FAILED", "SKIPPED", "ERROR")


def pytest_progress(text: str) -> list[tuple[str, str]]:
    """(outcome, test id) of each `pytest -v` result line: "tests/t.py::x PASSED [ 5%]" or, with xdist,
    "[gw0] [ 5%] PASSED tests/t.py::x"."""
    found = []
    for line in text.splitlines():
        test = re.search(r"(tests/\S+::\S+)", line)
        outcome = re.search(r"\b(PASSED|FAILED|SKIPPED|ERROR)\b", line)
        if test and outcome and not line.startswith(("FAILED ", "ERROR ", "SKIPPED ")):  # not the -r summary
            found.append((outcome.group(1), test.group(1)))
    return found


def junit_id(nodeid: str) -> tuple[str, str]:
    """pytest node id → (classname, name) as junit xml writes them: tests/test_a.py::C::t[x] → tests.test_a.C, t[x]."""
    parts = nodeid.split("::")
    module = parts[0].removesuffix(".py").replace("/", ".")
    return ".".join([module, *parts[1:-1]]), parts[-1]


def read_junit(path: Path, gpu_ids: set[tuple[str, str]]) -> tuple[dict[str, int], list[str], list[tuple[str, str]]]:
    import xml.etree.ElementTree as ET

    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures: list[str] = []
    gpu_skipped: list[tuple[str, str]] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        name = f"{key[0]}::{key[1]}"
        kinds = {child.tag: child for child in case if child.tag in ("failure", "error", "skipped")}
        if "failure" in kinds or "error" in kinds:
            tag = "failure" if "failure" in kinds else "error"
            counts["failed" if tag == "failure" else "errors"] += 1
            msg = (kinds[tag].get("message") or "").strip().splitlines()
            failures.append(f"{name}: {msg[0][:200] if msg else tag}")
        elif "skipped" in kinds:
            counts["skipped"] += 1
            if key in gpu_ids:
                gpu_skipped.append((name, (kinds["skipped"].get("message") or "").strip()[:200]))
        else:
            counts["passed"] += 1
    return counts, failures, gpu_skipped


def job_overrides(ctx: Context, arch: str, out: Path, extra: Iterable[str] = ()) -> list[str]:
    s = ctx.sizes
    return [f"arch={arch}", *s.arch[arch], *s.job_data, *s.job_mdl, "eraser=control", "seed=0",
            f"device={ctx.device}", "logger=none", "progress=false", "certificate=false",
            f"paths.out_dir={out}", f"paths.cache_dir={ctx.work / 'cache'}", *ctx.args.job_override, *extra]


def run_job(ctx: Context, arch: str, name: str, extra: Iterable[str] = ()) -> dict[str, Any]:
    """One `python -m training.run` job (through gpu_report_work `job` for the process's peak GPU memory):
    bits/sample, wall time, epochs/steps, peak memory."""
    out = ctx.out / "runs" / name
    shutil.rmtree(out, ignore_errors=True)  # a fresh job: an earlier result here would be reused, not timed
    memory_file = ctx.work / f"{name}.memory.json"
    memory_file.unlink(missing_ok=True)
    overrides = job_overrides(ctx, arch, out, extra)
    payload = {"overrides": overrides, "memory_file": str(memory_file), "device": ctx.device}
    env = {**ctx.env, "OMP_NUM_THREADS": ctx.env.get("OMP_NUM_THREADS", "1") if not ctx.gpu else "8"}
    t0 = time.monotonic()
    proc = ctx.python(["-m", "scripts.gpu_report_work", "job", json.dumps(payload)], name, env=env, check=False)
    wall = time.monotonic() - t0
    fig: dict[str, Any] = {"overrides": " ".join(overrides), "wall_s": wall}
    if memory_file.exists():
        fig.update(json.loads(memory_file.read_text()))
    results = sorted(out.rglob("result.json"), key=lambda p: p.stat().st_mtime)
    if proc.rc != 0 or not results:
        ctx.figures.update(fig)
        raise StepError(f"{name}: {error_line(proc.output, proc.rc)}", tail(proc.output))
    res = json.loads(results[-1].read_text())
    mdl, final, timings = res["mdl"], res.get("final") or {}, res.get("timings", {})
    blocks = mdl.get("blocks", [])
    fig.update({
        "bits_per_sample": mdl["bits_per_sample"], "legacy": mdl.get("legacy"), "protocol": mdl.get("protocol"),
        "n_coded": mdl.get("n_coded"), "block_models": len(blocks),
        "epochs_per_block": [b["epochs"] for b in blocks], "steps_total": sum(b["steps"] for b in blocks)
        + int(final.get("steps") or 0), "full_run_epochs": final.get("epochs"),
        "params": (res.get("model") or {}).get("params"), "timings": timings, "device": res.get("device"),
        "result": str(results[-1].relative_to(ctx.out)),
    })
    epochs = max([b["epochs"] for b in blocks] + [int(final.get("epochs") or 0)] or [1])
    fig["train_s"] = float(timings.get("mdl_s", 0.0)) + float(timings.get("full_run_s", 0.0))
    fig["job_s_per_epoch"] = fig["train_s"] / max(epochs, 1)  # all block models + the full run, one epoch each
    ctx.figures.update(fig)
    return fig


def make_job_step(arch: str) -> Callable[[Context], str]:
    def step(ctx: Context) -> str:
        f = run_job(ctx, arch, f"job_{arch}")
        mem = f", peak {f['peak_reserved_mb']:.0f} MB reserved" if "peak_reserved_mb" in f else ""
        return (f"{f['bits_per_sample']:.4f} bits/sample, {f['wall_s']:.1f} s wall ({f['train_s']:.1f} s training, "
                f"{f['job_s_per_epoch']:.2f} s/epoch), {f['steps_total']} steps{mem}")

    step.__doc__ = f"one MDL job, {arch}"
    return step


def step_erasers_device(ctx: Context) -> str:
    payload = {**ctx.sizes.eraser, "device": ctx.device, "threads": len(os.sched_getaffinity(0))}
    res = ctx.work_result("erasers", payload, "erasers_device")
    ctx.figures.update(res)
    names = ("leace", "qleace", "alf_qleace")
    return "max |Δ erased| device vs CPU: " + ", ".join(f"{n} {res[n]['max_abs_diff']:.1e}" for n in names)


def run_bench_erasers(ctx: Context, device: str, methods: str, log: str) -> str:
    json_path = ctx.work / f"{log}.json"
    json_path.unlink(missing_ok=True)
    try:
        ctx.python(["scripts/bench_erasers.py", *ctx.sizes.bench_erasers, "--device", device, "--methods", methods,
                    "--json", str(json_path)], log)
    except StepError:  # keep the methods that finished (one line each) before the failure or the time limit
        text = (ctx.logs / f"{log}.log").read_text(errors="replace")
        ctx.figures["finished_methods"] = {m: {"seconds": float(t), "peak_mb": float(mb)}
                                           for m, t, mb in BENCH_LINE.findall(text)}
        raise
    res = json.loads(json_path.read_text())
    ctx.figures.update(res)
    return ", ".join(f"{m} {r['seconds']:.2f} s / {r['peak_mb']:.0f} MB" for m, r in res["results"].items())


BENCH_LINE = re.compile(r"^  (\w+)\s+([\d.]+) s\s+peak\s+(-?[\d.]+) MB", re.M)


def step_bench_erasers_device(ctx: Context) -> str:
    return run_bench_erasers(ctx, ctx.device, ctx.sizes.bench_erasers_device_methods, "bench_erasers_device")


def step_bench_erasers_cpu(ctx: Context) -> str:
    if not ctx.sizes.bench_erasers_cpu_methods:
        raise StepSkipped("toy mode: bench_erasers_device ran concept-erasure on this CPU already")
    if importlib.util.find_spec("concept_erasure") is None:
        raise StepSkipped("concept-erasure is not importable (add its wheel to .whl/)")
    return run_bench_erasers(ctx, "cpu", ctx.sizes.bench_erasers_cpu_methods, "bench_erasers_cpu_reference")


PRECISIONS = ("fp32", "tf32", "bf16")


def step_precision(ctx: Context) -> str:
    """training.precision: run when the key exists (else skipped with the composition error)."""
    from scripts.gpu_report_work import compose

    try:  # the job config `python -m training.run training.precision=bf16` would get (composed and checked)
        compose(["training.precision=bf16", "logger=none"])
    except Exception as err:
        text = f"{err}\n{err.__cause__ or ''}"
        line = " ".join(f"{type(err).__name__}: {text}".split())[:300]
        if "precision" in text and ("Could not override" in text or "not in struct" in text):
            why = next((ln.strip() for ln in text.splitlines() if "not in struct" in ln), line)
            raise StepSkipped(f"training.precision does not exist yet: {why}") from err
        raise StepError(f"composing training.precision=bf16: {line}", tail(traceback.format_exc())) from err
    arch, epochs = ctx.sizes.precision_arch, ctx.sizes.precision_epochs
    results: dict[str, Any] = {}
    for p in PRECISIONS:
        try:
            f = run_job(ctx, arch, f"precision_{p}", [f"training.precision={p}", f"mdl.max_epochs={epochs}",
                                                      f"mdl.patience={epochs}"])
            results[p] = {k: f.get(k) for k in ("bits_per_sample", "train_s", "job_s_per_epoch", "peak_reserved_mb")}
        except StepError as err:
            results[p] = {"error": err.line}
        ctx.figures.clear()
        ctx.figures.update({"arch": arch, "epochs": epochs, **results})
    bad = [p for p, r in results.items() if "error" in r]
    if bad:
        raise StepError(f"precision {', '.join(bad)} failed: {results[bad[0]]['error']}")
    ref = results["fp32"]
    return ", ".join(f"{p} {r['bits_per_sample']:.4f} bits, {ref['train_s'] / r['train_s']:.2f}× fp32 speed"
                     for p, r in results.items())


def step_bench_mdl(ctx: Context) -> str:
    json_path = ctx.work / "bench_mdl.json"
    json_path.unlink(missing_ok=True)
    ctx.python(["scripts/bench_mdl.py", "--device", ctx.device, *ctx.sizes.bench_mdl, "--json", str(json_path)],
               "bench_mdl")
    res = json.loads(json_path.read_text())
    ctx.figures.update(res)
    s = f"ours {res['speedup']['ours']:.2f}× the naive loop"
    bw = res.get("bandwidth")
    if bw:
        s += (f"; device read {bw['read_gbps']:.0f} GB/s, MLP-128 epoch = {bw['epoch_over_read']:.0f}× one read "
              f"of the data")
    return s


def throughput_payload(ctx: Context, archs: Iterable[str]) -> dict[str, Any]:
    s = ctx.sizes
    return {"archs": list(archs), "n": s.n, "shape": list(s.shape), "device": ctx.device,
            "arch_overrides": {a: list(o) for a, o in s.arch.items()}, **s.throughput}


def step_throughput(ctx: Context) -> str:
    res = ctx.work_result("throughput", throughput_payload(ctx, ARCHS), "throughput")
    ctx.figures.update(res)
    bad = [a for a, r in res.items() if "error" in r]
    if bad:
        raise StepError(f"throughput {bad[0]}: {res[bad[0]]['error']}")
    return ", ".join(f"{a} train {r['train_sps']:.0f}/s eval {r['eval_sps']:.0f}/s" for a, r in res.items())


def run_concurrent(ctx: Context, arch: str, procs: int) -> dict[str, Any]:
    """`procs` loop workers at once on one device: started together (ready/go files), each timed for the same
    seconds; the aggregate samples/s says how many jobs share the GPU without slowing each other."""
    flags = ctx.work / f"loop-{arch}-{procs}"
    flags.mkdir(parents=True, exist_ok=True)
    for f in flags.iterdir():
        f.unlink()
    payload = {**throughput_payload(ctx, [arch]), "arch": arch, "seconds": ctx.sizes.loop_seconds,
               "go": str(flags / "go")}
    running = []
    env = {**ctx.env, "OMP_NUM_THREADS": "1" if not ctx.gpu else "2"}
    try:
        for i in range(procs):
            p = {**payload, "ready": str(flags / f"ready{i}")}
            log = ctx.logs / f"sweep_{arch}_x{procs}_{i}.log"
            fh = open(log, "w")
            cmd = [sys.executable, "-m", "scripts.gpu_report_work", "loop", json.dumps(p)]
            running.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                             start_new_session=True), log, fh))
        while sum((flags / f"ready{i}").exists() for i in range(procs)) < procs:
            if any(p.poll() is not None for p, _, _ in running):
                break
            if ctx.remaining() < 5:
                raise StepError(f"sweep {arch} ×{procs}: workers not ready within the time budget")
            time.sleep(0.05)
        (flags / "go").touch()
        results = []
        for p, log, fh in running:
            try:
                p.wait(timeout=max(1.0, ctx.remaining()))
            except subprocess.TimeoutExpired as err:
                raise StepError(f"sweep {arch} ×{procs}: timed out (time budget)") from err
            fh.close()
            proc = Proc(p.returncode, log.read_text(errors="replace"), 0.0, log)
            if proc.rc != 0:
                raise StepError(f"sweep {arch} ×{procs}: {error_line(proc.output, proc.rc)}", tail(proc.output))
            results.append(parse_result(proc))
    finally:
        for p, _, fh in running:
            if p.poll() is None:
                stop(p)
            fh.close()
    res = {"procs": procs, "sps_each": [r["sps"] for r in results], "sps_total": sum(r["sps"] for r in results)}
    if ctx.gpu:  # device_used_mb: the whole device (all k processes); the context only means something alone
        res.update(peak_reserved_mb=max(r["peak_reserved_mb"] for r in results),
                   device_used_mb=max(r["device_used_mb"] for r in results))
        if procs == 1:
            res["context_mb"] = results[0]["context_mb"]
    return res


def step_sweep_cost(ctx: Context) -> str:
    """Per architecture: GPU-seconds per epoch per job (the job step's measurement), memory per job, how many
    jobs fit on the device by memory, and how aggregate throughput scales with processes sharing it."""
    total_mb = (ctx.report["env"]["device"].get("total_memory_gb") or 0) * 1e9 / 2**20
    out: dict[str, Any] = {}
    parts = []
    for arch in ARCHS:
        job, source = earlier_figures(ctx, f"job_{arch}")
        a: dict[str, Any] = {"job_figures_from": source} if source else {}
        if "job_s_per_epoch" in job:
            a["job_s_per_epoch"] = job["job_s_per_epoch"]
            a["job_block_models"] = job.get("block_models", 0) + 1
        if job.get("peak_reserved_mb"):
            a["job_peak_reserved_mb"] = job["peak_reserved_mb"]
            a["job_context_mb"] = job.get("context_mb", 0.0)
            per_job = job["peak_reserved_mb"] + job.get("context_mb", 0.0)
            a["job_memory_mb"] = per_job
            if total_mb:
                a["jobs_fit_by_memory"] = int(max(0.0, 0.95 * total_mb) // per_job)
        if arch in ctx.sizes.loop_archs:
            runs = {}
            for procs in ctx.sizes.loop_procs:
                runs[procs] = run_concurrent(ctx, arch, procs)
                out[arch] = {**a, "concurrent": {str(k): v for k, v in runs.items()}}
                ctx.figures.update(out)
            a["concurrent"] = {str(k): v for k, v in runs.items()}
            if 1 in runs:  # aggregate samples/s of k processes sharing the device / one process alone
                scaling = {k: v["sps_total"] / runs[1]["sps_total"] for k, v in runs.items()}
                a["throughput_scaling"] = {str(k): v for k, v in scaling.items()}
                if "job_s_per_epoch" in a:  # k jobs sharing the device: each job-epoch costs 1/scaling GPU-time
                    a["gpu_s_per_epoch_per_job_packed"] = {str(k): a["job_s_per_epoch"] / v
                                                           for k, v in scaling.items()}
            best = max(runs, key=lambda k: runs[k]["sps_total"])
            a["best_procs_measured"] = best
        out[arch] = a
        ctx.figures.update(out)
        bits = []
        if "job_s_per_epoch" in a:
            bits.append(f"{a['job_s_per_epoch']:.2f} s/epoch/job")
        if "job_memory_mb" in a:
            bits.append(f"{a['job_memory_mb']:.0f} MB/job" + (f" → {a['jobs_fit_by_memory']} fit"
                                                              if "jobs_fit_by_memory" in a else ""))
        if "throughput_scaling" in a:
            top = max(a["throughput_scaling"])
            bits.append(f"×{top} procs: {a['throughput_scaling'][top]:.2f}× samples/s")
        parts.append(f"{arch} " + ", ".join(bits) if bits else f"{arch} (no job figures)")
    return "; ".join(parts)


def earlier_figures(ctx: Context, step: str) -> tuple[dict[str, Any], str | None]:
    """A finished step's figures: from this report, else from a --previous report (an earlier device call)."""
    rec = ctx.report["steps"].get(step, {})
    if rec.get("status") == "ok":
        return rec.get("figures") or {}, "this report"
    for path in ctx.args.previous:
        rec = json.loads(Path(path).read_text())["steps"].get(step, {})
        if rec.get("status") == "ok":
            return rec.get("figures") or {}, str(path)
    return {}, None


def all_steps(sizes: Sizes) -> list[Step]:
    t = sizes.timeouts
    return [
        Step("tests", "tests", step_tests, t["tests"], "test suite (gpu-marked tests included on CUDA)"),
        *[Step(f"job_{a}", "jobs", make_job_step(a), t["job"], f"one MDL job, {a}, base size, synthetic CIFAR shape")
          for a in ARCHS],
        Step("erasers_device", "erasers", step_erasers_device, t["erasers_device"],
             "LEACE/QLEACE/ALF-QLEACE float64 fit on the device vs CPU"),
        Step("bench_erasers_device", "erasers", step_bench_erasers_device, t["bench_erasers_device"],
             "scripts/bench_erasers.py, ours on the device"),
        Step("bench_erasers_cpu_reference", "erasers", step_bench_erasers_cpu, t["bench_erasers_cpu_reference"],
             "scripts/bench_erasers.py, concept-erasure float64 on CPU"),
        Step("precision", "precision", step_precision, t["precision"], "training.precision fp32|tf32|bf16"),
        Step("bench_mdl", "speed", step_bench_mdl, t["bench_mdl"], "scripts/bench_mdl.py: ours vs naive, bandwidth"),
        Step("throughput", "speed", step_throughput, t["throughput"], "train/eval samples/s per architecture"),
        Step("sweep_cost", "sweep", step_sweep_cost, t["sweep_cost"], "GPU-s per epoch per job, jobs per GPU"),
    ]


def select(steps: list[Step], only: str | None, skip: str | None) -> list[Step]:
    def names(spec: str | None) -> set[str]:
        return {s.strip() for s in (spec or "").split(",") if s.strip()}

    want, drop = names(only), names(skip)
    known = {s.name for s in steps} | {s.group for s in steps}
    if unknown := (want | drop) - known:
        raise SystemExit(f"gpu_report: unknown step(s) {sorted(unknown)}; known: {sorted(known)}")
    return [s for s in steps if (not want or s.name in want or s.group in want) and not {s.name, s.group} & drop]


# ---------------------------------------------------------------------------------------------------- main


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=os.environ.get("OUT") or "outputs/gpu_report",
                   help="output folder (default: $OUT if set, else outputs/gpu_report)")
    p.add_argument("--device", default="auto", help="auto | cuda | cuda:N | cpu (auto: cuda when available)")
    p.add_argument("--toy", action="store_true", help="toy sizes even on a GPU (default without CUDA)")
    p.add_argument("--steps", help="only these steps or groups (comma-separated)")
    p.add_argument("--skip", help="leave out these steps or groups")
    p.add_argument("--budget", type=float, default=None,
                   help="seconds for the whole report (e.g. 560 under a 600 s limit): a step gets at most what is "
                   "left, and is skipped when under 30 s are left")
    p.add_argument("--timeout-scale", type=float, default=1.0, help="multiply every step's own time budget")
    p.add_argument("--pytest-m", default="not slurm", help='GPU mode: the tests step\'s marker expression '
                   '(default "not slurm": the whole suite, slow and gpu tests included; "not slurm and not slow" '
                   'is quicker)')
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
    reports = [json.loads(Path(p).read_text()) for p in paths]
    merged = {**reports[0], "steps": {}, "merged_from": [
        {"path": p, "started": r.get("started"), "argv": r.get("argv"), "device": r.get("env", {}).get("device"),
         "commit": r.get("env", {}).get("git", {}).get("commit")} for p, r in zip(paths, reports, strict=True)]}
    for r in reports:
        for name, rec in r["steps"].items():
            ran = not (rec["status"] == "skipped" and str(rec.get("reason", "")).startswith(("not reached", "no time")))
            if ran or name not in merged["steps"]:
                merged["steps"][name] = rec
    merged["total_s"] = sum(r.get("total_s", 0) for r in reports)
    merged["finished"] = all(r.get("finished") for r in reports)
    out.mkdir(parents=True, exist_ok=True)
    write_report(merged, out)
    print(f"[gpu-report] merged {len(paths)} reports → {out / JSON_NAME}", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.merge:
        return merge(args.merge, Path(args.out))
    report: dict[str, Any] = {"schema": "erasure-mdl gpu-report 1", "started": now(), "finished": False,
                              "argv": sys.argv[1:] if argv is None else argv, "env": {}, "steps": {}}
    env = ensure_packages(report["env"])
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
    report["mode"] = "toy" if toy else "gpu"
    report["device"] = args.device
    report["env"].update(environment(args))
    add_versions(report["env"])
    report["sizes"] = dataclasses.asdict(sizes)
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
        print(f"[gpu-report] {report['mode']} mode on {report['env']['device']['name']}; writing {out / JSON_NAME}",
              flush=True)
        try:
            run_steps(steps, ctx, report, args.budget)
        except Killed:
            print("[gpu-report] stopped; the report holds every finished step", flush=True)
            return 130
        report["finished"] = True
        write_report(report, out)
    c = report["counts"]
    print(f"[gpu-report] done in {report.get('total_s', 0):.0f} s: {c['ok']} ok, {c['failed']} failed, "
          f"{c['skipped']} skipped → {out / JSON_NAME}, {out / MD_NAME}", flush=True)
    return 1 if c["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
