"""One job: dataset -> eraser -> prequential MDL (one fresh model per block) -> full-data run -> result.json.

`run_job(cfg)` takes the resolved config (a plain dict or the typed `JobConfig`) and runs in the one job
lifecycle (training/app/lifecycle.py: lock, skip, resume, result). Each block model draws its init, batch order
and augmentation from generators derived from (seed, block), so a job killed after block i and resumed gives
exactly the uninterrupted numbers.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import torch

from training.app.lifecycle import JobRun, Outcome, Progress, run_in_job_dir
from training.app.lifecycle import run_cell as run_cell_jobs
from training.app.schema import JobConfig, load_config
from training.app.tasks import own_groups, spec_of
from training.common import interrupt
from training.engine.checkpoint import CheckpointStore
from training.engine.fit import NONFINITE_HINT, FitResult
from training.errors import NonFiniteError
from training.inputs.pipeline import Inputs, data_fingerprint, prepare_inputs
from training.inputs.store import Store
from training.tasks.mdl.cell import same, train_cell
from training.tasks.mdl.code import paper_code, prequential_code
from training.tasks.mdl.refusals import estimate_memory, memory_free, precheck
from training.tasks.mdl.result import MdlSections, tail_fall_bits
from training.tasks.mdl.splits import MdlSplit, model_name
from training.tasks.mdl.stop_keys import say_stop_keys
from training.tasks.mdl.trainer import LN2, FitJob, Trainer, split_of
from training.tasks.mdl.wandb_logger import RunLogger

log = logging.getLogger(__name__)
T = TypeVar("T")


def _fit_summary(res: FitResult) -> dict[str, Any]:
    return {"best_val_loss": res.best_val_loss, "best_epoch": res.best_epoch, "epochs": res.epochs,
            "steps": res.steps, "stop_reason": res.stop_reason,
            "best_step": next((s for s, v in res.curve if v == res.best_val_loss), None),
            "tail_fall_bits": tail_fall_bits(res.curve)}


BLOCK_FIELDS = ("block", "train_size", "coded_size", "ce_bits", "temperature", "seconds", "best_val_loss",
                "best_epoch", "epochs", "steps")


def read_progress(progress: Progress, num_blocks: int) -> list[dict[str, Any]]:
    """The finished block models saved in progress.json by an earlier run of this configuration, or [] (start
    over): absent, another configuration's, or malformed (warned about; a file missing a field never resumes)."""
    path, blocks = progress.path, progress.load()
    if blocks is None:
        return []
    for j, b in enumerate(blocks):  # entry j: the block model that codes block j + 2
        missing = [k for k in BLOCK_FIELDS if k not in b] if isinstance(b, dict) else list(BLOCK_FIELDS)
        ce = None if missing else b["ce_bits"]
        if missing or b["block"] != j + 2 or not isinstance(ce, int | float) or not math.isfinite(ce):
            problem = f"missing {missing}" if missing else f"block {b['block']}, ce_bits {ce!r}"
            log.warning("ignoring malformed %s (entry %d: %s); starting the MDL blocks over", path, j, problem)
            return []
    if len(blocks) > num_blocks - 1:
        log.warning("ignoring %s: %d block models saved, this job has %d; starting over", path, len(blocks),
                    num_blocks - 1)
        return []
    return blocks


class Blocks:
    """The B-1 block models of one job (and its full-data model with `with_full`, trained alongside in the same
    group: it is the longest run, so in lockstep with the block models the job's wall time is about halved on GPU):
    which remain (resuming finished ones from progress.json), what to train (`jobs`), what each finished model adds
    (`on_finish`: coded, saved to progress.json in order) and the code they make (`code`)."""

    def __init__(self, trainer: Trainer, progress: Progress, logger: RunLogger, with_full: bool = False) -> None:
        self.trainer, self.progress, self.logger, self.with_full = trainer, progress, logger, with_full
        self.num_blocks = len(trainer.split.block_sizes)
        self.blocks = read_progress(progress, self.num_blocks)
        if self.blocks:
            log.info("resuming after block model %d/%d from %s", len(self.blocks), self.num_blocks - 1, progress.path)
        self.todo = list(range(len(self.blocks) + 1, self.num_blocks))
        self.finished: dict[int, dict[str, Any]] = {}
        self.full: list[FitResult] = []  # the full-data model's fit, when trained alongside

    def jobs(self) -> list[FitJob]:
        """What `Trainer.train_many` trains: block model i on the first i blocks, for each i to do, then (`with_full`)
        the full-data model on every non-validation row (of the job's split: `MdlSplit.of_model`)."""
        split, full = self.trainer.split, (self.trainer.split.order, "full", self.trainer.cfg.mdl.eval_every_steps)
        return [(split.of_model(("block", i)).prefix(i), ("block", i), None) for i in self.todo] + \
            ([full] if self.with_full else [])

    def on_finish(self, k: int, model: torch.nn.Module, res: FitResult) -> None:
        # Block models of one vectorised group end in any order; progress.json keeps a finished prefix.
        if k == len(self.todo):
            self.full.append(res)
            return
        trainer, blocks = self.trainer, self.blocks
        i, num_blocks = self.todo[k], self.num_blocks
        split = trainer.split.of_model(("block", i))  # the job's split, or the model's own (mdl.split=redraw)
        coded = split.block(i + 1) if trainer.cfg.mdl.protocol == "prequential" else split.block(num_blocks)
        ce, temperature = trainer.code_bits(model, coded, split)
        if not math.isfinite(ce):
            raise NonFiniteError(f"non-finite code length ({ce} bits/sample) of block {i + 1} by "
                                 f"{model_name(('block', i))}: {NONFINITE_HINT}")
        self.finished[i] = {"block": i + 1, "train_size": split.cumsizes[i - 1], "coded_size": len(coded),
                            "ce_bits": ce, "temperature": temperature, "seconds": res.seconds, **_fit_summary(res)}
        log.info("block %d/%d: trained on %d, coded %d at %.4f bits/sample (%d epochs, %d steps, best at epoch %d, "
                 "stopped: %s, %.1fs)", i + 1, num_blocks, split.cumsizes[i - 1], len(coded), ce, res.epochs,
                 res.steps, res.best_epoch, res.stop_reason, res.seconds)
        while len(blocks) + 1 in self.finished:
            b = self.finished.pop(len(blocks) + 1)
            blocks.append(b)
            self.progress.save(blocks)
            self.logger.log({"mdl/block": b["block"], "mdl/ce_bits": b["ce_bits"], "mdl/train_size": b["train_size"]})

    def code(self) -> tuple[dict[str, Any], FitResult | None]:
        """The code of the finished blocks, and the full-data model's fit when it trained alongside (else None)."""
        trainer, split, protocol = self.trainer, self.trainer.split, self.trainer.cfg.mdl.protocol
        ces = [b["ce_bits"] for b in self.blocks]
        if protocol == "prequential":
            code = prequential_code(split.block_sizes, ces, trainer.num_classes)
        elif protocol == "paper":
            code = paper_code(split.block_sizes, ces)
        else:
            raise ValueError(f"unknown mdl.protocol {protocol!r} (prequential | paper)")
        out = {**code.as_dict(), "blocks": self.blocks, "num_classes": trainer.num_classes,
               "n_coded": sum(split.block_sizes), "n_val": len(split.val_idx)}
        return out, (self.full[0] if self.full else None)


def run_full(trainer: Trainer, logger: RunLogger, trained: FitResult | None = None) -> dict[str, Any]:
    """One model on all non-validation data, logging the validation loss curve (paper Figs 9-15); `trained`: its
    fit, when `Blocks(with_full=True)` trained it alongside the block models."""
    res, alongside = trained, trained is not None
    if res is None:
        res = trainer.train(trainer.split.order, "full", eval_every_steps=trainer.cfg.mdl.eval_every_steps)[1]
    for step, loss in res.curve:
        logger.log({"full/val_loss": loss}, step=step)
    return {"val_loss": res.best_val_loss, "val_loss_bits": res.best_val_loss / LN2,
            "val_loss_curve": [[s, v] for s, v in res.curve], "seconds": res.seconds,
            "trained_with_block_models": alongside, **_fit_summary(res)}


def _describe(result: dict[str, Any]) -> str:
    mdl = result["mdl"]
    return f"{mdl['bits_per_sample']:.4f} bits/sample ({mdl['protocol']}), legacy {mdl['legacy']:.4f}"


# run_in_job_dir's hooks of an MDL job (training/tasks/mdl/__init__.py declares the task)
LIFECYCLE: dict[str, Any] = {"precheck": precheck, "describe": _describe, "finite": ("mdl", "final"),
                             "complete": ("mdl",), "fingerprint": data_fingerprint}


def run_job(config: Mapping[str, Any] | JobConfig, store: Store | None = None) -> Outcome:
    """One MDL job (one seed) in the one lifecycle: `run(prepare(job))` (scripts and tests; the command line runs
    a cell, `run_cell`)."""
    return run_in_job_dir(load_config(config, spec_of("mdl"), own_groups()), lambda job: run(prepare(job)),
                          store=store, **LIFECYCLE)


def run_cell(cfgs: list[JobConfig], store: Store | None = None) -> list[Outcome]:
    """The jobs of a cell's seeds together (training/app/lifecycle.py `run_cell`): data loaded and erasers fitted
    once per fit key (`store`), every seed's block models in one lockstep group (`train_cell`); each seed's precheck
    estimates the memory of the whole cell."""
    return run_cell_jobs(cfgs, train_seeds, store=store, **{**LIFECYCLE, "precheck": partial(precheck, cell=cfgs)})


@dataclass(frozen=True)
class Prepared:
    """An MDL job's inputs (`prepare`: the coded data, labels permuted for a null, its erased images, how they were
    erased and the batches' eraser) and the split of the coded rows into blocks."""

    job: JobRun
    inputs: Inputs
    split: MdlSplit
    started: float  # perf_counter() when the job's body began (timings.before_mdl_s)


def prepare(job: JobRun) -> Prepared:
    """Data loaded (or what the precheck loaded), labels permuted, the eraser's fit split, erased (through the
    erased-data cache), and the MDL split of the coded rows."""
    cfg, started = job.cfg, time.perf_counter()
    inputs = prepare_inputs(cfg, job.store or Store.of(cfg.paths), job.loaded)  # the cell's store, or the job's
    d = inputs.data
    return Prepared(job, inputs, split_of(cfg.mdl, cfg.seed, len(d.y), d.num_classes, d.input_shape), started)


class SeedRun:
    """One job's training state (its trainer, blocks, logger), from `Prepared` to its result.json sections."""

    trainer: Trainer

    def __init__(self, prepared: Prepared, like: SeedRun | None = None) -> None:
        """`like`: a seed of the same cell whose trainer's data on the device this one shares where its images are the
        same (training/tasks/mdl/cell.py `same`)."""
        job, data, split = prepared.job, prepared.inputs.data, prepared.split
        cfg = job.cfg
        self.prepared = prepared
        self.logger = RunLogger(cfg.logger, cfg.to_dict(), job.path, run_id=f"{job.cfg_hash}-s{cfg.seed}",
                                out_dir=Path(cfg.paths.out_dir))
        try:
            say_stop_keys(cfg.mdl, cfg.optim, len(data.y), split.block_sizes[0])
            self.checkpoint = CheckpointStore(job.path, job.cfg_hash)
            if cfg.force:
                self.checkpoint.clear()  # force=true recomputes from scratch (as progress.json)
            shared = like.trainer.data if like is not None and same(like.prepared.inputs.x, prepared.inputs.x) else None
            self.trainer = Trainer(cfg, prepared.inputs.x, data.y, data.num_classes, split, job.device, data=shared,
                                   batches=prepared.inputs.batches, checkpoint=self.checkpoint, numerics=job.numerics)
            # training.parallel_models=auto: as many of its models at once as fit in the memory the device has free
            self.trainer.model_room = estimate_memory(cfg, data, len(data.y), job.device,
                                                      memory_free(job.device)).num_models
            log.info("job %s: %s, %d samples (%d validation), blocks %s, lr %.3g, device %s", job.path, data.name,
                     len(data.y), len(split.val_idx), split.block_sizes, self.trainer.optim.lr, job.device)
            self.blocks = Blocks(self.trainer, job.progress, self.logger, with_full=cfg.mdl.full_run)
        except BaseException:
            self.logger.finish()
            raise
        self.t_mdl = time.perf_counter()

    def sections(self) -> MdlSections:
        """The code, the full-data run (trained alongside, or now), result.json's sections (timings in the job)."""
        job, data, erasure_info = self.prepared.job, self.prepared.inputs.data, self.prepared.inputs.erasure
        mdl, full_fit = self.blocks.code()
        t_full = time.perf_counter()
        final = run_full(self.trainer, self.logger, full_fit) if job.cfg.mdl.full_run else None
        t_end = time.perf_counter()
        self.checkpoint.clear()  # a group deletes its own; this drops stale ones (another split, a corrupt file)
        self.logger.summary({"mdl/bits_per_sample": mdl["bits_per_sample"], "mdl/legacy": mdl["legacy"]})
        sections = MdlSections.read({  # the certificate is popped out of the eraser's record
            "dataset": data.info, "eraser": erasure_info, "model": self.trainer.model_info,
            "optim": dataclasses.asdict(self.trainer.optim), "mdl": mdl, "final": final,
            "certificate": erasure_info.pop("certificate", None)})
        job.timings.update(erase_s=erasure_info["seconds"], mdl_s=t_full - self.t_mdl, full_run_s=t_end - t_full,
                           before_mdl_s=self.t_mdl - self.prepared.started)
        return sections


def run(prepared: Prepared) -> MdlSections:
    """The block models, the code, the full-data run: result.json's sections (the stages' seconds in `timings`)."""
    seed = SeedRun(prepared)
    try:
        seed.trainer.train_many(seed.blocks.jobs(), seed.blocks.on_finish)
        return seed.sections()
    finally:
        seed.logger.finish()


def _caught(f: Callable[..., T], *args: Any) -> T | Exception:
    """f(*args), or the exception it raised: a seed's failure is its own (the lifecycle records it), a signal's stop is
    not (`interrupt.stop_behind`)."""
    try:
        return f(*args)
    except Exception as err:  # noqa: BLE001 - this seed's
        interrupt.stop_behind(err)
        return err


def train_seeds(jobs: list[JobRun]) -> list[MdlSections | BaseException]:
    """A cell's jobs that run (`run_cell`): each prepared (data and erasers shared through the store), all their
    block models trained in one lockstep group (`train_cell`), then each one's sections; a seed's failure is its
    own (its exception in its place), the others go on."""
    if len(jobs) == 1:  # a one-seed cell: the one job, as alone
        return [_caught(lambda j: run(prepare(j)), jobs[0])]
    out: list[MdlSections | BaseException | None] = [None] * len(jobs)
    seeds: dict[int, SeedRun] = {}
    try:
        for i, job in enumerate(jobs):
            made = _caught(lambda j: SeedRun(prepare(j), next(iter(seeds.values()), None)), job)
            if isinstance(made, SeedRun):
                seeds[i] = made
            else:
                out[i] = made
        order = list(seeds)
        if order:  # parallel_models=auto: as many of the seeds' models at once as the cell's memory estimate fits
            lead = seeds[order[0]]
            job = lead.prepared.job
            data = lead.prepared.inputs.data
            lead.trainer.model_room = estimate_memory(job.cfg, data, len(data.y), job.device, memory_free(job.device),
                                                      [seeds[i].prepared.job.cfg for i in order]).num_models
        errors = train_cell([seeds[i].trainer for i in order], [seeds[i].blocks.jobs() for i in order],
                            [seeds[i].blocks.on_finish for i in order])
        for j, i in enumerate(order):
            out[i] = errors[j] if j in errors else _caught(seeds[i].sections)
    finally:
        for seed in seeds.values():
            seed.logger.finish()
    return [o if o is not None else RuntimeError("not run") for o in out]
