"""scripts/gpu_report.py's measuring steps: one MDL job per architecture, the erasers on the device, the speed
benchmarks, and the sweep cost (GPU-seconds and memory per job, jobs sharing one device)."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from scripts.bench_summary import BenchSummary
from scripts.gpu_report_model import Report, build
from scripts.gpu_report_payload import Payload
from scripts.gpu_report_runner import ROOT, Context, Proc, StepError, StepSkipped, error_line, parse_result, stop, tail
from scripts.gpu_report_sizes import ARCHS
from training.app.tasks import read_any as read_result
from training.tasks.mdl.result import MdlResult


def job_overrides(ctx: Context, arch: str, out: Path, extra: Iterable[str] = (), seed: str | None = "0") -> list[str]:
    """A job's overrides; `seed`: its one seed (None: the cell's `seeds`, given in `extra`)."""
    s = ctx.sizes
    return [f"arch={arch}", *s.arch[arch], *s.job_data, *s.job_mdl, "eraser=control",
            *([f"seed={seed}"] if seed is not None else []),
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
    payload = Payload(overrides=overrides, memory_file=str(memory_file), device=ctx.device)
    env = {**ctx.env, "OMP_NUM_THREADS": ctx.env.get("OMP_NUM_THREADS", "1") if not ctx.gpu else "8"}
    t0 = time.monotonic()
    proc = ctx.python(["-m", "scripts.gpu_report_work", "job", payload.to_json()], name, env=env, check=False)
    wall = time.monotonic() - t0
    fig: dict[str, Any] = {"overrides": " ".join(overrides), "wall_s": wall}
    if memory_file.exists():
        fig.update(json.loads(memory_file.read_text()))
    results = sorted(out.rglob("result.json"), key=lambda p: p.stat().st_mtime)
    if proc.rc != 0 or not results:
        ctx.figures.update(fig)
        raise StepError(f"{name}: {error_line(proc.output, proc.rc)}", tail(proc.output))
    res = read_result(results[-1])
    if not isinstance(res, MdlResult) or res.body.mdl is None:
        raise StepError(f"{name}: {results[-1]} is not an MDL result")
    mdl, final, timings = res.body.mdl, res.body.final, res.timings
    model = res.section("model") or {}
    fig.update({
        "bits_per_sample": mdl.bits_per_sample, "legacy": mdl.legacy if mdl.has_legacy else None,
        "protocol": mdl.protocol, "n_coded": mdl.n_coded, "block_models": len(mdl.blocks),
        "epochs_per_block": [b.epochs for b in mdl.blocks],
        "steps_total": sum(b.steps or 0 for b in mdl.blocks) + (final.steps or 0 if final else 0),
        "full_run_epochs": final.epochs if final else None, "params": model["params"] if "params" in model else None,
        "timings": dict(timings), "device": res.device, "result": str(results[-1].relative_to(ctx.out)),
    })
    epochs = max([b.epochs or 0 for b in mdl.blocks] + [final.epochs or 0 if final else 0]) or 1
    fig["train_s"] = sum(float(timings[k]) for k in ("mdl_s", "full_run_s") if k in timings)
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
    e = ctx.sizes.eraser
    payload = Payload(n=e.n, d=e.d, k=e.k, alf_max_rank=e.alf_max_rank, device=ctx.device,
                      threads=len(os.sched_getaffinity(0)))
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


def step_bench_mdl(ctx: Context) -> str:
    json_path = ctx.work / "bench_mdl.json"
    json_path.unlink(missing_ok=True)
    ctx.python(["scripts/bench_mdl.py", "--device", ctx.device, *ctx.sizes.bench_mdl, "--json", str(json_path)],
               "bench_mdl")
    res = json.loads(json_path.read_text())
    ctx.figures.update(res)
    bench = BenchSummary.from_json(res)
    s = f"ours {bench.speedup['ours']:.2f}× the naive loop"
    bw = bench.bandwidth
    if bw:
        s += (f"; device read {bw['read_gbps']:.0f} GB/s, MLP-128 epoch = {bw['epoch_over_read']:.0f}× one read "
              f"of the data")
    return s


def throughput_payload(ctx: Context, archs: Iterable[str]) -> Payload:
    s = ctx.sizes
    return Payload(archs=list(archs), n=s.n, shape=list(s.shape), device=ctx.device,
                   arch_overrides={a: list(o) for a, o in s.arch.items()}, subset=s.throughput.subset,
                   val=s.throughput.val, group=s.throughput.group, quick=s.throughput.quick)


def step_throughput(ctx: Context) -> str:
    res = ctx.work_result("throughput", throughput_payload(ctx, ARCHS), "throughput")
    ctx.figures.update(res)
    bad = [a for a, r in res.items() if "error" in r]
    if bad:
        raise StepError(f"throughput {bad[0]}: {res[bad[0]]['error']}")
    return ", ".join(f"{a} one model (fit) {r['train_sps']:.0f}/s" + (
        f" (channels_last off {r['train_sps_channels_last_off']:.0f}/s)" if "train_sps_channels_last_off" in r
        else "") + (
        f", group of {r['group_models']} {r['group_model_sps']:.0f} model-samples/s" if "group_model_sps" in r
        else ", not vectorised") + f", eval {r['eval_sps']:.0f}/s" for a, r in res.items())


def run_concurrent(ctx: Context, arch: str, procs: int) -> dict[str, Any]:
    """`procs` loop workers at once on one device: started together (ready/go files), each timed for the same
    seconds; the aggregate samples/s says how many jobs share the GPU without slowing each other."""
    flags = ctx.work / f"loop-{arch}-{procs}"
    flags.mkdir(parents=True, exist_ok=True)
    for f in flags.iterdir():
        f.unlink()
    payload = dataclasses.replace(throughput_payload(ctx, [arch]), arch=arch, seconds=ctx.sizes.loop_seconds,
                                  go=str(flags / "go"))
    running = []
    env = {**ctx.env, "OMP_NUM_THREADS": "1" if not ctx.gpu else "2"}
    try:
        for i in range(procs):
            own = dataclasses.replace(payload, ready=str(flags / f"ready{i}"))
            log = ctx.logs / f"sweep_{arch}_x{procs}_{i}.log"
            fh = open(log, "w")
            cmd = [sys.executable, "-m", "scripts.gpu_report_work", "loop", own.to_json()]
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


@dataclasses.dataclass(frozen=True)
class JobFigures:
    """What the sweep-cost step reads of a job step's figures (`run_job`; the memory ones only on CUDA)."""

    job_s_per_epoch: float | None = None
    block_models: int = 0
    peak_reserved_mb: float | None = None
    context_mb: float = 0.0  # the CUDA context and work space beyond torch's cache


def step_sweep_cost(ctx: Context) -> str:
    """Per architecture: GPU-seconds per epoch per job (the job step's measurement), memory per job, how many
    jobs fit on the device by memory, and how aggregate throughput scales with processes sharing it."""
    total_mb = (ctx.report.env.device.total_memory_gb or 0) * 1e9 / 2**20
    out: dict[str, Any] = {}
    parts = []
    for arch in ARCHS:
        figures, source = earlier_figures(ctx, f"job_{arch}")
        job = build(JobFigures, figures)
        a: dict[str, Any] = {"job_figures_from": source} if source else {}
        if job.job_s_per_epoch is not None:
            a["job_s_per_epoch"] = job.job_s_per_epoch
            a["job_block_models"] = job.block_models + 1
        if job.peak_reserved_mb:
            a["job_peak_reserved_mb"] = job.peak_reserved_mb
            a["job_context_mb"] = job.context_mb
            per_job = job.peak_reserved_mb + job.context_mb
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
    if (figures := ctx.report.ok_figures(step)) is not None:
        return figures, "this report"
    for path in ctx.args.previous:
        if (figures := Report.from_json(json.loads(Path(path).read_text())).ok_figures(step)) is not None:
            return figures, str(path)
    return {}, None
