"""scripts/gpu_report.py's `cell` step: one MDL cell with 5 seeds (MLP at the paper's base size on the job steps'
CIFAR-shaped synthetic data; toy sizes without CUDA) run (a) as 5 one-seed `python -m training.run seed=k` processes
at once on the one device and (b) as one job, `seeds=5` (one process; on CUDA the stacked engine trains the 5 seeds'
block models in one lockstep group, training/tasks/mdl/cell.py).

Records both wall times and their ratio (a)/(b) (the goal on a GPU: at least 4x), each process's peak memory (per
process: (a)'s is the sum of its five processes' peaks), whether every seed's result.json is == between (a) and (b)
(scripts/bench_sweep.py's comparison: wall times aside) and whether the cell's group formed (its log). Numbers that
differ or a group that did not form are flagged, not failed: the step fails only when a run fails.
"""

from __future__ import annotations

import dataclasses
import json
import math
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any

from scripts.bench_sweep import differences, results, time_split
from scripts.gpu_report_model import build
from scripts.gpu_report_payload import Payload
from scripts.gpu_report_runner import ROOT, Context, StepError, error_line, stop, tail
from scripts.gpu_report_steps import job_overrides
from training.engine.numerics import bits_tolerance

SEEDS = 5
ARCH = "mlp"
# the cell's log lines (training/tasks/mdl/cell.py) that say what its group did
GROUP_FORMED = f"cell: {SEEDS} seeds'"
GROUP_FAILED = "the cell's group failed"
MEMORY_NOTE = ("per-process peaks (torch.cuda.max_memory_reserved on CUDA, max RSS on CPU): lone_memory_mb is the "
               "sum over the 5 processes, cell_memory_mb the one process's; on CUDA each process also holds a CUDA "
               "context (context_mb, measured in the cell's process, which ran alone): the *_with_contexts_mb figures "
               "add 5 of them to the lone sum and one to the cell")


@dataclasses.dataclass(frozen=True)
class ProcessMemory:
    """A job process's memory file (gpu_report_work `_memory`): the CUDA figures, or max RSS on CPU."""

    peak_allocated_mb: float | None = None
    peak_reserved_mb: float | None = None
    context_mb: float | None = None  # device used beyond torch's cache: only this process's when it ran alone
    peak_rss_mb: float | None = None

    @property
    def peak_mb(self) -> float | None:
        """torch's peak reserved memory on CUDA, else the peak RSS."""
        return self.peak_reserved_mb if self.peak_reserved_mb is not None else self.peak_rss_mb


def read_memory(path: Path) -> ProcessMemory | None:
    return build(ProcessMemory, json.loads(path.read_text())) if path.exists() else None


def memory_figures(lone: Sequence[ProcessMemory | None], cell: ProcessMemory | None) -> dict[str, Any]:
    """The lone processes' peaks (each, and summed when all five are known), the cell's, and on CUDA both with the
    CUDA context of each process (the cell's, measured alone: a lone process's own reads the others' memory too)."""
    out: dict[str, Any] = {}
    peaks = [m.peak_mb for m in lone if m is not None and m.peak_mb is not None]
    if len(peaks) == len(lone):
        out.update(lone_memory_mb=sum(peaks), lone_memory_each_mb=peaks)
    if cell is None or cell.peak_mb is None:
        return out
    out["cell_memory_mb"] = cell.peak_mb
    if cell.context_mb is not None:
        out.update(context_mb=cell.context_mb, cell_memory_with_contexts_mb=cell.peak_mb + cell.context_mb)
        if "lone_memory_mb" in out:
            out["lone_memory_with_contexts_mb"] = out["lone_memory_mb"] + len(lone) * cell.context_mb
    return out


def deviation(lone: dict[str, dict[str, Any]], cell: dict[str, dict[str, Any]]) -> dict[str, float]:
    """The largest |Δ bits/sample| between a seed alone and in the cell, the cell's seed SD (of the lone jobs) and the
    numerics contract's tolerance for it (training/engine/numerics.py: max(1e-3, 0.05 × seed SD))."""
    key = "mdl.bits_per_sample"
    both = [j for j in sorted(set(lone) & set(cell)) if key in lone[j] and key in cell[j]]
    dev = max((abs(float(lone[j][key]) - float(cell[j][key])) for j in both), default=0.0)
    bits = [float(lone[j][key]) for j in both]
    sd = statistics.stdev(bits) if len(bits) > 1 else math.nan
    return {"max_abs_bits_deviation": dev, "seed_sd_bits": sd, "tolerance_bits": bits_tolerance(sd),
            "deviation_over_seed_sd": dev / sd if sd > 0 else math.nan}


def cell_checks(lone: dict[str, dict[str, Any]], cell: dict[str, dict[str, Any]], cell_log: str,
                bitwise: bool = True) -> dict[str, Any]:
    """Whether every seed's numbers are == between the lone processes and the cell, and otherwise within the
    numerics contract's tolerance (`bitwise`: the CPU loop engine, where only == holds it); whether the cell's group
    formed; and the flags a reader must see (none when all is as expected)."""
    diff = differences(lone, cell)
    dev = deviation(lone, cell)
    within = not diff or (not bitwise and dev["max_abs_bits_deviation"] <= dev["tolerance_bits"])
    formed = [ln[ln.index(GROUP_FORMED):] for ln in cell_log.splitlines() if GROUP_FORMED in ln]
    failed = GROUP_FAILED in cell_log
    flags = []
    if not within:
        what = "the CPU loop engine is bitwise" if bitwise else (
            f"max |Δ bits/sample| {dev['max_abs_bits_deviation']:.3g} > tolerance {dev['tolerance_bits']:.3g}")
        flags.append(f"numbers differ between the lone processes and the cell in {len(diff)} place(s) ({what}), "
                     f"e.g. {diff[0]}")
    if not formed:
        flags.append(f"the cell's group did not form (no '{GROUP_FORMED}' line in its log)")
    if failed:
        flags.append("the cell's group failed: each seed's models trained in its own group")
    return {"equal": not diff, "within_tolerance": within, **dev, "differences": diff[:10],
            "group_formed": bool(formed), "group_line": formed[0] if formed else None, "group_failed": failed,
            "flags": flags}


def job_command(ctx: Context, overrides: list[str], memory_file: Path) -> list[str]:
    """`python -m training.run <overrides>` through gpu_report_work `job` (the process's peak memory to a file)."""
    memory_file.unlink(missing_ok=True)
    payload = Payload(overrides=overrides, memory_file=str(memory_file), device=ctx.device)
    return [sys.executable, "-m", "scripts.gpu_report_work", "job", payload.to_json()]


def run_at_once(ctx: Context, commands: list[tuple[list[str], str]], env: dict[str, str]) -> tuple[float, list[float]]:
    """Start every command at once (each its own log and process group); wait for all within the step's budget.
    The wall time from the first start to the last exit, and each one's own seconds."""
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
            for i, (p, _, _) in enumerate(started):
                if i not in ends and p.poll() is not None:
                    ends[i] = time.monotonic() - t0
            if len(ends) < len(started) and ctx.remaining() < 0:
                raise StepError(f"{', '.join(log for _, log in commands)}: timed out after "
                                f"{time.monotonic() - t0:.0f} s (time budget)")
            time.sleep(0.02)
    finally:
        for p, _, handle in started:
            if p.poll() is None:
                stop(p)
            handle.close()
    for p, path, _ in started:
        if p.returncode != 0:
            output = path.read_text(errors="replace")
            raise StepError(f"{path.stem}: {error_line(output, p.returncode)}", tail(output))
    return max(ends.values()), [ends[i] for i in range(len(started))]


def step_cell(ctx: Context) -> str:
    seeds = [str(s) for s in range(SEEDS)]
    outs = {"lone": ctx.out / "runs" / "cell_lone", "cell": ctx.out / "runs" / "cell_together"}
    for out in outs.values():
        shutil.rmtree(out, ignore_errors=True)  # fresh jobs: an earlier result here would be reused, not timed
    # CPU threads: the concurrent processes as sweep_cost's (2 each on a GPU), the cell as a job step's (8)
    threads = ctx.env.get("OMP_NUM_THREADS", "1")
    lone_threads, cell_threads = ("2", "8") if ctx.gpu else (threads, threads)
    f = ctx.figures
    f.update(seeds=SEEDS, arch=ARCH, device=ctx.device, lone_omp_threads=int(lone_threads),
             cell_omp_threads=int(cell_threads), memory_note=MEMORY_NOTE)

    lone_mem = [ctx.work / f"cell_lone_{s}.memory.json" for s in seeds]
    commands = [(job_command(ctx, job_overrides(ctx, ARCH, outs["lone"], seed=s), mem), f"cell_lone_seed{s}")
                for s, mem in zip(seeds, lone_mem, strict=True)]
    f["lone_overrides"] = " ".join(job_overrides(ctx, ARCH, outs["lone"], seed="<s>"))
    lone_wall, each = run_at_once(ctx, commands, {**ctx.env, "OMP_NUM_THREADS": lone_threads})
    f.update(lone_wall_s=lone_wall, lone_each_s=each)
    lone_memory = [read_memory(m) for m in lone_mem]

    cell_mem = ctx.work / "cell_together.memory.json"
    overrides = job_overrides(ctx, ARCH, outs["cell"], [f"seeds={SEEDS}"], seed=None)
    f["cell_overrides"] = " ".join(overrides)
    proc = ctx.run(job_command(ctx, overrides, cell_mem), "cell_together",
                   env={**ctx.env, "OMP_NUM_THREADS": cell_threads}, check=False)
    f["cell_wall_s"] = proc.seconds
    f.update(memory_figures(lone_memory, read_memory(cell_mem)))
    if proc.rc != 0:
        raise StepError(f"cell_together: {error_line(proc.output, proc.rc)}", tail(proc.output))

    lone, cell = results(outs["lone"]), results(outs["cell"])
    if len(lone) != SEEDS or len(cell) != SEEDS:
        raise StepError(f"cell: {len(lone)} and {len(cell)} result.json files of {SEEDS} (lone, cell)")
    f["ratio"] = lone_wall / proc.seconds
    f["bits_per_sample"] = {job: r["mdl.bits_per_sample"] for job, r in cell.items()}
    f["jobs_time_s"] = {"lone": time_split(lone), "cell": time_split(cell)}
    f.update(cell_checks(lone, cell, proc.output, bitwise=not ctx.gpu))
    mem = ""
    suffix = "_with_contexts_mb" if "lone_memory_with_contexts_mb" in f else "_mb"
    if f"lone_memory{suffix}" in f and f"cell_memory{suffix}" in f:
        mem = f", peak memory {f[f'lone_memory{suffix}']:.0f} MB (5 processes, summed) vs " \
              f"{f[f'cell_memory{suffix}']:.0f} MB"
    dev = (f"max |Δ bits/sample| {f['max_abs_bits_deviation']:.2g} = {f['deviation_over_seed_sd']:.2g} × seed SD "
           f"(tolerance {f['tolerance_bits']:.2g})")
    verdict = "numbers ==" if f["equal"] else f"within tolerance: {dev}" if f["within_tolerance"] else \
        f"OUTSIDE TOLERANCE: {dev}"
    group = "group formed" if f["group_formed"] else "NO GROUP"
    flags = f"; flags: {' / '.join(f['flags'])}" if f["flags"] else ""
    return (f"{SEEDS} processes {lone_wall:.1f} s, cell {proc.seconds:.1f} s: {f['ratio']:.2f}×{mem}; {verdict}, "
            f"{group}{flags}")
