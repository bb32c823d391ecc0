"""tools/gpu_report.py's steps, and the measurements they run in fresh subprocesses (clean peak memory, a crash
stays contained): `python -m tools.gpu_report_steps <kind> '<json payload>'` prints `RESULT {json}` as its last line.
Kinds: `device` (the CUDA device, asked here so the report's own process holds no CUDA context), `job` (python -m
training.run, then the process's peak memory), `erasers` (float64 fits on the device vs on CPU), `throughput`
(samples/s per architecture through the job's own Trainer), `loop` (a fixed-duration training loop, several started at
once: how many jobs share one GPU). docs/speed.md ("GPU report") says what each step measures.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import math
import os
import re
import shutil
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

import erasure
import training  # noqa: F401  (registers the resolvers conf/ uses)
from tools import gpu_report_run as frame
from tools.bench_erasers import make_data
from tools.bench_mdl import NUM_CLASSES, epoch_seconds, sync, synthetic
from tools.bench_sweep import differences, results, time_split
from tools.bench_worker import job_config, peak_mb
from tools.gpu_report_run import Context, StepError
from tools.heavy_tests import testcases
from training.app.tasks import load_job
from training.app.tasks import read_any as read_result
from training.engine.augment import crop_flip
from training.engine.fit import cross_entropy_sum
from training.engine.group import GroupOptions, why_not_vectorized
from training.engine.numerics import JobNumerics, bits_tolerance
from training.tasks.mdl.result import MdlResult
from training.tasks.mdl.splits import make_split
from training.tasks.mdl.trainer import Trainer

OPTIONAL = ("pytest", "xdist", "concept_erasure", "numba", "submitit", "wandb")  # some tests/steps need them


@dataclass(frozen=True)
class Payload:
    """A measurement's JSON argument: each kind reads its own fields (a key not declared here is refused)."""

    device: str = "cpu"
    threads: int | None = None  # the worker's torch threads (None: torch's own)
    overrides: list[str] = field(default_factory=list)  # job: training.run's; throughput and loop: config extras
    memory_file: str = ""  # job: where its peak memory goes
    n: int = 0  # erasers: n × d data of k classes, ALF-QLEACE's max_rank; throughput and loop: n rows of `shape`
    d: int = 0
    k: int = 0
    alf_max_rank: int = 0
    archs: list[str] = field(default_factory=list)
    shape: list[int] = field(default_factory=list)
    arch_overrides: dict[str, list[str]] = field(default_factory=dict)
    subset: int = 0  # rows trained on
    val: int = 0
    group: int = 1  # throughput: models trained at once in one vectorised group
    quick: bool = False  # toy run: one epoch per figure, no warm-up (the path, not the figure)
    arch: str = ""  # loop: one architecture for `seconds`, once all `procs` workers have touched a file in `ready`
    seconds: float = 0.0
    ready: str = ""
    procs: int = 1


def command(kind: str, payload: Payload) -> list[str]:
    return [sys.executable, "-m", "tools.gpu_report_steps", kind, json.dumps(dataclasses.asdict(payload))]


# ---------------------------------------------------------------------------------------------------- steps


def job_overrides(ctx: Context, arch: str, out: Path, extra: Iterable[str] = (), seed: str | None = "0") -> list[str]:
    """A job's overrides; `seed`: its one seed (None: the cell's `seeds`, given in `extra`)."""
    s = ctx.sizes
    return [f"arch={arch}", *s.arch[arch], *s.job_data, *s.job_mdl, "eraser=control",
            *([f"seed={seed}"] if seed is not None else []), f"device={ctx.device}", "logger=none", "progress=false",
            "certificate=false", f"paths.out_dir={out}", f"paths.cache_dir={ctx.work / 'cache'}", *extra]


def job_command(ctx: Context, overrides: list[str], memory_file: Path) -> list[str]:
    """`python -m training.run <overrides>` through the `job` measurement (the process's peak memory to a file)."""
    memory_file.unlink(missing_ok=True)
    return command("job", Payload(overrides=overrides, memory_file=str(memory_file), device=ctx.device))


def run_job(ctx: Context, arch: str) -> str:
    """The job_<arch> step: one MDL job of `arch`; bits/sample, wall time, epochs/steps, peak memory."""
    name = f"job_{arch}"
    out = ctx.out / "runs" / name
    shutil.rmtree(out, ignore_errors=True)  # a fresh job: an earlier result here would be reused, not timed
    memory_file = ctx.work / f"{name}.memory.json"
    overrides = job_overrides(ctx, arch, out)
    env = {**ctx.env, "OMP_NUM_THREADS": "8" if ctx.gpu else ctx.env.get("OMP_NUM_THREADS", "1")}
    proc = ctx.run(job_command(ctx, overrides, memory_file), name, env=env, check=False)
    f = ctx.figures
    f.update(overrides=" ".join(overrides), wall_s=proc.seconds)
    if memory_file.exists():
        f.update(json.loads(memory_file.read_text()))
    found = sorted(out.rglob("result.json"), key=lambda p: p.stat().st_mtime)
    if proc.rc != 0 or not found:
        raise proc.failure()
    res = read_result(found[-1])
    if not isinstance(res, MdlResult) or res.body.mdl is None:
        raise StepError(f"{name}: {found[-1]} is not an MDL result")
    mdl, final, timings = res.body.mdl, res.body.final, res.timings
    model = res.section("model") or {}
    epochs = [b.epochs or 0 for b in mdl.blocks] + [final.epochs or 0 if final else 0]
    f.update({
        "bits_per_sample": mdl.bits_per_sample, "legacy": mdl.legacy if mdl.has_legacy else None,
        "protocol": mdl.protocol, "n_coded": mdl.n_coded, "block_models": len(mdl.blocks),
        "epochs_per_block": [b.epochs for b in mdl.blocks],
        "steps_total": sum(b.steps or 0 for b in mdl.blocks) + (final.steps or 0 if final else 0),
        "full_run_epochs": final.epochs if final else None, "params": model["params"] if "params" in model else None,
        "timings": dict(timings), "device": res.device, "result": str(found[-1].relative_to(ctx.out)),
        "train_s": sum(float(timings[k]) for k in ("mdl_s", "full_run_s") if k in timings)})
    f["job_s_per_epoch"] = f["train_s"] / (max(epochs) or 1)  # all block models + the full run, one epoch each
    mem = f", peak {f['peak_reserved_mb']:.0f} MB reserved" if "peak_reserved_mb" in f else ""
    return (f"{f['bits_per_sample']:.4f} bits/sample, {f['wall_s']:.1f} s wall ({f['train_s']:.1f} s training, "
            f"{f['job_s_per_epoch']:.2f} s/epoch), {f['steps_total']} steps{mem}")


def step_erasers_device(ctx: Context) -> str:
    payload = Payload(**ctx.sizes.eraser, device=ctx.device, threads=len(os.sched_getaffinity(0)))
    res = frame.parse_result(ctx.run(command("erasers", payload), "erasers_device"))
    ctx.figures.update(res)
    return "max |Δ erased| device vs CPU: " + ", ".join(
        f"{n} {res[n]['max_abs_diff']:.1e}" for n in ("leace", "qleace", "alf_qleace"))


def run_bench(ctx: Context, module: str, args: list[str], log: str) -> dict[str, Any]:
    """`python -m tools.<module> <args> --json FILE` into the figures; on a failure or the time limit, what the bench
    wrote before (bench_erasers rewrites it after every method) as `finished_methods`."""
    path = ctx.work / f"{log}.json"
    path.unlink(missing_ok=True)
    try:
        ctx.run([sys.executable, "-m", f"tools.{module}", *args, "--json", str(path)], log)
    except StepError:
        if path.exists():
            ctx.figures["finished_methods"] = json.loads(path.read_text())["results"]
        raise
    ctx.figures.update(res := json.loads(path.read_text()))
    return res


def step_bench_erasers(ctx: Context, reference: bool = False) -> str:
    """bench_erasers_device (ours on the device), or with `reference` bench_erasers_cpu_reference (concept-erasure's
    float64 fit on CPU)."""
    methods = ctx.sizes.bench_erasers_cpu_methods if reference else ctx.sizes.bench_erasers_device_methods
    if reference and not methods:
        raise frame.StepSkipped("toy mode: bench_erasers_device ran concept-erasure on this CPU already")
    if reference and importlib.util.find_spec("concept_erasure") is None:
        raise frame.StepSkipped("concept-erasure is not importable (add its wheel to .whl/)")
    args = [*ctx.sizes.bench_erasers, "--device", "cpu" if reference else ctx.device, "--methods", methods]
    res = run_bench(ctx, "bench_erasers", args, "bench_erasers_cpu_reference" if reference else "bench_erasers_device")
    return ", ".join(f"{m} {r['seconds']:.2f} s / {r['peak_mb']:.0f} MB" for m, r in res["results"].items())


def step_bench_mdl(ctx: Context) -> str:
    res = run_bench(ctx, "bench_mdl", ["--device", ctx.device, *ctx.sizes.bench_mdl], "bench_mdl")
    bw = res["bandwidth"] if "bandwidth" in res else None
    return f"ours {res['speedup']['ours']:.2f}× the naive loop" + (
        f"; device read {bw['read_gbps']:.0f} GB/s, MLP-128 epoch = {bw['epoch_over_read']:.0f}× one read of the "
        "data" if bw else "")


def throughput_payload(ctx: Context, archs: Iterable[str], **more: Any) -> Payload:
    s = ctx.sizes
    return Payload(archs=list(archs), n=s.n, shape=list(s.shape), device=ctx.device, **s.throughput,
                   arch_overrides={a: list(o) for a, o in s.arch.items()}, **more)


def step_throughput(ctx: Context) -> str:
    res = frame.parse_result(ctx.run(command("throughput", throughput_payload(ctx, frame.ARCHS)), "throughput"))
    ctx.figures.update(res)
    if bad := [a for a, r in res.items() if "error" in r]:
        raise StepError(f"throughput {bad[0]}: {res[bad[0]]['error']}")
    return ", ".join(
        f"{a} one model (fit) {r['train_sps']:.0f}/s"
        + (f" (channels_last off {r['train_sps_channels_last_off']:.0f}/s)" if "train_sps_channels_last_off" in r
           else "")
        + (f", group of {r['group_models']} {r['group_model_sps']:.0f} model-samples/s" if "group_model_sps" in r
           else ", not vectorised") + f", eval {r['eval_sps']:.0f}/s" for a, r in res.items())


def run_concurrent(ctx: Context, arch: str, procs: int) -> dict[str, Any]:
    """`procs` loop workers at once on one device, each timed for the same seconds once all are ready (a file each in
    one folder); the aggregate samples/s says how many jobs share the GPU without slowing each other."""
    ready = ctx.work / f"loop-{arch}-{procs}"
    shutil.rmtree(ready, ignore_errors=True)
    ready.mkdir(parents=True)
    cmd = command("loop", throughput_payload(ctx, [arch], arch=arch, seconds=ctx.sizes.loop_seconds, ready=str(ready),
                                             procs=procs))
    env = {**ctx.env, "OMP_NUM_THREADS": "2" if ctx.gpu else "1"}
    procs_run = frame.run_at_once(ctx, [(cmd, f"sweep_{arch}_x{procs}_{i}") for i in range(procs)], env)
    runs = [frame.parse_result(p) for p in procs_run]
    res = {"procs": procs, "sps_each": [r["sps"] for r in runs], "sps_total": sum(r["sps"] for r in runs)}
    if ctx.gpu:  # device_used_mb: the whole device (all k processes); the context only means something alone
        res.update(peak_reserved_mb=max(r["peak_reserved_mb"] for r in runs),
                   device_used_mb=max(r["device_used_mb"] for r in runs))
        if procs == 1:
            res["context_mb"] = runs[0]["context_mb"]
    return res


def step_sweep_cost(ctx: Context) -> str:
    """Per architecture: GPU-seconds per epoch per job (the job step's measurement), memory per job, how many
    jobs fit on the device by memory, and how aggregate throughput scales with processes sharing it."""
    total_mb = (ctx.report.env.get("device", {}).get("total_memory_gb") or 0) * 1e9 / 2**20
    parts = []
    for arch in frame.ARCHS:
        job, source = earlier_figures(ctx, f"job_{arch}")  # run_job's figures (the memory ones only on CUDA)
        a: dict[str, Any] = {"job_figures_from": source} if source else {}
        ctx.figures[arch] = a
        bits = []
        if job.get("job_s_per_epoch") is not None:
            a.update(job_s_per_epoch=job["job_s_per_epoch"], job_block_models=job.get("block_models", 0) + 1)
            bits.append(f"{job['job_s_per_epoch']:.2f} s/epoch/job")
        if peak := job.get("peak_reserved_mb"):
            context = job.get("context_mb", 0.0)  # the CUDA context and work space beyond torch's cache
            per_job = peak + context
            a.update(job_peak_reserved_mb=peak, job_context_mb=context, job_memory_mb=per_job)
            if total_mb:
                a["jobs_fit_by_memory"] = int(max(0.0, 0.95 * total_mb) // per_job)
            bits.append(f"{per_job:.0f} MB/job" + (f" → {a['jobs_fit_by_memory']} fit" if total_mb else ""))
        if arch in ctx.sizes.loop_archs:
            runs = a["concurrent"] = {}
            for procs in ctx.sizes.loop_procs:  # in the figures as each finishes
                runs[str(procs)] = run_concurrent(ctx, arch, procs)
            if "1" in runs:  # aggregate samples/s of k processes sharing the device / one process alone
                scaling = a["throughput_scaling"] = {k: v["sps_total"] / runs["1"]["sps_total"] for k, v in
                                                     runs.items()}
                if "job_s_per_epoch" in a:  # k jobs sharing the device: each job-epoch costs 1/scaling GPU-time
                    a["gpu_s_per_epoch_per_job_packed"] = {k: a["job_s_per_epoch"] / v for k, v in scaling.items()}
                top = max(scaling, key=int)
                bits.append(f"×{top} procs: {scaling[top]:.2f}× samples/s")
            a["best_procs_measured"] = int(max(runs, key=lambda k: runs[k]["sps_total"]))
        parts.append(f"{arch} " + ", ".join(bits) if bits else f"{arch} (no job figures)")
    return "; ".join(parts)


def earlier_figures(ctx: Context, step: str) -> tuple[dict[str, Any], str | None]:
    """A finished step's figures: from this report, else from a --previous report (an earlier device call)."""
    if (figures := ctx.report.ok_figures(step)) is not None:
        return figures, "this report"
    for path in ctx.args.previous:
        if (figures := frame.Report.from_json(json.loads(Path(path).read_text())).ok_figures(step)) is not None:
            return figures, str(path)
    return {}, None


# ------------------------------------------------------------------------------------------------ tests step

MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")
OUTCOMES = ("PASSED", "FAILED", "SKIPPED", "ERROR")


def step_tests(ctx: Context) -> str:
    """The test suite (GPU: --pytest-m, gpu-marked included; a gpu test that skips on CUDA counts as failed)."""
    if importlib.util.find_spec("pytest") is None:
        raise StepError("pytest is not importable: add its wheels to .whl/ (make gpu-wheels)")
    xml, f = ctx.logs / "pytest.xml", ctx.figures
    args = [sys.executable, "-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", f"--junitxml={xml}",
            *ctx.sizes.pytest_args]
    gpu_ids: set[str] = set()
    if ctx.gpu:
        if importlib.util.find_spec("xdist") is not None:
            args += ["-n", str(min(8, max(1, len(os.sched_getaffinity(0)) // 2))), "--dist", "loadgroup"]
        coll = ctx.run([*args[:3], "-q", "--collect-only", "-m", "gpu", "-p", "no:cacheprovider"],
                       "pytest-collect-gpu", check=False)
        gpu_ids = {ln.strip() for ln in coll.output.splitlines() if "::" in ln}
        f["gpu_tests"] = len(gpu_ids)
        args += ["-m", ctx.args.pytest_m] if ctx.args.pytest_m else []
    try:
        proc = ctx.run(args, "pytest", env={**ctx.env, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}, check=False)
    except StepError:  # out of time: the verbose lines say how far it got
        outcomes = pytest_progress((ctx.logs / "pytest.log").read_text(errors="replace"))
        f["partial"] = {w.lower(): sum(o == w for o, _ in outcomes) for w in OUTCOMES}
        f["partial_failures"] = [t for o, t in outcomes if o in ("FAILED", "ERROR")][:40]
        raise
    if not xml.exists():
        raise StepError(f"pytest: {frame.error_line(proc.output, proc.rc)} (no junit xml)", proc.tail)
    counts, failures, gpu_skipped = read_junit(xml, gpu_ids)
    # a failure only because an optional package is not installed here (numba, wandb without its wheel) is reported
    # apart: it says what to carry, not that the code is wrong
    missing = [x for x in failures if (m := MISSING_MODULE.search(x)) and m.group(1).split(".")[0] in OPTIONAL]
    real = [x for x in failures if x not in missing]
    f.update(counts, gpu_skipped=len(gpu_skipped), failed_missing_module=len(missing), pytest_rc=proc.rc,
             failures=real[:40] + [f"{n} (gpu test skipped on CUDA: {why})" for n, why in gpu_skipped],
             missing_module_failures=missing[:20])
    summary = (f"{counts['passed']} passed, {counts['failed']} failed, {counts['errors']} errors, "
               f"{counts['skipped']} skipped" + (f" ({len(gpu_skipped)} gpu tests skipped)" if ctx.gpu else "")
               + (f"; {len(missing)} failed only for a package not installed here" if missing else ""))
    if real or gpu_skipped or (proc.rc not in (0, 5) and not missing):
        raise StepError(summary + (f"; first: {f['failures'][0]}" if f["failures"] else ""), proc.tail)
    return summary


def pytest_progress(text: str) -> list[tuple[str, str]]:
    """(outcome, test id) of each `pytest -v` result line: "tests/t.py::x PASSED [ 5%]" or, with xdist,
    "[gw0] [ 5%] PASSED tests/t.py::x"."""
    found = []
    for line in text.splitlines():
        test, outcome = re.search(r"(tests/\S+::\S+)", line), re.search(r"\b(PASSED|FAILED|SKIPPED|ERROR)\b", line)
        if test and outcome and not line.startswith(("FAILED ", "ERROR ", "SKIPPED ")):  # not the -r summary
            found.append((outcome.group(1), test.group(1)))
    return found


def read_junit(path: Path, gpu_ids: set[str]) -> tuple[dict[str, int], list[str], list[tuple[str, str]]]:
    """Passed/failed/errors/skipped, each failure's first line, and the tests of `gpu_ids` (node ids) that skipped."""
    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures: list[str] = []
    gpu_skipped: list[tuple[str, str]] = []
    for name, case in testcases(path):
        kinds = {child.tag: child for child in case if child.tag in ("failure", "error", "skipped")}
        tag = next((t for t in ("failure", "error", "skipped") if t in kinds), None)
        counts[{"failure": "failed", "error": "errors", "skipped": "skipped", None: "passed"}[tag]] += 1
        message = (kinds[tag].get("message") or "").strip() if tag else ""
        if tag in ("failure", "error"):
            failures.append(f"{name}: {message.splitlines()[0][:200] if message else tag}")
        elif tag == "skipped" and name in gpu_ids:
            gpu_skipped.append((name, message[:200]))
    return counts, failures, gpu_skipped


# ------------------------------------------------------------------------------------------------- cell step

SEEDS = 5
ARCH = "mlp"
# the cell's log lines (training/tasks/mdl/cell.py) that say what its group did
GROUP_FORMED = f"cell: {SEEDS} seeds'"
GROUP_FAILED = "the cell's group failed"
MEMORY_NOTE = ("per-process peaks (torch.cuda.max_memory_reserved on CUDA, max RSS on CPU): lone_memory_mb is the "
               "sum over the 5 processes, cell_memory_mb the one process's; on CUDA each process also holds a CUDA "
               "context (context_mb, measured in the cell's process, which ran alone): the *_with_contexts_mb figures "
               "add 5 of them to the lone sum and one to the cell")


def read_memory(path: Path) -> dict[str, float] | None:
    """A job process's memory file (`_memory`): the CUDA figures (context_mb: the device used beyond torch's cache,
    only this process's when it ran alone), or the peak RSS on CPU."""
    return json.loads(path.read_text()) if path.exists() else None


def _peak(memory: dict[str, float] | None) -> float | None:
    """torch's peak reserved memory on CUDA, else the peak RSS."""
    return None if memory is None else memory.get("peak_reserved_mb", memory.get("peak_rss_mb"))


def memory_figures(lone: Sequence[dict[str, float] | None], cell: dict[str, float] | None) -> dict[str, Any]:
    """The lone processes' peaks (each, and summed when all five are known), the cell's, and on CUDA both with the
    CUDA context of each process (the cell's, measured alone: a lone process's own reads the others' memory too)."""
    out: dict[str, Any] = {}
    peaks = [p for p in map(_peak, lone) if p is not None]
    if len(peaks) == len(lone):
        out.update(lone_memory_mb=sum(peaks), lone_memory_each_mb=peaks)
    if cell is None or (peak := _peak(cell)) is None:
        return out
    out["cell_memory_mb"] = peak
    if (context := cell.get("context_mb")) is not None:
        out.update(context_mb=context, cell_memory_with_contexts_mb=peak + context)
        if "lone_memory_mb" in out:
            out["lone_memory_with_contexts_mb"] = out["lone_memory_mb"] + len(lone) * context
    return out


def cell_checks(lone: dict[str, dict[str, Any]], cell: dict[str, dict[str, Any]], cell_log: str,
                bitwise: bool = True) -> dict[str, Any]:
    """Whether every seed's numbers are == between the lone processes and the cell, and otherwise within the
    numerics contract's tolerance (training/engine/numerics.py: max(1e-3, 0.05 × the lone jobs' seed SD); `bitwise`:
    the CPU loop engine, where only == holds it); whether the cell's group formed; and the flags a reader must see
    (none when all is as expected)."""
    diff, key = differences(lone, cell), "mdl.bits_per_sample"
    both = [j for j in sorted(set(lone) & set(cell)) if key in lone[j] and key in cell[j]]
    dev = max((abs(float(lone[j][key]) - float(cell[j][key])) for j in both), default=0.0)
    sd = statistics.stdev([float(lone[j][key]) for j in both]) if len(both) > 1 else math.nan
    tolerance = bits_tolerance(sd)
    within = not diff or (not bitwise and dev <= tolerance)
    formed = [ln[ln.index(GROUP_FORMED):] for ln in cell_log.splitlines() if GROUP_FORMED in ln]
    group_failed = GROUP_FAILED in cell_log
    flags = []
    if not within:
        what = "the CPU loop engine is bitwise" if bitwise else f"max |Δ bits/sample| {dev:.3g} > tolerance " \
                                                                 f"{tolerance:.3g}"
        flags.append(f"numbers differ between the lone processes and the cell in {len(diff)} place(s) ({what}), "
                     f"e.g. {diff[0]}")
    if not formed:
        flags.append(f"the cell's group did not form (no '{GROUP_FORMED}' line in its log)")
    if group_failed:
        flags.append("the cell's group failed: each seed's models trained in its own group")
    return {"equal": not diff, "within_tolerance": within, "max_abs_bits_deviation": dev, "seed_sd_bits": sd,
            "tolerance_bits": tolerance, "deviation_over_seed_sd": dev / sd if sd > 0 else math.nan,
            "differences": diff[:10], "group_formed": bool(formed), "group_line": formed[0] if formed else None,
            "group_failed": group_failed, "flags": flags}


def step_cell(ctx: Context) -> str:
    """5 seeds of one MDL cell (MLP at the job steps' size and data) as 5 one-seed processes at once vs one job,
    `seeds=5`: wall times, memory, the numbers compared (flagged, not failed), whether the cell's group formed."""
    outs = {"lone": ctx.out / "runs" / "cell_lone", "cell": ctx.out / "runs" / "cell_together"}
    for out in outs.values():
        shutil.rmtree(out, ignore_errors=True)  # fresh jobs: an earlier result here would be reused, not timed
    # CPU threads: the concurrent processes as sweep_cost's (2 each on a GPU), the cell as a job step's (8)
    threads = ctx.env.get("OMP_NUM_THREADS", "1")
    lone_threads, cell_threads = ("2", "8") if ctx.gpu else (threads, threads)
    f = ctx.figures
    f.update(seeds=SEEDS, arch=ARCH, device=ctx.device, lone_omp_threads=int(lone_threads),
             cell_omp_threads=int(cell_threads), memory_note=MEMORY_NOTE,
             lone_overrides=" ".join(job_overrides(ctx, ARCH, outs["lone"], seed="<s>")))
    lone_mem = [ctx.work / f"cell_lone_{s}.memory.json" for s in range(SEEDS)]
    commands = [(job_command(ctx, job_overrides(ctx, ARCH, outs["lone"], seed=str(s)), lone_mem[s]),
                 f"cell_lone_seed{s}") for s in range(SEEDS)]
    lone_env = {**ctx.env, "OMP_NUM_THREADS": lone_threads}
    f["lone_each_s"] = [p.seconds for p in frame.run_at_once(ctx, commands, lone_env)]
    lone_wall = f["lone_wall_s"] = max(f["lone_each_s"])
    cell_mem = ctx.work / "cell_together.memory.json"
    overrides = job_overrides(ctx, ARCH, outs["cell"], [f"seeds={SEEDS}"], seed=None)
    f["cell_overrides"] = " ".join(overrides)
    proc = ctx.run(job_command(ctx, overrides, cell_mem), "cell_together",
                   env={**ctx.env, "OMP_NUM_THREADS": cell_threads}, check=False)
    f["cell_wall_s"] = proc.seconds
    f.update(memory_figures([read_memory(m) for m in lone_mem], read_memory(cell_mem)))
    if proc.rc != 0:
        raise proc.failure()
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
        mem = (f", peak memory {f[f'lone_memory{suffix}']:.0f} MB (5 processes, summed) vs "
               f"{f[f'cell_memory{suffix}']:.0f} MB")
    dev = (f"max |Δ bits/sample| {f['max_abs_bits_deviation']:.2g} = {f['deviation_over_seed_sd']:.2g} × seed SD "
           f"(tolerance {f['tolerance_bits']:.2g})")
    verdict = "numbers ==" if f["equal"] else f"within tolerance: {dev}" if f["within_tolerance"] else \
        f"OUTSIDE TOLERANCE: {dev}"
    flags = f"; flags: {' / '.join(f['flags'])}" if f["flags"] else ""
    return (f"{SEEDS} processes {lone_wall:.1f} s, cell {proc.seconds:.1f} s: {f['ratio']:.2f}×{mem}; {verdict}, "
            f"{'group formed' if f['group_formed'] else 'NO GROUP'}{flags}")


# ------------------------------------------------------------------------------ measurements (subprocesses)


def _memory(device: Any) -> dict[str, float]:
    """Peak allocated/reserved memory of this process and the device's total and used memory (MB) on CUDA, else the
    peak RSS."""
    if torch.device(device).type != "cuda":
        return {"peak_rss_mb": peak_mb(cuda=False)}
    free, total = torch.cuda.mem_get_info()
    return {"peak_allocated_mb": torch.cuda.max_memory_allocated() / 2**20,
            "peak_reserved_mb": torch.cuda.max_memory_reserved() / 2**20,
            "device_used_mb": (total - free) / 2**20, "device_total_mb": total / 2**20,
            # what the device holds for this process beyond torch's cache: the CUDA context, cuBLAS/cuDNN work space
            "context_mb": max(0.0, (total - free - torch.cuda.memory_reserved()) / 2**20)}


def job(p: Payload) -> dict[str, Any]:
    """`python -m training.run <overrides>` in this process; its peak memory goes to p.memory_file."""
    import runpy

    sys.argv = [str(frame.ROOT / "training" / "run.py"), *p.overrides]
    cuda = torch.cuda.is_available() and p.device.startswith("cuda")
    try:  # as `python -m training.run`: Hydra finds conf/ relative to the __main__ module's file
        runpy.run_module("training.run", run_name="__main__", alter_sys=True)
    finally:
        Path(p.memory_file).write_text(json.dumps(_memory("cuda" if cuda else "cpu")))
    return {}


def erasers(p: Payload) -> dict[str, Any]:
    """LEACE, QLEACE and ALF-QLEACE fitted in float64 on the device and on CPU from the same data: fit seconds
    on each and the largest difference of the erased data."""
    x, y = make_data(p.n, p.d, p.k)
    scale = float(x.abs().max())
    out: dict[str, Any] = {"n": p.n, "d": p.d, "k": p.k, "device": p.device, "data_max_abs": scale}
    for name, options in (("leace", {}), ("qleace", {}), ("alf_qleace", {"max_rank": p.alf_max_rank})):
        res: dict[str, Any] = {}
        erased = {}
        for where in dict.fromkeys(("cpu", p.device)):  # the CPU once when the device is the CPU
            xs, ys, side = x.to(where), y.to(where), "cpu" if where == "cpu" else "device"
            sync(torch.device(where))
            t0 = time.perf_counter()
            e = erasure.fit(name, xs, ys, **options)
            sync(torch.device(where))
            res[f"fit_s_{side}"] = time.perf_counter() - t0
            erased[where] = (e.apply_in_sample(xs, ys) if e.needs_labels else e(xs)).double().cpu()
            for key, value in e.report().items():
                if key in ("barycenter_iterations", "barycenter_residual", "rank", "final_worst_deviation") \
                        and isinstance(value, int | float):
                    res[f"{key}_{side}"] = value
        res["max_abs_diff"] = float((erased["cpu"] - erased[p.device]).abs().max())
        res["max_rel_diff"] = res["max_abs_diff"] / scale
        out[name] = res
        print(f"{name}: {res}", flush=True)
    return out


def _arch_cfg(arch: str, p: Payload) -> Any:
    """The job config (a training.app.schema.JobConfig) of `arch` on the payload's synthetic data, resolved and
    checked as `python -m training.run` would run it."""
    overrides = [f"arch={arch}", *p.arch_overrides[arch], "dataset=synthetic", f"dataset.n={p.n}",
                 f"dataset.channels={p.shape[0]}", f"dataset.size={p.shape[1]}", f"dataset.num_classes={NUM_CLASSES}",
                 "dataset.augment=true", "logger=none", "progress=false", f"device={p.device}", *p.overrides]
    return load_job(job_config(overrides))


def throughput(p: Payload) -> dict[str, Any]:
    """Per architecture, through the job's own Trainer: seconds per epoch of one model trained by `fit()` (as a job
    trains one model) on a `subset` of the resident data (validation included), training samples/s, evaluation
    samples/s, and for the architectures a job trains as one vectorised group, one epoch of `group` models at once
    through `fit_group` (the job's engine). `training.channels_last` as a job resolves it (auto: on for a model with
    2-d convolutions on a GPU); where it was on, `train_sps_channels_last_off` is the one-model figure without it."""
    device = torch.device(p.device)
    x, y = synthetic(p.n, math.prod(p.shape))
    out: dict[str, Any] = {}
    for arch in p.archs:
        try:
            cfg = _arch_cfg(arch, p)
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            split = make_split(len(y), 0, val_size=p.val, val_frac=0.5, num_blocks=2, min_block=p.subset)
            trainer = Trainer(cfg, x, y, NUM_CLASSES, split, device,
                              numerics=JobNumerics(channels_last=cfg.training.channels_last))
            subset, opts = split.order[: p.subset], cfg.training
            group = GroupOptions(engine="stacked", workers=opts.workers, compile=opts.compile, progress=False,
                                 fused_optimizer=False, rows=None, poll_every=opts.poll_every)

            def per_epoch(models: int, trainer: Trainer = trainer, subset: Any = subset,
                          group: GroupOptions = group) -> float:  # one model by fit(), as a job trains it
                one = epoch_seconds(trainer, subset, 1, models, None if models == 1 else group)
                if p.quick:  # toy: the path, not the figure
                    return one
                three = epoch_seconds(trainer, subset, 3, models, None if models == 1 else group)
                return (three - one) / 2 if three > one else three / 3  # start-up cost removed when measurable

            if not p.quick:
                epoch_seconds(trainer, subset, 1, 1, None)  # warm-up: kernels, allocator, cuDNN autotuning
            res: dict[str, Any] = {"subset": len(subset), "val": len(split.val_idx), "epoch_s": per_epoch(1)}
            model = trainer.member(subset, ("eval", 0)).model.eval()
            everything = torch.arange(len(y))
            cross_entropy_sum(model, trainer.data.all(everything[:2048]), trainer.y[:2048])  # warm-up
            sync(device)
            t0 = time.perf_counter()
            cross_entropy_sum(model, trainer.data.all(everything), trainer.y)
            sync(device)
            res["eval_sps"] = len(y) / (time.perf_counter() - t0)
            val_s = len(split.val_idx) / res["eval_sps"]
            res["train_sps"] = len(subset) / max(res["epoch_s"] - val_s, 1e-9)
            res["channels_last"] = bool(trainer.numerics is not None and trainer.numerics.formats)
            if res["channels_last"] and not p.quick:  # the same figure in the default layout: what it gains
                trainer.numerics = JobNumerics(channels_last=False)
                res["train_sps_channels_last_off"] = len(subset) / max(per_epoch(1) - val_s, 1e-9)
                trainer.numerics = JobNumerics(channels_last=cfg.training.channels_last)
            probe = trainer.member(subset, ("probe", 0))
            # whether the architecture can train as one stacked group (the engine's own verdict), and whether a job
            # groups its block models by default (`training.parallel_models=auto`, with the engine the job resolves
            # for it: the loop engine where the registry says it does not vectorise)
            why = why_not_vectorized(probe.model, probe.optimizer, trainer.regularizer, "stacked")
            res.update(vectorises=why is None, engine_by_default=trainer.engine, grouped_by_default=why_not_vectorized(
                probe.model, probe.optimizer, trainer.regularizer, trainer.engine) is None)
            if why is not None:
                res["why_not_vectorised"] = why
            if why is None and p.group > 1:
                res.update(group_models=p.group, group_epoch_s=per_epoch(p.group))
                res["group_model_sps"] = p.group * len(subset) / res["group_epoch_s"]
            res["params"] = sum(t.numel() for t in model.parameters())
            out[arch] = {**res, **_memory(device)}
            del trainer, model
        except Exception as err:  # one architecture failing does not lose the others
            out[arch] = {"error": f"{type(err).__name__}: {err}".splitlines()[0][:300]}
        print(f"{arch}: {out[arch]}", flush=True)
    return out


def loop(p: Payload) -> dict[str, Any]:
    """Train one model (batch 128, augmentation) in a plain loop for `seconds` once the others are ready (a file each
    in p.ready), counting samples. Several at once share the device."""
    device = torch.device(p.device)
    x, y = synthetic(p.n, math.prod(p.shape))
    split = make_split(len(y), 0, val_size=p.val, val_frac=0.5, num_blocks=2, min_block=p.subset)
    trainer = Trainer(_arch_cfg(p.arch, p), x, y, NUM_CLASSES, split, device)
    m = trainer.member(split.order, ("loop", 0))
    model, opt = m.model.train(), m.optimizer
    opt.train()  # type: ignore[attr-defined]  # schedule-free's train()/eval(); the library is untyped
    gen, crops = torch.Generator(device=device).manual_seed(0), torch.Generator().manual_seed(1)  # crops: CPU
    bs = 128

    def steps(k: int) -> None:
        for _ in range(k):
            idx = torch.randint(0, len(y), (bs,), device=device, generator=gen)
            loss = torch.nn.functional.cross_entropy(model(crop_flip(trainer.data.all(idx), crops)), trainer.y[idx])
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        sync(device)

    steps(10)
    Path(p.ready, str(os.getpid())).touch()
    t_wait = time.monotonic()
    while len(list(Path(p.ready).iterdir())) < p.procs:
        if time.monotonic() - t_wait > 300:
            raise TimeoutError("the other loop workers did not get ready")
        time.sleep(0.01)
    t0, done = time.perf_counter(), 0
    while not done or time.perf_counter() - t0 < p.seconds:
        steps(10)
        done += 10
    seconds = time.perf_counter() - t0
    return {"arch": p.arch, "steps": done, "seconds": seconds, "sps": done * bs / seconds, **_memory(device)}


def device(p: Payload) -> dict[str, Any]:
    d = torch.device(p.device)
    props = torch.cuda.get_device_properties(d)
    return {"type": "cuda", "name": torch.cuda.get_device_name(d), "total_memory_gb": props.total_memory / 1e9,
            "capability": f"{props.major}.{props.minor}", "multiprocessors": props.multi_processor_count,
            "count": torch.cuda.device_count()}


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "disabled")
    payload = Payload(**json.loads(sys.argv[2]))
    if payload.threads is not None:
        torch.set_num_threads(payload.threads)
    kinds = {"device": device, "job": job, "erasers": erasers, "throughput": throughput, "loop": loop}
    result = kinds[sys.argv[1]](payload)
    print("RESULT " + json.dumps(result), flush=True)
