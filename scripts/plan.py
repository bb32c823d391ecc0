"""`make plan EXP=<preset> [ARGS="k=v ..."]`: what a sweep would run, without running it.

    .venv/bin/python -m scripts.plan paper_table_c                  # the preset as `make reproduce` runs it
    .venv/bin/python -m scripts.plan demo seed=0,1 paths.out_dir=/scratch/me --cells 0

Prints the jobs and their cells (one line per job directory's parent, c<cell hash>: dataset/eraser/arch, the
swept values that are not in that path, its seeds), how many jobs already finished (a result.json with this job's
config hash in its directory: the job would SKIP) and how many remain, and the cost of those that remain, from
per-job costs measured earlier, each figure with the file and date it comes from:
  - this sweep's finished jobs (their result.json `timings.total_s`, by architecture and device);
  - CPU: `make bench` (outputs/bench/bench_mdl.json: one MLP-128 prequential MDL, no early stopping);
  - GPU: `make gpu-report` (outputs/gpu_report/gpu_report.json: one job per architecture, epochs capped), priced
    per epoch at the epochs the cell's protocol will run: measured from this sweep's finished jobs of the same
    architecture, else a lower bound from `mdl.patience` (the line says which).
Without a measurement it says so ("no measurement: run make bench") instead of guessing.

The sweep is expanded by training/common/sweep_jobs.py (one Hydra composition per distinct group choice, the same
job configs, hashes and directories as Hydra's): a 560-job preset in seconds.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import statistics
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hydra.errors import HydraException

from training.app.lifecycle import PROGRESS_FILE
from training.app.result_types import at, number
from training.app.results import RESULT_FILE, NewerResultError, mismatch_message, read_result, same_config
from training.app.schema import config_hash, duplicate_jobs
from training.app.tasks import load_job, spec_of
from training.common.sweep_jobs import expand_cells
from training.common.sweeps import sweep_overrides
from training.errors import UserError
from training.tasks.mdl.result import MdlResult

BENCH_JSON = Path("outputs/bench/bench_mdl.json")
GPU_REPORT_JSON = Path("outputs/gpu_report/gpu_report.json")
# swept keys the cell's path already shows (<dataset>/<eraser>/<arch>-w<width>-d<depth>)
IN_PATH = {"seed", "dataset", "eraser", "arch", "arch.width", "arch.depth", "experiment"}


@dataclass
class Job:
    cfg: dict[str, Any]
    overrides: list[str]
    job_dir: Path
    cfg_hash: str | None  # None: the config is refused (see `refused`)
    refused: str | None = None
    status: str = "to run"  # done | other config | in progress | to run | refused
    held: str | None = None  # why the sweep would be refused: its directory holds another config's result
    launched: int = 0  # the launcher's job (a cell's seeds: one job) that runs it

    @property
    def arch(self) -> str:
        return str(self.cfg["arch"]["name"])


@dataclass
class Cell:
    path: str
    label: str
    seeds: list[Any] = field(default_factory=list)
    done: int = 0


def job_hash(cfg: Mapping[str, Any]) -> tuple[str | None, str | None]:
    """(config hash, None), or (None, the one-line refusal) for a config the job would refuse."""
    try:
        return config_hash(load_job(cfg)), None
    except UserError as err:
        return None, str(err).splitlines()[0]


def job_status(job: Job) -> tuple[str, str | None]:
    """What the job would do now, read as the job reads its directory (training/app/results.py JobDir.finished):
    done (a result.json of this config: SKIP), other config (another config's or newer code's result: the sweep is
    refused unless force=true, and the line that says so), in progress (a progress.json: it resumes), to run."""
    if job.cfg_hash is None:
        return "refused", None
    spec, force = spec_of(job.cfg), bool(job.cfg["force"])
    try:
        done = read_result(job.job_dir / RESULT_FILE, spec, refuse_newer=not force)
    except NewerResultError as err:
        return "other config", str(err)
    if done is not None and same_config(done, job.cfg_hash, spec):
        return "done", None
    if done is not None:
        return "other config", None if force else mismatch_message(job.job_dir, done.config_hash, job.cfg_hash)
    return "in progress" if (job.job_dir / PROGRESS_FILE).exists() else "to run", None


def plan_jobs(experiment: str, extra: Sequence[str]) -> list[Job]:
    """Every seed's job of the sweep (`launched`: the number of the launcher's job that trains it with the other
    seeds of its cell)."""
    combos = sweep_overrides(experiment, extra)
    jobs, seen = [], set()
    for num, (configs, combo) in enumerate(zip(expand_cells(combos), combos, strict=True)):
        for cfg in configs:
            h, refused = job_hash(cfg)
            if (cfg["paths"]["job_dir"], h) in seen:  # a value given twice (seed=0,0): the same job, run once
                continue
            seen.add((cfg["paths"]["job_dir"], h))
            job = Job(cfg, combo, Path(cfg["paths"]["job_dir"]), h, refused, launched=num)
            job.status, job.held = job_status(job)
            jobs.append(job)
    return jobs


def cells(jobs: Sequence[Job]) -> list[Cell]:
    """A Cell per job directory's parent, labelled by its path and the override keys whose value differs between jobs
    (in the order they appear) that the path does not show."""
    values: dict[str, set[str]] = defaultdict(set)
    for line in (line for job in jobs for line in job.overrides):
        values[line.partition("=")[0]].add(line.partition("=")[2])
    shown = [k for k, v in values.items() if len(v) > 1 and k.lstrip("+") not in IN_PATH]
    out: dict[str, Cell] = {}
    for job in jobs:
        key = str(job.job_dir.parent)
        if key not in out:
            sub = Path(job.cfg["paths"]["job_subdir"]).parent
            given = dict(line.partition("=")[::2] for line in job.overrides)
            # a group choice the path names otherwise (eraser=qleace_paper: qleace with other options)
            renamed = [f"{k}={given[k]}" for k in ("dataset", "eraser", "arch") if k in given
                       and given[k] not in (str(job.cfg[k].get("name")), str(job.cfg[k].get("tag")))]
            extra = " ".join([*renamed, *(f"{k}={given[k]}" for k in shown if k in given)])
            out[key] = Cell(key, f"{sub}" + (f"  {extra}" if extra else ""))
        out[key].seeds.append(job.cfg["seed"])
        out[key].done += job.status == "done"
    return list(out.values())


def spans(seeds: Sequence[Any]) -> str:
    """0,1,2,3,5 -> "0-3,5" (seeds that are not integers are listed as they are)."""
    if not all(isinstance(s, int) for s in seeds):
        return ",".join(map(str, seeds))
    nums = sorted(set(seeds))
    parts, start = [], nums[0]
    for a, b in zip(nums, [*nums[1:], None], strict=True):
        if b != a + 1:
            parts.append(str(start) if start == a else f"{start}-{a}")
            start = b
    return ",".join(parts)


# --------------------------------------------------------------------------------------------------- cost
@dataclass(frozen=True)
class Cost:
    """Seconds per job of one architecture on one kind of device, and where that figure comes from."""

    seconds: float
    source: str


def _date(path: Path) -> str:
    return dt.datetime.fromtimestamp(path.stat().st_mtime, dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")


def finished_costs(jobs: Sequence[Job]) -> dict[tuple[str, str], Cost]:
    """(device kind, arch) -> median `timings.total_s` of this sweep's finished jobs."""
    seen: dict[tuple[str, str], list[tuple[float, str]]] = defaultdict(list)  # (seconds, date) per job
    for job in jobs:
        result = read_result(job.job_dir / RESULT_FILE, spec_of(job.cfg)) if job.status == "done" else None
        total = number(at(result.timings, "total_s")) if result is not None else None  # timings: open
        if result is not None and total is not None:
            kind = "gpu" if str(result.device).startswith("cuda") else "cpu"
            seen[kind, job.arch].append((float(total), _date(job.job_dir / RESULT_FILE)))
    return {k: Cost(statistics.median(t for t, _ in v), f"median of {len(v)} finished job(s) of this sweep "
                    f"(result.json timings.total_s, {min(d for _, d in v)} .. {max(d for _, d in v)})")
            for k, v in seen.items()}


def bench_cost(path: Path) -> tuple[dict[str, Cost], str | None]:
    """CPU seconds per MLP job from `make bench`'s tools/bench_mdl.py --json; or why there is none."""
    try:
        bench = json.loads(path.read_text())
    except FileNotFoundError:
        return {}, f"no measurement: {path} not found; run make bench"
    except (OSError, ValueError) as err:
        return {}, f"no measurement: {path} cannot be read ({err}); run make bench"
    b = bench if isinstance(bench, dict) else {}
    ours = b["median_s"]["ours"] if isinstance(b.get("median_s"), dict) and "ours" in b["median_s"] else None
    if ours is None or str(b.get("device", "")).startswith("cuda"):
        return {}, f"no measurement: {path} holds no CPU run; run make bench"
    per_job = float(ours) / max(int(b.get("seeds") or 1), 1)  # the run trains all its seeds at once
    what = (f"{path} ({_date(path)}): one MLP-128 prequential MDL, {b.get('n')} x {b.get('d')} synthetic "
            f"rows, {b.get('epochs')} epochs per block model, no early stopping, {b.get('threads')} thread(s)")
    return {"mlp": Cost(per_job, what)}, None


def gpu_report_cost(path: Path) -> tuple[dict[str, tuple[float, float, str]], str | None]:
    """Per architecture, from `make gpu-report`'s job_<arch> steps: GPU seconds outside training, seconds per epoch of
    all its models (the report caps epochs: never a job's price as it stands), where that comes from; or why there are
    none."""
    try:
        report = json.loads(path.read_text())
        steps = {str(name): (step["figures"] if step.get("status") == "ok" else {})
                 for name, step in report.get("steps", {}).items()}
        device = report.get("env", {}).get("device", {}).get("name", "?")
    except FileNotFoundError:
        return {}, f"no measurement: {path} not found; run make gpu-report"
    except (OSError, ValueError, TypeError, AttributeError, KeyError) as err:  # not JSON, or not a report's shape
        return {}, f"no measurement: {path} cannot be read ({type(err).__name__}: {err}); run make gpu-report"
    out = {}
    for name, figures in steps.items():
        if not name.startswith("job_") or "wall_s" not in figures:
            continue
        if not str(figures["device"] if "device" in figures else "").startswith("cuda"):
            continue  # a toy run on CPU: not a GPU measurement
        epochs = max(figures["epochs_per_block"] if "epochs_per_block" in figures else [0]) or 1
        wall = float(figures["wall_s"])
        train = float(figures["train_s"]) if "train_s" in figures else wall
        per_epoch = float(figures["job_s_per_epoch"]) if "job_s_per_epoch" in figures else train / epochs
        out[name.removeprefix("job_")] = (max(wall - train, 0.0), per_epoch, (
            f"{path} ({report.get('updated') or _date(path)}, {device}): one job at the paper's base "
            f"size, CIFAR-shaped data, {per_epoch:.1f} s per epoch of its models (measured over {epochs:g} capped "
            f"epoch(s)) + {max(wall - train, 0.0):.1f} s outside training"))
    if not out:
        return {}, f"no measurement: {path} has no GPU job step; run make gpu-report on a GPU"
    return out, None


def protocol_epochs(arch: str, remaining: Sequence[Job], finished: Sequence[Job]) -> tuple[float, str]:
    """Epochs per block model a job of `arch` will run: the median of this sweep's finished jobs of that
    architecture (their result.json blocks), else a lower bound from the protocol (no patience stop before
    `mdl.patience` + 1 epochs, none past `mdl.max_epochs`); and which of the two it is."""
    seen = []
    for job in finished:
        result = read_result(job.job_dir / RESULT_FILE, spec_of(job.cfg)) if job.arch == arch else None
        blocks = result.body.mdl.blocks if isinstance(result, MdlResult) and result.body.mdl is not None else ()
        if epochs := [b.epochs for b in blocks if b.epochs]:
            seen.append(max(epochs))
    if seen:
        return statistics.median(seen), f"measured: median of {len(seen)} finished job(s)' epochs per block model"
    bounds = [min(int(j.cfg["mdl"]["max_epochs"]), int(j.cfg["mdl"]["patience"]) + 1)
              for j in remaining if j.arch == arch and "mdl" in j.cfg]
    if not bounds:
        return 1.0, "lower bound: 1 epoch (no mdl settings)"
    low = min(bounds)
    return float(low), (f"LOWER BOUND: {low} epochs per block model (early stopping waits mdl.patience epochs "
                        f"after the best; the real figure is higher, known once jobs of this family finish)")


def gpu_prices(costs: dict[str, tuple[float, float, str]], remaining: Sequence[Job],
               finished: Sequence[Job]) -> dict[str, Cost]:
    """Seconds per job at the epochs the protocol will run (`protocol_epochs`), not the report's capped ones."""
    out = {}
    for arch, (overhead, per_epoch, source) in costs.items():
        epochs, how = protocol_epochs(arch, remaining, finished)
        out[arch] = Cost(overhead + per_epoch * epochs, f"{source}; x {epochs:g} epochs ({how})")
    return out


def estimate(kind: str, remaining: Sequence[Job], costs: dict[str, Cost], missing: str | None) -> list[str]:
    """Lines: hours for the remaining jobs whose architecture has a cost, and which have none."""
    if not remaining:
        return [f"{kind}: nothing left to run"]
    by_arch = Counter(job.arch for job in remaining)
    known = {a: n for a, n in by_arch.items() if a in costs}
    lines = []
    if known:
        hours = sum(n * costs[a].seconds for a, n in known.items()) / 3600
        lines.append(f"{kind}: {hours:.2f} h for {sum(known.values())} job(s) "
                     f"({', '.join(f'{a}: {n} x {costs[a].seconds:.1f} s' for a, n in known.items())})")
        lines += [f"  {a}: {costs[a].source}" for a in known]
    if unknown := {a: n for a, n in by_arch.items() if a not in costs}:
        why = missing or f"no measurement for {', '.join(unknown)}"
        lines.append(f"{kind}: {why} ({sum(unknown.values())} job(s): "
                     f"{', '.join(f'{a} {n}' for a, n in unknown.items())})")
    return lines


# --------------------------------------------------------------------------------------------------- main
def report(experiment: str, extra: Sequence[str], max_cells: int, bench: Path, gpu_report: Path) -> str:
    t0 = time.perf_counter()
    jobs = plan_jobs(experiment, extra)
    launched = len({j.launched for j in jobs})
    seconds = time.perf_counter() - t0
    groups = cells(jobs)
    counts = Counter(j.status for j in jobs)
    lines = [f"plan: experiment={experiment}" + (f" {' '.join(extra)}" if extra else "")
             + f": {len(jobs)} seed results in {len(groups)} cells, {launched} launched job(s) (a job trains its "
             f"cell's seeds together; expanded in {seconds:.1f} s)",
             "cells (<dataset>/<eraser>/<arch>-w<width>-d<depth>/c<cell hash>, other swept values: seeds, done):"]
    shown = groups if max_cells <= 0 else groups[:max_cells]
    width = max((len(c.label) for c in shown), default=0)
    lines += [f"  {c.label:<{width}}  seeds {spans(c.seeds)}  done {c.done}/{len(c.seeds)}" for c in shown]
    if len(shown) < len(groups):
        lines.append(f"  ... {len(groups) - len(shown)} more cells (--cells 0 lists them all)")
    lines.append(f"seed results: {len(jobs)}; done {counts['done']} (a result.json with the same config hash: SKIP); "
                 f"to run {len(jobs) - counts['done']}: {counts['to run']} new, {counts['in progress']} resume "
                 f"(progress.json), {counts['other config']} hold another config's result (refused unless "
                 f"force=true), {counts['refused']} refused")
    lines += [f"  refused {job.job_dir}: {job.refused}" for job in [j for j in jobs if j.refused][:3]]
    lines += [f"  refused {job.held}" for job in [j for j in jobs if j.held][:3]]
    if (same := duplicate_jobs([(i, j.cfg, spec_of(j.cfg)) for i, j in enumerate(jobs) if not j.refused])) is not None:
        lines.append(f"  refused (the sweep): {same}")  # as `python -m training.run -m` refuses it
    remaining = [j for j in jobs if j.status != "done"]
    finished = finished_costs(jobs)
    lines.append("cost of the seed results to run (per-seed cost x seeds, by architecture; a cell trains its seeds "
                 "together, so this is an upper bound: tools/bench_sweep.py measures the gain):")
    gpu, gpu_missing = gpu_report_cost(gpu_report)
    done = [j for j in jobs if j.status == "done"]
    for kind, (costs, missing) in (("CPU", bench_cost(bench)), ("GPU", (gpu_prices(gpu, remaining, done),
                                                                         gpu_missing))):
        here = {a: c for (k, a), c in finished.items() if k == kind.lower()}
        lines += [f"  {line}" for line in estimate(kind, remaining, {**costs, **here}, missing)]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0] if __doc__ else None)
    p.add_argument("experiment", help="a preset of conf/experiment/")
    p.add_argument("overrides", nargs="*", help="Hydra overrides, as `make reproduce ARGS=...` passes them")
    p.add_argument("--cells", type=int, default=40, help="cells listed (0: all)")
    p.add_argument("--bench", type=Path, default=BENCH_JSON, help="make bench's measurements")
    p.add_argument("--gpu-report", type=Path, default=GPU_REPORT_JSON, help="make gpu-report's measurements")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        text = report(args.experiment, args.overrides, args.cells, args.bench, args.gpu_report)
    except (UserError, HydraException) as err:  # a bad override: Hydra's message, as `training.run` would say it
        print(f"plan: {' '.join(str(err).split())}", file=sys.stderr)
        return 2
    print(text)
    if refused := [ln.strip().removeprefix("refused ") for ln in text.splitlines() if ln.startswith("  refused ")]:
        print(f"plan: the sweep would be refused (nothing would run): {refused[0]}", file=sys.stderr)
        return 2  # as `python -m training.run -m` refuses a sweep with one refused job
    return 0


if __name__ == "__main__":
    sys.exit(main())
