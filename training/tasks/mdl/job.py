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
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.app.lifecycle import JobRun, Outcome, Progress, run_in_job_dir
from training.app.schema import JobConfig, load_config
from training.app.tasks import own_groups, spec_of
from training.data.shared import Pack
from training.engine.checkpoint import CheckpointStore
from training.engine.fit import NONFINITE_HINT, FitResult
from training.errors import NonFiniteError
from training.inputs.pipeline import Inputs, data_fingerprint, prepare_inputs
from training.inputs.store import Store
from training.tasks.mdl.code import paper_code, prequential_code
from training.tasks.mdl.refusals import estimate_memory, jobs_that_fit, memory_free, precheck
from training.tasks.mdl.result import MdlSections, tail_fall_bits
from training.tasks.mdl.splits import MdlSplit, model_name
from training.tasks.mdl.stop_keys import say_stop_keys
from training.tasks.mdl.trainer import LN2, Trainer, model_jobs, split_of
from training.tasks.mdl.wandb_logger import RunLogger

log = logging.getLogger(__name__)


def _fit_summary(res: FitResult) -> dict[str, Any]:
    return {"best_val_loss": res.best_val_loss, "best_epoch": res.best_epoch, "epochs": res.epochs,
            "steps": res.steps, "stop_reason": res.stop_reason,
            "best_step": next((s for s, v in res.curve if v == res.best_val_loss), None),
            "tail_fall_bits": tail_fall_bits(res.curve)}


BLOCK_FIELDS = ("block", "train_size", "coded_size", "ce_bits", "temperature", "seconds", "best_val_loss",
                "best_epoch", "epochs", "steps")


def _block_problem(saved: Any, block: int) -> str | None:
    """What is wrong with a saved block model (progress.json) that should be block `block`; None: nothing."""
    missing = [k for k in BLOCK_FIELDS if k not in saved] if isinstance(saved, dict) else list(BLOCK_FIELDS)
    if missing:
        return f"missing {missing}"
    ce = saved["ce_bits"]
    if saved["block"] != block or not isinstance(ce, int | float) or not math.isfinite(ce):
        return f"block {saved['block']}, ce_bits {ce!r}"
    return None


def read_progress(progress: Progress, num_blocks: int) -> list[dict[str, Any]]:
    """The finished block models saved in progress.json by an earlier run of this configuration, or [] (start
    over): absent, another configuration's, or malformed (warned about; a file missing a field never resumes)."""
    path, blocks = progress.path, progress.load()
    if blocks is None:
        return []
    for j, b in enumerate(blocks):
        problem = _block_problem(b, j + 2)
        if problem is not None:
            log.warning("ignoring malformed %s (entry %d: %s); starting the MDL blocks over", path, j, problem)
            return []
    if len(blocks) > num_blocks - 1:
        log.warning("ignoring %s: %d block models saved, this job has %d; starting over", path, len(blocks),
                    num_blocks - 1)
        return []
    return blocks


def run_mdl(trainer: Trainer, progress: Progress, logger: RunLogger, with_full: bool = False
            ) -> tuple[dict[str, Any], FitResult | None]:
    """Train the B-1 block models (resuming finished ones from progress.json) and return the code, and the full-data
    model's fit when `with_full` trained it (else None).

    `with_full`: also train the full-data model (`run_full`) alongside, in the same vectorised group
    (it is the longest run: in lockstep with the block models the job's wall time is about halved on GPU).
    """
    split, protocol = trainer.split, trainer.cfg.mdl.protocol
    num_blocks = len(split.block_sizes)
    blocks = read_progress(progress, num_blocks)
    if blocks:
        log.info("resuming after block model %d/%d from %s", len(blocks), num_blocks - 1, progress.path)
    todo = list(range(len(blocks) + 1, num_blocks))
    finished: dict[int, dict[str, Any]] = {}
    full: list[FitResult] = []  # the full-data model's fit, when trained alongside

    def on_finish(k: int, model: torch.nn.Module, res: FitResult) -> None:
        # Block models of one vectorised group end in any order; progress.json keeps a finished prefix.
        if k == len(todo):
            full.append(res)
            return
        i = todo[k]
        coded = split.block(i + 1) if protocol == "prequential" else split.block(num_blocks)
        ce, temperature = trainer.code_bits(model, coded)
        if not math.isfinite(ce):
            raise NonFiniteError(f"non-finite code length ({ce} bits/sample) of block {i + 1} by "
                                 f"{model_name(('block', i))}: {NONFINITE_HINT}")
        finished[i] = {"block": i + 1, "train_size": split.cumsizes[i - 1], "coded_size": len(coded),
                       "ce_bits": ce, "temperature": temperature, "seconds": res.seconds, **_fit_summary(res)}
        log.info("block %d/%d: trained on %d, coded %d at %.4f bits/sample (%d epochs, %d steps, best at epoch %d, "
                 "stopped: %s, %.1fs)", i + 1, num_blocks, split.cumsizes[i - 1], len(coded), ce, res.epochs,
                 res.steps, res.best_epoch, res.stop_reason, res.seconds)
        while len(blocks) + 1 in finished:
            b = finished.pop(len(blocks) + 1)
            blocks.append(b)
            progress.save(blocks)
            logger.log({"mdl/block": b["block"], "mdl/ce_bits": b["ce_bits"], "mdl/train_size": b["train_size"]})

    trainer.train_many(model_jobs(trainer, todo, with_full), on_finish)
    ces = [b["ce_bits"] for b in blocks]
    if protocol == "prequential":
        code = prequential_code(split.block_sizes, ces, trainer.num_classes)
    elif protocol == "paper":
        code = paper_code(split.block_sizes, ces)
    else:
        raise ValueError(f"unknown mdl.protocol {protocol!r} (prequential | paper)")
    out = code.as_dict()
    out["blocks"] = blocks
    out["num_classes"] = trainer.num_classes
    out["n_coded"] = sum(split.block_sizes)
    out["n_val"] = len(split.val_idx)
    return out, (full[0] if full else None)


def run_full(trainer: Trainer, logger: RunLogger, trained: FitResult | None = None) -> dict[str, Any]:
    """One model on all non-validation data, logging the validation loss curve (paper Figs 9-15); `trained`: its
    fit, when run_mdl(with_full=True) trained it alongside the block models."""
    res, alongside = trained, trained is not None
    if res is None:
        res = trainer.train(trainer.split.order, "full", eval_every_steps=trainer.full_eval_every())[1]
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


def run_job(config: Mapping[str, Any] | JobConfig, pack: Pack | None = None) -> Outcome:
    """One MDL job in the one lifecycle: `run(prepare(job))`; `pack`: what it shares with the other jobs of its pack
    (training/data/shared.py), None alone (scripts and tests; the command line runs the task the config names,
    training/tasks/mdl/__init__.py, which runs the same)."""
    return run_in_job_dir(load_config(config, spec_of("mdl"), own_groups()), lambda job: run(prepare(job)), pack=pack,
                          **LIFECYCLE)


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
    inputs = prepare_inputs(cfg, Store.of(cfg.paths, job.pack), job.loaded)
    d = inputs.data
    return Prepared(job, inputs, split_of(cfg.mdl, cfg.seed, len(d.y), d.num_classes, d.input_shape), started)


def run(prepared: Prepared) -> MdlSections:
    """The block models, the code, the full-data run: result.json's sections (the stages' seconds in `timings`)."""
    job, data, split, erasure_info = prepared.job, prepared.inputs.data, prepared.split, prepared.inputs.erasure
    cfg = job.cfg
    logger = RunLogger(cfg.logger, cfg.to_dict(), job.path, run_id=f"{job.cfg_hash}-s{cfg.seed}",
                       out_dir=Path(cfg.paths.out_dir))
    try:
        m = cfg.mdl
        say_stop_keys(m, cfg.optim, len(data.y), split.block_sizes[0])
        checkpoint = CheckpointStore(job.path, job.cfg_hash)
        if cfg.force:
            checkpoint.clear()  # force=true recomputes from scratch (as progress.json)
        trainer = Trainer(cfg, prepared.inputs.x, data.y, data.num_classes, split, job.device,
                          batches=prepared.inputs.batches,
                          checkpoint=checkpoint, numerics=job.numerics, pack=job.pack)
        # training.parallel_models=auto: as many of its models at once as fit in the memory the device has free
        trainer.model_room = estimate_memory(cfg, data, len(data.y), job.device, memory_free(job.device)).num_models
        if job.pack is not None:  # the memory estimate of a pack group (training/tasks/mdl/pack_group.py)
            trainer.pack_room = jobs_that_fit(cfg, data, job.device)
        log.info("job %s: %s, %d samples (%d validation), blocks %s, lr %.3g, device %s", job.path, data.name,
                 len(data.y), len(split.val_idx), split.block_sizes, trainer.optim.lr, job.device)
        t_mdl = time.perf_counter()
        mdl, full_fit = run_mdl(trainer, job.progress, logger, with_full=m.full_run)
        t_full = time.perf_counter()
        final = run_full(trainer, logger, full_fit) if m.full_run else None
        t_end = time.perf_counter()
        checkpoint.clear()  # a group deletes its own; this drops stale ones (another split, a corrupt file)
        logger.summary({"mdl/bits_per_sample": mdl["bits_per_sample"], "mdl/legacy": mdl["legacy"]})
        sections = MdlSections.read({
            "dataset": data.info,
            "eraser": erasure_info,
            "model": trainer.model_info,
            "optim": dataclasses.asdict(trainer.optim),
            "mdl": mdl,
            "final": final,
            "certificate": erasure_info.pop("certificate", None),
        })
        job.timings.update(erase_s=erasure_info["seconds"], mdl_s=t_full - t_mdl, full_run_s=t_end - t_full,
                           before_mdl_s=t_mdl - prepared.started)
        return sections
    finally:
        logger.finish()
