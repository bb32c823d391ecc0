"""tools/gpu_report.py's step runner: each step within its time budget, its subprocesses stopped on its
deadline, ok/failed/skipped recorded and the report rewritten after every step."""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tools.gpu_report_model import Report, StepRecord
from tools.gpu_report_output import now, write_report
from tools.gpu_report_payload import Payload
from tools.gpu_report_sizes import Sizes

ROOT = Path(__file__).resolve().parents[1]


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

    def __init__(self, args: argparse.Namespace, sizes: Sizes, report: Report, env: dict[str, str]) -> None:
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

    def work_result(self, kind: str, payload: Payload, log: str, **kw: Any) -> dict[str, Any]:
        """tools/gpu_report_work.py <kind> in a fresh process; its `RESULT {json}` line."""
        proc = self.python(["-m", "tools.gpu_report_work", kind, payload.to_json()], log, **kw)
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
            summary = step.fn(ctx)
            rec.status, rec.summary, rec.error = "ok", summary or "", None
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
