"""`hydra/launcher=packed`: the sweep's jobs that differ only in `seed` run in one process, a pack, as one job of
an inner launcher (local, parallel = joblib, submitit_local, slurm: on SLURM one array task runs one pack).
`hydra.launcher.pack_by=shape` makes it a bucket worker: one process runs every job of the sweep whose model has
one shape (the same architecture and dataset overrides: `bucket_key`), cell after cell, each cell a pack, all of
them sharing the bucket's loaded datasets and erased data (one array task a bucket on SLURM).

Inside a pack every job runs through Hydra's own `run_job`, exactly as the inner launcher would run it alone: its
own composed config, directory, run.log, lock, result.json, resume (progress.json) and ledger line (the sweep's
callbacks see each job, never the pack). What the jobs share is the process (imports and start-up are paid once)
and one `Pack` (training/data/shared.py) that the pack's task creates and hands to each job's run: the loaded
dataset and the erased data are computed once, and a pack group's models trained ahead wait there. A pack killed
part-way is re-run by the same command: its finished jobs skip, the others resume. One failed job does not stop its
pack.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, cast

from hydra.core.hydra_config import HydraConfig
from hydra.core.plugins import Plugins
from hydra.core.utils import JobReturn, JobStatus, run_job, setup_globals
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, RunMode, TaskFunction
from omegaconf import DictConfig, OmegaConf, open_dict

log = logging.getLogger(__name__)
Job = tuple[int, list[str]]  # (the job's number in the sweep, its overrides)


PACK_BY = ("cell", "shape")
# the overrides that can change a job's model shape (its architecture, its input shape and classes): every key of
# these config groups, and the experiment (which sets them)
SHAPE_GROUPS = ("experiment", "arch", "dataset")


def packs_of(job_overrides: Sequence[Sequence[str]], pack_size: int | None, first_num: int = 0) -> list[list[Job]]:
    """The jobs grouped by every override but `seed=...` (in sweep order), cut into packs of at most `pack_size`."""
    cells: dict[tuple[str, ...], list[Job]] = {}
    for num, overrides in enumerate(job_overrides, start=first_num):
        cells.setdefault(cell_key(overrides), []).append((num, list(overrides)))
    size = pack_size or max((len(jobs) for jobs in cells.values()), default=1)
    return [jobs[i:i + size] for jobs in cells.values() for i in range(0, len(jobs), size)]


def cell_key(overrides: Sequence[str]) -> tuple[str, ...]:
    """A job's overrides but its seed, in order: the jobs of one cell have the same."""
    return tuple(sorted(o for o in overrides if not o.startswith("seed=")))


def _group(override: str) -> str:
    """The config group (or top-level key) an override sets: `arch` for `arch=mlp`, `+arch.width=8`, `~arch.x`."""
    return override.lstrip("+~").split("=", 1)[0].split(".", 1)[0].split("@", 1)[0]


def bucket_key(overrides: Sequence[str]) -> tuple[str, ...]:
    """The overrides that decide a job's model shape (SHAPE_GROUPS): the jobs of one bucket have the same. Coarse on
    purpose: two jobs apart here may still share a shape (they then run in two buckets); never the reverse, as
    long as only arch, dataset and experiment choose shapes."""
    return tuple(sorted(o for o in overrides if _group(o) in SHAPE_GROUPS))


def buckets_of(job_overrides: Sequence[Sequence[str]], pack_size: int | None, first_num: int = 0,
               pack_by: str = "cell") -> list[list[Job]]:
    """What each process runs: `pack_by=cell` the packs of `packs_of`; `shape` every job of one model shape (in
    sweep order of their shapes), the jobs of a cell next to each other in seed order and the cells of one eraser
    (`eraser_key`) next to each other, cut into buckets of at most `pack_size` jobs. Every job is in exactly one."""
    if pack_by not in PACK_BY:
        raise ValueError(f"hydra.launcher.pack_by={pack_by!r} is not allowed: use one of {', '.join(PACK_BY)}")
    if pack_by == "cell":
        return packs_of(job_overrides, pack_size, first_num)
    shapes: dict[tuple[str, ...], dict[tuple[str, ...], list[Job]]] = {}
    for pack in packs_of(job_overrides, None, first_num):  # whole cells, in sweep order ...
        # ... those of one eraser next to each other: the bucket's memos then hold its fitted eraser and erased data
        # while every cell that needs them runs
        shapes.setdefault(bucket_key(pack[0][1]), {}).setdefault(eraser_key(pack[0][1]), []).extend(pack)
    ordered = [[job for cells in by_eraser.values() for job in cells] for by_eraser in shapes.values()]
    size = pack_size or max((len(jobs) for jobs in ordered), default=1)
    return [jobs[i:i + size] for jobs in ordered for i in range(0, len(jobs), size)]


def eraser_key(overrides: Sequence[str]) -> tuple[str, ...]:
    """The overrides of the `eraser` group (its name, options, fit): in a bucket, what decides which eraser is fitted
    (the data being the same)."""
    return tuple(sorted(o for o in overrides if _group(o) == "eraser"))


def cells_in(bucket: Sequence[Job]) -> list[list[Job]]:
    """A bucket's jobs cut into its cells' runs of consecutive jobs (one pack each)."""
    out: list[list[Job]] = []
    for job in bucket:
        if out and cell_key(out[-1][-1][1]) == cell_key(job[1]):
            out[-1].append(job)
        else:
            out.append([job])
    return out


def seeds_of(pack: Sequence[Job]) -> list[int]:
    """The seeds of a pack's jobs, in order (a job without a `seed=` override: none, so no pack group)."""
    seeds = [next((o.split("=", 1)[1] for o in overrides if o.startswith("seed=")), "") for _, overrides in pack]
    return [int(s) for s in seeds] if all(s.isdigit() for s in seeds) else []


def job_dirs_of(seeds: Sequence[int], configs: Sequence[DictConfig]) -> dict[int, str]:
    """seed -> its job's directory (absolute), for the pack group to train together only the seeds of one cell
    (training/tasks/mdl/pack_group.py); {} where a directory cannot be resolved here (the job itself then says why)."""
    try:
        return {seed: str(Path(str(OmegaConf.select(c, "paths.job_dir", default=""))).absolute())
                for seed, c in zip(seeds, configs, strict=False)}
    except Exception:  # noqa: BLE001 - an interpolation error: each job reports it
        return {}


class PackTask:
    """The inner launcher's task function: runs the pack whose number the inner launcher gave its job (picklable:
    joblib and submitit send it to their workers). (Not a dataclass: Hydra's plugin scan executes this module
    outside sys.modules, where dataclasses cannot read string annotations.)"""

    def __init__(self, packs: list[list[Job]], sweep_config: DictConfig, hydra_context: HydraContext,
                 task_function: TaskFunction) -> None:
        self.packs = packs
        self.sweep_config = sweep_config  # the multirun's config: each job's is composed from it (basic launcher)
        self.hydra_context = hydra_context  # the sweep's, with its callbacks (the ledger)
        self.task_function = task_function

    def __call__(self, _lead: DictConfig) -> list[JobReturn]:
        from training.cli.preemption import ignore_time_limit_signal
        from training.data.shared import packed

        lead = HydraConfig.get().job  # the pack's own job (each run_job below sets HydraConfig to its job's)
        bucket = self.packs[int(lead.num)]
        log.info("pack of %d jobs: %s", len(bucket), " ".join(str(num) for num, _ in bucket))
        out: list[JobReturn] = []
        here = os.getcwd()
        origin = OmegaConf.select(self.sweep_config, "hydra.runtime.cwd", default=None)
        try:
            # hydra.job.chdir=true put this process in the pack's first job's directory: each job starts where the
            # sweep did, or a relative paths.out_dir would nest every job in that directory
            os.chdir(str(origin or here))
            with packed() as shared:  # the bucket's datasets and erased data, for its lifetime
                for pack in cells_in(bucket):  # one cell (all of it with pack_by=cell)
                    configs = [self.hydra_context.config_loader.load_sweep_config(self.sweep_config, overrides)
                               for _, overrides in pack]
                    seeds = seeds_of(pack)
                    with packed(seeds, job_dirs_of(seeds, configs), shared) as cell:  # + what its seeds share
                        # training.cli.run.job takes it
                        run = functools.partial(cast(Callable[..., Any], self.task_function), pack=cell)
                        for (num, _), config in zip(pack, configs, strict=True):
                            with open_dict(config):
                                config.hydra.job.id = f"{lead.id}_{num}"
                                config.hydra.job.num = num
                            out.append(run_job(hydra_context=self.hydra_context, task_function=run,
                                               config=config, job_dir_key="hydra.sweep.dir",
                                               job_subdir_key="hydra.sweep.subdir"))
        finally:
            os.chdir(here)
        ignore_time_limit_signal()  # the pack is done: a late time-limit signal must not fail it in SLURM's records
        return out


class PackedLauncher(Launcher):
    def __init__(self, inner: str = "local", inner_options: Any = None, pack_by: str = "cell") -> None:
        self.inner, self.pack_by = inner, pack_by
        self.inner_options = dict(inner_options or {})
        self.config: DictConfig | None = None
        self.hydra_context: HydraContext | None = None
        self.task_function: TaskFunction | None = None

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.config, self.hydra_context, self.task_function = config, hydra_context, task_function

    def inner_config(self) -> DictConfig:
        """The sweep's config with `hydra.launcher` replaced by the inner launcher's (conf/hydra/launcher/<inner>
        with `inner_options` on top), composed as Hydra would for `hydra/launcher=<inner>`."""
        assert self.config is not None and self.hydra_context is not None
        if self.inner == "packed":
            raise ValueError("hydra.launcher.inner=packed is not allowed: the inner launcher runs the packs "
                             "(local, parallel, submitit_local or slurm)")
        overrides = [f"hydra/launcher={self.inner}"] + [f"hydra.launcher.{k}={v}" for k, v in
                                                        self.inner_options.items()]
        composed = self.hydra_context.config_loader.load_configuration(
            config_name=str(self.config.hydra.job.config_name), overrides=overrides, run_mode=RunMode.MULTIRUN)
        config = self.config.copy()
        with open_dict(config):
            config.hydra.launcher = composed.hydra.launcher
        return config

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        from hydra._internal.callbacks import Callbacks

        setup_globals()
        assert self.config is not None and self.hydra_context is not None and self.task_function is not None
        pack_size = OmegaConf.select(self.config, "training.pack_size", default=None)
        packs = buckets_of(job_overrides, pack_size, initial_job_idx, self.pack_by)
        log.info("packed launcher: %d jobs in %d packs%s, run by hydra/launcher=%s", len(job_overrides), len(packs),
                 " (a pack per model shape: hydra.launcher.pack_by=shape)" if self.pack_by == "shape" else "",
                 self.inner)
        Path(str(self.config.hydra.sweep.dir)).mkdir(parents=True, exist_ok=True)
        task = PackTask(packs, self.config, self.hydra_context, self.task_function)
        # the inner launcher sees one job per pack (its first job's config), with no callbacks: the sweep's
        # callbacks see each job of the pack, inside it
        quiet = HydraContext(config_loader=self.hydra_context.config_loader, callbacks=Callbacks())
        inner = Plugins.instance().instantiate_launcher(hydra_context=quiet, task_function=task,
                                                        config=self.inner_config())
        returns = inner.launch([pack[0][1] for pack in packs], initial_job_idx=0)
        by_num: dict[int, JobReturn] = {}
        for pack, ret in zip(packs, returns, strict=True):
            if ret.status == JobStatus.COMPLETED:
                by_num.update({num: r for (num, _), r in zip(pack, ret.return_value, strict=True)})
            else:  # the pack itself failed (its process died, it could not start): each of its jobs failed so
                for num, _ in pack:
                    by_num[num] = JobReturn(status=JobStatus.FAILED, _return_value=ret._return_value,
                                            overrides=ret.overrides, hydra_cfg=ret.hydra_cfg, cfg=ret.cfg)
        return [by_num[num] for num in sorted(by_num)]
