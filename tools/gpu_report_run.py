"""tools/gpu_report.py's frame: the report as types (the one reader and writer of its JSON; a record keeps the keys it
does not declare in `extra`, so a newer report read by older code loses nothing), its two files (the JSON, strict:
non-finite figures become null, and its markdown), the sizes of the GPU run and of the CPU toy run, and the step
runner (each step within its time budget, its subprocesses stopped on its deadline, ok/failed/skipped recorded and
the report rewritten after every step). Standard library only: the GPU machine runs it with nothing but the wheels.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import math
import os
import re
import signal
import subprocess
import time
import traceback
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, TypeVar

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------------------------------------------ the report

SCHEMA = "erasure-mdl gpu-report 1"
STATUSES = ("ok", "failed", "skipped")
NOT_RUN = ("not reached", "no time")  # a skipped step's reason when the report never ran it (budget, end)
R = TypeVar("R")


def build(cls: type[R], raw: Any) -> R:
    """`cls` from a JSON object: its declared fields, the other keys in `extra` (when `cls` has it)."""
    raw = raw if isinstance(raw, dict) else {}
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    known = {k: v for k, v in raw.items() if k in names and k != "extra"}
    if "extra" in names:
        known["extra"] = {k: v for k, v in raw.items() if k not in names}
    return cls(**known)


def as_json(obj: Any) -> dict[str, Any]:
    """A record as JSON: its fields but None, `extra` merged back in."""
    out = {f.name: v for f in dataclasses.fields(obj) if f.name != "extra" and (v := getattr(obj, f.name)) is not None}
    return {**getattr(obj, "extra", {}), **out}


@dataclass
class StepRecord:
    """One step: its status (ok | failed | skipped), why (summary, reason or error), its time and figures."""

    group: str = ""
    title: str = ""
    status: str = "skipped"
    reason: str | None = None
    error: str | None = None
    tail: str | None = None
    summary: str | None = None
    started: str | None = None
    timeout_s: float | None = None
    seconds: float | None = None
    cpu_s: float | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def line(self) -> str:
        return self.summary or self.reason or self.error or ""

    @property
    def ran(self) -> bool:
        """False for a step the report skipped without trying it (no time left, or it ended before)."""
        return not (self.status == "skipped" and str(self.reason or "").startswith(NOT_RUN))


@dataclass
class Report:
    """The whole report: what ran where (env), each step's record, in order, and the totals."""

    started: str = "?"
    argv: list[str] = field(default_factory=list)
    schema: str = SCHEMA
    mode: str = "toy"
    device: str = "cpu"
    finished: bool = False
    total_s: float = 0.0
    updated: str | None = None
    env: dict[str, Any] = field(default_factory=dict)  # python, torch, cuda(nn), host, git, device, packages, install
    sizes: dict[str, Any] = field(default_factory=dict)
    steps: dict[str, StepRecord] = field(default_factory=dict)
    merged_from: list[dict[str, Any]] | None = None

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.steps.values()) for s in STATUSES}

    def to_json(self) -> dict[str, Any]:
        return {**as_json(self), "steps": {n: as_json(r) for n, r in self.steps.items()}, "counts": self.counts}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Report:
        rep = build(cls, raw)
        rep.steps = {n: build(StepRecord, r) for n, r in rep.steps.items()}
        return rep

    def ok_figures(self, step: str) -> dict[str, Any] | None:
        """The figures of `step` if it finished ok in this report."""
        return self.steps[step].figures if step in self.steps and self.steps[step].status == "ok" else None


# ------------------------------------------------------------------------------------------- its two files

JSON_NAME, MD_NAME = "gpu_report.json", "gpu_report.md"


def finite(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become None (the JSON stays strict; the test checks figures are finite)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    return [finite(v) for v in value] if isinstance(value, list | tuple) else value


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_report(report: Report, out: Path) -> None:
    """Both files, atomically (temp file + rename): a kill while writing leaves the previous version."""
    report.updated = now()
    for name, text in ((JSON_NAME, json.dumps(finite(report.to_json()), indent=1, allow_nan=False)),
                       (MD_NAME, markdown(report))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text + "\n")
        os.replace(tmp, out / name)


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


def markdown(report: Report) -> str:
    env, c = report.env, report.counts
    dev, git, name = env.get("device", {}), env.get("git", {}), env.get("device", {}).get("name", "?")
    lines = [f"# GPU report: {name} ({report.mode} mode)", "",
             f"- device: {name}" + (f", {gb:.1f} GB" if (gb := dev.get("total_memory_gb")) else "")
             + f"; host CPU: {env.get('host', {}).get('cpu', '?')}",
             f"- python {env.get('python', '?')}, torch {env.get('torch', '?')} (CUDA {env.get('cuda') or '-'}), "
             f"commit {git.get('commit', '?')}" + (" (with uncommitted changes)" if git.get("dirty") else "")
             + f", source digest {git.get('tree_digest', '?')}",
             f"- started {report.started}, updated {report.updated or '?'}, {report.total_s:.0f} s; steps: "
             f"{c['ok']} ok, {c['failed']} failed, {c['skipped']} skipped"
             + ("" if report.finished else " (not finished)"), ""]
    if missing := env.get("install", {}).get("missing"):
        lines += [f"- not importable: {', '.join(missing)}", ""]
    lines += ["| step | status | seconds | result |", "|---|---|---:|---|"]
    lines += [f"| {name} | {r.status} | {'' if r.seconds is None else r.seconds} | {r.line.replace('|', '/')} |"
              for name, r in report.steps.items()]
    if failed := [(n, r) for n, r in report.steps.items() if r.status == "failed"]:
        lines += ["", "## Failures"]
        for name, r in failed:
            lines += ["", f"### {name}", "", f"`{r.error or ''}`"] + (["", "```", r.tail, "```"] if r.tail else [])
    lines += ["", "## Figures"]
    for name, r in report.steps.items():
        if r.figures:
            items = list(flat_items(r.figures))
            lines += ["", f"### {name}", ""] + [f"- {k}: {fmt(v)}" for k, v in items if not k.endswith("failures")]
            for k, v in items:
                if k.endswith("failures") and v:
                    lines += [f"- {k}:"] + [f"  - {x}" for x in v]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- the sizes

ARCHS = ("mlp", "lenet", "convnext", "swin")


@dataclass(frozen=True)
class Sizes:
    """Everything that differs between the GPU run and the CPU toy run."""

    pytest_args: tuple[str, ...]
    job_data: tuple[str, ...]  # dataset overrides of the architecture jobs
    job_mdl: tuple[str, ...]  # mdl overrides (capped epoch budget)
    arch: dict[str, tuple[str, ...]]  # per-architecture overrides (GPU: none, the presets' base sizes)
    shape: tuple[int, int, int]
    n: int
    eraser: dict[str, Any]  # erasers_device: n × d data of k classes, ALF-QLEACE's alf_max_rank
    bench_erasers: tuple[str, ...]  # shared args of both bench_erasers runs
    bench_erasers_device_methods: str
    bench_erasers_cpu_methods: str
    bench_mdl: tuple[str, ...]
    # throughput and the sweep-cost loops: rows trained on (subset), validation rows (val), models in one vectorised
    # group (group); quick (toy): one epoch per figure, no warm-up
    throughput: dict[str, Any]
    loop_archs: tuple[str, ...]
    loop_procs: tuple[int, ...]
    loop_seconds: float
    timeouts: dict[str, float]


TIMED = ("tests", "job", "erasers_device", "bench_erasers_device", "bench_erasers_cpu_reference", "bench_mdl",
         "throughput", "sweep_cost", "cell")
GPU_EPOCHS = 2
GPU = Sizes(
    pytest_args=(),  # the marker expression is --pytest-m
    job_data=("dataset=synthetic", "dataset.n=50000", "dataset.channels=3", "dataset.size=32",
              "dataset.num_classes=10", "dataset.augment=true"),
    # the epoch cap is the budget: no step floor keeps a small block (or the MLP's 1000-step warm-up) going
    job_mdl=("mdl=prequential", f"mdl.max_epochs={GPU_EPOCHS}", f"mdl.patience={GPU_EPOCHS}",
             "mdl.stop_after_warmup=false"),
    arch={a: () for a in ARCHS},
    shape=(3, 32, 32), n=50_000,
    eraser=dict(n=20_000, d=1024, k=10, alf_max_rank=64),
    bench_erasers=("--n", "50000", "--d", "3072", "--k", "10"),
    bench_erasers_device_methods="ours_leace,ours_qleace,ours_alf",
    bench_erasers_cpu_methods="ce_leace,ce_qleace",
    bench_mdl=("--repeats", "1"),
    throughput=dict(subset=10_000, val=2048, group=10, quick=False),
    loop_archs=ARCHS, loop_procs=(1, 4), loop_seconds=5.0,
    # each step's own cap (the H100 run, 2026-11-27: gpu tests 49 s, jobs 17-109 s, throughput 40 s, 5-seed sweep 53 s);
    # the whole report's default budget (tools/gpu_report.py DEFAULT_BUDGET) decides what one call reaches
    timeouts=dict(zip(TIMED, (150, 180, 120, 90, 150, 150, 120, 150, 150), strict=True)),
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
    eraser=dict(n=600, d=24, k=3, alf_max_rank=4),
    bench_erasers=("--n", "600", "--d", "24", "--k", "3", "--rank", "4"),
    bench_erasers_device_methods="ours_leace,ce_leace",  # the device is the CPU: both in one run
    bench_erasers_cpu_methods="",
    bench_mdl=("--n", "1500", "--d", "12", "--epochs", "1", "--seeds", "1", "--repeats", "1", "--threads", "1"),
    throughput=dict(subset=128, val=64, group=2, quick=True),
    loop_archs=("mlp",), loop_procs=(1,), loop_seconds=0.3,
    timeouts={**dict.fromkeys(TIMED, 60.0), "cell": 120.0},
)


# ------------------------------------------------------------------------------------------------ the runner

class StepError(Exception):
    """A step failed: `line` is its one-line error, `tail` the end of the output that explains it."""

    def __init__(self, line: str, tail: str = "") -> None:
        super().__init__(line)
        self.line, self.tail = line, tail


class StepSkipped(Exception):
    """The step cannot apply here (its reason is the message)."""


class Killed(BaseException):
    """SIGTERM/SIGINT: the report is being stopped (the tool's time limit)."""


@dataclass
class Step:
    name: str
    group: str
    fn: Callable[[Context], str | None]  # fills ctx.figures; returns a one-line summary
    timeout: float
    title: str


def tail(text: str, lines: int = 40, chars: int = 4000) -> str:
    return "\n".join(text.rstrip().splitlines()[-lines:])[-chars:]


@dataclass
class Proc:
    rc: int
    output: str
    seconds: float
    log: Path

    @property
    def tail(self) -> str:
        return tail(self.output)

    def failure(self) -> StepError:
        return StepError(f"{self.log.stem}: {error_line(self.output, self.rc)}", self.tail)


ERROR_LINE = re.compile(r"^(\w+\.)*\w*(Error|Exception|Interrupt|Exit|Failed)\b.*|^error: .*|^E\s+\w+Error.*")


def error_line(output: str, rc: int) -> str:
    """The last line of `output` that names an error (a Python exception, the harness's `error:` line), else rc."""
    lines = [ln.strip() for ln in reversed(output.strip().splitlines())]
    return next((ln[:300] for ln in lines if ERROR_LINE.match(ln)), f"exit code {rc}")


class Context:
    """What a step function gets: sizes, device, output folders, a subprocess runner bound to the step's budget,
    `figures` to fill (kept even when the step fails half-way) and the report so far."""

    def __init__(self, args: argparse.Namespace, sizes: Sizes, report: Report, env: dict[str, str]) -> None:
        self.args, self.sizes, self.report, self.env = args, sizes, report, env
        self.out, self.work, self.device = Path(args.out), Path(args.work), args.device
        self.logs = self.out / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.gpu = args.device.startswith("cuda")
        self.figures: dict[str, Any] = {}
        self.deadline = math.inf
        self.step = ""

    def run(self, cmd: list[str], log: str, env: dict[str, str] | None = None, check: bool = True) -> Proc:
        """Run `cmd` in ROOT (`run_at_once` with one command)."""
        if self.deadline - time.monotonic() <= 1:
            raise StepError(f"no time left in the step's budget before {log}")
        return run_at_once(self, [(cmd, log)], env or self.env, check)[0]


def run_at_once(ctx: Context, commands: list[tuple[list[str], str]], env: dict[str, str],
                check: bool = True) -> list[Proc]:
    """Start every command at once in ROOT, each in its own process group with its output in logs/<log>.log, and wait
    for all within the step's budget: on its deadline every group is stopped and the step fails with the tail of the
    output of one still running; with `check` a command that fails fails the step. Each one's exit code, output and
    own seconds."""
    started: list[tuple[subprocess.Popen[bytes], Path, IO[str]]] = []
    ends: dict[int, float] = {}
    t0 = time.monotonic()
    try:
        for cmd, log in commands:
            path = ctx.logs / f"{log}.log"
            fh = open(path, "w")  # noqa: SIM115 - closed in the finally below
            fh.write("$ " + " ".join(cmd) + "\n")
            fh.flush()
            started.append((subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                             start_new_session=True), path, fh))
        while len(ends) < len(started):
            ends.update({i: time.monotonic() - t0 for i, (p, _, _) in enumerate(started)
                         if i not in ends and p.poll() is not None})
            if len(ends) < len(started) and time.monotonic() > ctx.deadline:
                running = next(path for i, (_, path, _) in enumerate(started) if i not in ends)
                raise StepError(f"{', '.join(log for _, log in commands)}: timed out after {time.monotonic() - t0:.0f} "
                                "s (time budget)", tail(running.read_text(errors="replace")))
            time.sleep(0.02)
    finally:
        for p, _, handle in started:
            if p.poll() is None:
                stop(p)
            handle.close()
    procs = [Proc(p.returncode, path.read_text(errors="replace"), ends[i], path)
             for i, (p, path, _) in enumerate(started)]
    for proc in procs if check else ():
        if proc.rc != 0:
            raise proc.failure()
    return procs


def parse_result(proc: Proc) -> dict[str, Any]:
    lines = [ln for ln in proc.output.splitlines() if ln.startswith("RESULT ")]
    if not lines:
        raise StepError(f"{proc.log.stem}: no RESULT line", proc.tail)
    return json.loads(lines[-1].removeprefix("RESULT "))


def stop(proc: subprocess.Popen[Any]) -> None:
    """Stop a process we started and its group (pytest-xdist workers, benchmark workers): TERM, then KILL."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
            proc.wait(timeout=10)
            return
        except ProcessLookupError:
            return
        except subprocess.TimeoutExpired:
            continue


def cpu_seconds() -> float:
    import resource

    return sum(r.ru_utime + r.ru_stime for r in (resource.getrusage(resource.RUSAGE_SELF),
                                                  resource.getrusage(resource.RUSAGE_CHILDREN)))


def run_steps(steps: list[Step], ctx: Context, report: Report, budget: float | None) -> None:
    """Run each step within its own time budget, recording ok/failed/skipped, and rewrite the report every time."""
    t_start = time.monotonic()
    for step in steps:
        report.steps[step.name] = StepRecord(step.group, step.title,
                                             reason="not reached: the report ended before this step")
    write_report(report, ctx.out)
    for step in steps:
        left = math.inf if budget is None else budget - (time.monotonic() - t_start)
        if left < min(30.0, step.timeout):
            report.steps[step.name].reason = f"no time left in --budget ({max(left, 0):.0f} s)"
            write_report(report, ctx.out)
            continue
        timeout = min(step.timeout, left)
        rec = report.steps[step.name] = StepRecord(step.group, step.title, "failed", timeout_s=timeout, started=now(),
                                                   error="did not finish: the report was stopped during this step")
        write_report(report, ctx.out)
        ctx.figures, ctx.step = {}, step.name
        t0, c0 = time.monotonic(), cpu_seconds()
        ctx.deadline = t0 + timeout
        print(f"[gpu-report] {step.name}: {step.title} (budget {timeout:.0f} s)", flush=True)
        try:
            rec.status, rec.summary, rec.error = "ok", step.fn(ctx) or "", None
        except StepSkipped as err:
            rec.status, rec.reason, rec.error = "skipped", str(err), None
        except StepError as err:
            rec.error, rec.tail = err.line, err.tail
        except Killed:
            rec.seconds, rec.figures, rec.error = time.monotonic() - t0, ctx.figures, "killed (SIGTERM/SIGINT)"
            write_report(report, ctx.out)
            raise
        except Exception as err:
            rec.error = f"{type(err).__name__}: {err}".splitlines()[0][:300]
            rec.tail = tail(traceback.format_exc())
        rec.seconds = round(time.monotonic() - t0, 2)
        rec.cpu_s = round(cpu_seconds() - c0, 2)  # this process and its finished children
        rec.figures = ctx.figures
        report.total_s = round(time.monotonic() - t_start, 1)
        write_report(report, ctx.out)
        print(f"[gpu-report] {step.name}: {rec.status} in {rec.seconds:.1f} s  {rec.line}", flush=True)
