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
from pathlib import Path
from typing import Any

import torch

from erasure.registry import ERASERS
from models.registry import arch_traits
from training.app.lifecycle import JobRun, Outcome, Progress, run_in_job_dir
from training.app.schema import JobConfig, MdlConfig
from training.app.wandb_logger import RunLogger
from training.common import packs
from training.data import LoadedData
from training.data.erase import BatchEraser, FitPlan, apply_eraser, apply_eraser_keeping_map
from training.engine.batches import DeviceData
from training.engine.checkpoint import CheckpointStore
from training.engine.fit import (
    NONFINITE_HINT,
    BatchTransform,
    FitConfig,
    FitResult,
    Member,
    TrainData,
    cross_entropy_sum,
    fit,
    fit_temperature,
)
from training.engine.group import (
    GroupOptions,
    OnFinish,
    check_options,
    fit_group,
    resolve_engine,
    why_not_vectorized,
)
from training.engine.optim import OptimSettings
from training.engine.regularizers import build_regularizer
from training.engine.seeding import generator, seeded_global_rng
from training.errors import NonFiniteError
from training.mdl import pack_group
from training.mdl.code import paper_code, prequential_code
from training.mdl.precheck import (
    data_fingerprint,
    fit_plan,
    jobs_that_fit,
    load_data,
    precheck,
    with_permuted_labels,
)
from training.mdl.splits import MdlSplit, make_split, model_name
from training.mdl.stop_keys import say_stop_keys

log = logging.getLogger(__name__)
LN2 = math.log(2)
FitJob = tuple[torch.Tensor, object, "int | None"]  # (training rows, tag, eval_every_steps): one model to train


def resolve_optim(cfg: JobConfig) -> OptimSettings:
    """The optimiser settings of the job (the paper's come from conf/ through optim.*), with the depth rule."""
    from models import depth_lr_multiplier

    o = cfg.optim
    mult = float(depth_lr_multiplier(cfg.arch)) if o.depth_lr_rule else 1.0
    return OptimSettings(lr_base=float(o.lr), lr=float(o.lr) * mult, depth_lr_multiplier=mult, beta1=float(o.beta1),
                         beta2=float(o.beta2), weight_decay=float(o.weight_decay), warmup_steps=o.warmup_steps,
                         batch_size=o.batch_size)


def fit_config(cfg: JobConfig, warmup_steps: int, eval_every_steps: int | None = None,
               batch_transform: BatchTransform | None = None) -> FitConfig:
    """The fit loop's settings of a job: batch size, `mdl.*` early stopping (step-aware) and augmentation, and
    the map of each augmented batch (`eraser.after_augment`: `BatchEraser`)."""
    m = cfg.mdl
    return FitConfig(batch_size=cfg.optim.batch_size, patience=m.patience, max_epochs=m.max_epochs,
                     augment=cfg.dataset.augment, eval_every_steps=eval_every_steps, progress=cfg.progress,
                     batch_transform=batch_transform, **stop_options(m, warmup_steps))


class Trainer:
    """Builds a fresh μP model + optimizer per fit and trains it on index subsets of on-device data.

    The data lives on the device once, in the smallest exact dtype (`training.storage`); batches are index
    gathers. `train_many` trains several models (the block models of a job) in vectorised groups of
    `training.parallel_models` (auto: all of them, for models the vectorised path supports).

    `batches` (`eraser.after_augment`): the training batches are drawn from `batches.raw` (a second copy on the
    device) and erased after augmentation by `batches.transform`; the validation set and the coded blocks are
    the erased `x`, as without it.
    """

    def __init__(self, cfg: JobConfig, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                 split: MdlSplit, device: torch.device, data: DeviceData | None = None,
                 batches: BatchErasure | None = None, checkpoint: CheckpointStore | None = None):
        self.cfg, self.seed, self.opts = cfg, cfg.seed, cfg.training
        self.checkpoint = checkpoint  # where a signal saves the models in training (training/engine/checkpoint.py)
        # `data`: the same x already on the device (several seeds' trainers share one copy)
        self.data = data if data is not None else DeviceData(x, device, storage=self.opts.storage)
        self.train_data, self.batch_transform = self.data, None
        if batches is not None:
            self.train_data = DeviceData(batches.raw, device, storage=self.opts.storage)
            self.batch_transform = batches.transform.to(device)  # the eraser's state moves to the device once
        self.y = y.to(device)
        self.num_classes, self.split, self.device = num_classes, split, device
        self.optim = resolve_optim(cfg)
        self.regularizer = build_regularizer(cfg.regularizer, num_classes)
        self.x_val, self.y_val = self.data.all(split.val_idx), self.y[split.val_idx.to(device)]
        self.input_shape = tuple(int(s) for s in x.shape[1:])
        self.x = x  # the images as given (the pack group checks a later seed's models were trained on them)
        self.model_info: dict[str, Any] = {}
        self.pack_room = 1  # how many jobs' models fit in memory at once (a pack group: training/mdl/pack_group.py)

    def for_seed(self, cfg: JobConfig) -> Trainer:
        """This job's trainer for another seed of its configuration, on the same data (one copy on the device): a
        pack group's companion (training/mdl/pack_group.py), with no checkpoint of its own."""
        return Trainer(cfg, self.x, self.y, self.num_classes, split_of(cfg, len(self.y)), self.device, data=self.data)

    def train_set(self) -> TrainData:
        """What every model of this job trains on (raw when erased after augmentation) and validates on."""
        return TrainData(self.train_data, self.y, self.x_val, self.y_val)

    def full_eval_every(self) -> int | None:
        return self.cfg.mdl.eval_every_steps

    def fit_cfg(self, eval_every_steps: int | None = None) -> FitConfig:
        return fit_config(self.cfg, self.optim.warmup_steps, eval_every_steps, self.batch_transform)

    def member(self, idx: torch.Tensor, tag: object, eval_every_steps: int | None = None) -> Member:
        """A fresh model (init drawn from (seed, "init", tag)), its optimizer, data subset and generator."""
        from models import build_with_facts

        with seeded_global_rng(self.seed, "init", tag):
            model, facts = build_with_facts(self.cfg.arch, self.input_shape, self.num_classes)
            model = model.to(self.device)
        self.model_info = facts
        opt = self.optim.build(model)
        return Member(model, opt, idx.to(self.device), generator(self.seed, "batches", tag),
                      self.fit_cfg(eval_every_steps), val_idx=self.split.val_idx, name=model_name(tag))

    def train(self, idx: torch.Tensor, tag: object, eval_every_steps: int | None = None
              ) -> tuple[torch.nn.Module, FitResult]:
        return self._fit_one(self.member(idx, tag, eval_every_steps), tag)

    def _fit_one(self, m: Member, tag: object) -> tuple[torch.nn.Module, FitResult]:
        # Dropout/drop-path draw from the global RNG: seed it per (seed, tag) so a resumed job's block i
        # sees the same stream as in an uninterrupted run (and runs do not depend on earlier blocks).
        with seeded_global_rng(self.seed, "train", tag):
            res = fit(m, self.train_set(), self.regularizer, desc=f"{tag}", checkpoint=self.checkpoint)
        return m.model, res

    def group_size(self, first: Member, count: int) -> int:
        """How many models train at once: `training.parallel_models` (auto | N), 1 where not vectorisable."""
        want = self.opts.parallel_models
        engine = resolve_engine(self.opts.engine, self.device)
        reason = why_not_vectorized(first.model, first.optimizer, self.regularizer, engine)
        if str(want) == "auto":
            # training.parallel_models=auto vectorises small models (launch-bound), as their registry entry says
            auto = arch_traits(self.cfg.arch.name).vectorises and reason is None
            return count if auto else 1
        if int(want) > 1 and reason is not None:
            log.warning("training.parallel_models=%s ignored: %s; training one model at a time", want, reason)
            return 1
        return max(1, int(want))

    def train_many(self, jobs: list[FitJob], on_finish: OnFinish) -> None:
        """Train one model per (idx, tag, eval_every_steps); `on_finish(k, model, result)` as each one ends (any
        order within a group). Same numbers as `train` one by one: bitwise with the loop engine (CPU default),
        up to float32 rounding with the stacked one (tests/test_vectorized.py). In a pack (hydra/launcher=packed)
        the models an earlier seed's group trained for this job are taken from there, and this job's group may
        train the pack's later seeds' models too (training/mdl/pack_group.py)."""
        rest = pack_group.take_trained(self, jobs, on_finish)
        if len(rest) < len(jobs):
            self._train_many([jobs[k] for k in rest], lambda k, model, res: on_finish(rest[k], model, res), False)
        else:
            self._train_many(jobs, on_finish, True)

    def _train_many(self, jobs: list[FitJob], on_finish: OnFinish, with_pack: bool) -> None:
        if not jobs:
            return
        first = self.member(*jobs[0])
        size = self.group_size(first, len(jobs))
        if size == 1 and len(jobs) == 1 and self.checkpoint is not None and self.checkpoint.in_group(first.name):
            size = 2  # the last model of a group an earlier attempt saved goes on in that group's engine
        if size <= 1:
            for k, job in enumerate(jobs):
                on_finish(k, *self._fit_one(first if k == 0 else self.member(*job), job[1]))
            return
        if with_pack and size >= len(jobs) and (
                others := pack_group.companions(self, self.pack_room - 1)):
            pack_group.train_together(self, first, jobs, others, on_finish,
                                      lambda rest, done: self._train_many(rest, done, False))
            return
        for start in range(0, len(jobs), size):
            chunk = jobs[start: start + size]
            members = [first if start == 0 and j == 0 else self.member(*job) for j, job in enumerate(chunk)]

            def done(k: int, model: torch.nn.Module, res: FitResult, offset: int = start) -> None:
                on_finish(offset + k, model, res)

            fit_group(members, self.train_set(), self.group_options(done))

    def group_options(self, on_finish: OnFinish) -> GroupOptions:
        o = self.opts
        return GroupOptions(on_finish=on_finish, progress=self.cfg.progress, compile=o.compile, engine=o.engine,
                            regularizer=self.regularizer, workers=o.workers, fused_optimizer=o.fused_optimizer,
                            checkpoint=self.checkpoint)

    def all_models(self) -> list[FitJob]:
        """Every model of an MDL job (`run_mdl`): the block models, then the full-data model with `mdl.full_run`."""
        return model_jobs(self, list(range(1, len(self.split.block_sizes))), self.cfg.mdl.full_run)

    def code_bits(self, model: torch.nn.Module, idx: torch.Tensor) -> tuple[float, float]:
        """Mean cross-entropy in bits of `model` (already in eval mode) on the samples `idx`, and the
        temperature used (1 unless `mdl.calibrate_temperature`, then fitted on the validation set)."""
        idx = idx.to(self.device)
        t = fit_temperature(model, self.x_val, self.y_val) if self.cfg.mdl.calibrate_temperature else 1.0
        return cross_entropy_sum(model, self.data.all(idx), self.y[idx], temperature=t) / len(idx) / LN2, t


def stop_options(m: MdlConfig, warmup_steps: int) -> dict[str, int]:
    """The step-aware early-stopping options of `mdl` (training/engine/stopping.py) as FitConfig fields."""
    return {"warmup_steps": warmup_steps if m.stop_after_warmup else 0, "min_steps": m.min_steps,
            "patience_min_steps": m.patience_min_steps}


def _fit_summary(res: FitResult) -> dict[str, Any]:
    return {"best_val_loss": res.best_val_loss, "best_epoch": res.best_epoch, "epochs": res.epochs,
            "steps": res.steps, "stop_reason": res.stop_reason,
            "best_step": next((s for s, v in res.curve if v == res.best_val_loss), None)}


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


def model_jobs(trainer: Trainer, blocks: list[int], with_full: bool) -> list[FitJob]:
    """What `Trainer.train_many` trains for an MDL job: block model i on the first i blocks, for each of `blocks`,
    then (`with_full`) the full-data model on every non-validation row."""
    split = trainer.split
    jobs: list[FitJob] = [(split.prefix(i), ("block", i), None) for i in blocks]
    return jobs + ([(split.order, "full", trainer.full_eval_every())] if with_full else [])


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


class ZScore:
    """Per-coordinate (pixel, channel) standardisation with the statistics of `x` (paper Fig. 16), in float64, back
    to the input's dtype. Constant coordinates (std < 1e-8, e.g. MNIST borders) are centred and left unscaled."""

    def __init__(self, x: torch.Tensor) -> None:
        mean = x.double().mean(dim=0, keepdim=True)
        std = x.double().std(dim=0, keepdim=True)
        self.mean, self.std = mean, torch.where(std < 1e-8, torch.ones_like(std), std)

    def to(self, device: torch.device | str) -> ZScore:
        out = object.__new__(ZScore)
        out.mean, out.std = self.mean.to(device), self.std.to(device)
        return out

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        return ((v.double() - self.mean) / self.std).to(v.dtype)


def zscore_map(x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """Per-coordinate standardisation with the statistics of `x` (`ZScore`)."""
    return ZScore(x)


def prepare_data(cfg: JobConfig, loaded: LoadedData | None = None) -> tuple[LoadedData, torch.Tensor, dict[str, Any]]:
    """The coded data of a job: loaded (or `loaded`, what its precheck read), labels permuted for the null control
    (`dataset.permute_labels`, seeded by the job seed, before anything else sees them), then erased
    (`erase_maybe_zscored`). With `eraser.fit_on=holdout` or `self` the returned data and erased images are the
    coded part only."""
    coded, x, info, _ = _prepare(cfg, False, loaded)
    return coded, x, info


def prepare_inputs(cfg: JobConfig, loaded: LoadedData | None = None
                   ) -> tuple[LoadedData, torch.Tensor, dict[str, Any], BatchErasure | None]:
    """`prepare_data`, and with `eraser.after_augment` what the training batches are drawn from instead: the
    unerased images and the fitted eraser (`BatchErasure`). The erased images (validation set, coded blocks) are
    the same as without it."""
    edits = ERASERS.meta(cfg.eraser.name)["kind"] == "edit"  # a dataset edit has no map to apply per batch
    if cfg.eraser.after_augment and edits:
        log.info("eraser.after_augment: %s edits the dataset once (as the paper's precomputed datasets); the "
                 "augmented batches are drawn from the edited data", cfg.eraser.name)
    return _prepare(cfg, cfg.eraser.after_augment and not edits, loaded)


def _prepare(cfg: JobConfig, after_augment: bool, loaded: LoadedData | None
             ) -> tuple[LoadedData, torch.Tensor, dict[str, Any], BatchErasure | None]:
    data = with_permuted_labels(cfg, load_data(cfg, loaded))  # loaded by the precheck (precheck.py), or now
    plan = fit_plan(cfg, data)
    coded = data if plan is None or plan.coded_idx is None else data.subset(plan.coded_idx)
    if after_augment:
        x, info, batches = erase_after_augment(data, cfg, plan)
        return coded, x, info, batches
    x, info = erase_maybe_zscored(data, cfg, plan)
    info["after_augment"] = False
    return coded, x, info, None


def erase_maybe_zscored(data: LoadedData, cfg: JobConfig,
                        plan: FitPlan | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """Apply the eraser (fitted as `plan` says and applied to the coded part, with a plan); with
    `dataset.zscore` the data is standardised per coordinate, `dataset.zscore_order`: "before" erasure
    (statistics of the raw data) or "after" it (statistics of the erased data, as the paper's code did). Gradient
    erasure optimises pixels in [0, 1] (sigmoid), so with "before" it erases first and then gets the same affine
    standardisation (statistics of the unerased data)."""
    cache_dir, cert, eraser = Path(cfg.paths.cache_dir), cfg.certificate, cfg.eraser
    if not cfg.dataset.zscore:
        return apply_eraser(data, eraser, cache_dir, with_certificate=cert, plan=plan)
    if cfg.dataset.zscore_order == "after":
        x, info = apply_eraser(data, eraser, cache_dir, with_certificate=cert, plan=plan)
        info["zscore"] = "after erasure (statistics of the erased data)"
        return zscore_map(x)(x), info
    standardize = zscore_map(data.x)
    if ERASERS.meta(eraser.name)["kind"] == "edit":
        x, info = apply_eraser(data, eraser, cache_dir, with_certificate=cert)
        info["zscore"] = "after erasure (gradient erasure works in pixel space)"
        return standardize(x), info
    zdata = LoadedData(data.name, standardize(data.x), data.y, data.num_classes, dict(data.info))
    x, info = apply_eraser(zdata, eraser, cache_dir, with_certificate=cert,
                           plan=None if plan is None else plan.mapped(standardize))
    info["zscore"] = "before erasure"
    return x, info


@dataclass(frozen=True)
class BatchErasure:
    """`eraser.after_augment=true`: the training batches are drawn from `raw`, the coded part's images unerased
    (z-scored when `dataset.zscore_order=before`), and each (augmented) batch is erased on the device by
    `transform(x, y)`."""

    raw: torch.Tensor
    transform: BatchEraser


def erase_after_augment(data: LoadedData, cfg: JobConfig, plan: FitPlan | None = None
                        ) -> tuple[torch.Tensor, dict[str, Any], BatchErasure | None]:
    """`erase_maybe_zscored` (the same erased images, from the same cache entry: validation set and coded blocks are
    erased once, unaugmented), plus the fitted eraser and the unerased images for the training batches. With
    `dataset.zscore_order=after` each erased batch is then standardised with the statistics of the erased data,
    as the erased images are. None instead of a `BatchErasure` where the batches are the erased images anyway (the
    identity control without a z-score after it)."""
    cache_dir, cert = Path(cfg.paths.cache_dir), cfg.certificate
    then: ZScore | None = None
    if cfg.dataset.zscore and cfg.dataset.zscore_order == "before":
        standardize = zscore_map(data.x)
        data = LoadedData(data.name, standardize(data.x), data.y, data.num_classes, dict(data.info))
        plan = None if plan is None else plan.mapped(standardize)
        x, info, eraser = apply_eraser_keeping_map(data, cfg.eraser, cache_dir, with_certificate=cert,
                                                   plan=plan)
        info["zscore"] = "before erasure"
    else:
        x, info, eraser = apply_eraser_keeping_map(data, cfg.eraser, cache_dir, with_certificate=cert,
                                                   plan=plan)
        if cfg.dataset.zscore:
            then = ZScore(x)
            x = then(x)
            info["zscore"] = "after erasure (statistics of the erased data)"
    info["after_augment"] = True
    info["batch_eraser"] = ({"applied": False, "why": "the identity control has nothing to erase"} if eraser is None
                            else {"applied": True, "report": eraser.report(),
                                  "cache_hit": info.pop("eraser_cache_hit")})
    if eraser is None and then is None:  # the control: the batches are the erased (= unerased) images, as without
        return x, info, None
    coded = data if plan is None or plan.coded_idx is None else data.subset(plan.coded_idx)
    return x, info, BatchErasure(coded.x, BatchEraser(eraser, then))


def _check_runtime(cfg: JobConfig, device: torch.device, data: LoadedData | None = None,
                   rerun: bool = False) -> LoadedData | None:
    check_options(cfg.training.engine, cfg.training.workers, cfg.training.fused_optimizer, device)
    # loads the data (or checks `data`): blocks, storage and memory checked before the directory is made
    return precheck(cfg, device, data, rerun)


def _describe(result: dict[str, Any]) -> str:
    mdl = result["mdl"]
    return f"{mdl['bits_per_sample']:.4f} bits/sample ({mdl['protocol']}), legacy {mdl['legacy']:.4f}"


# run_in_job_dir's hooks of an MDL job (training/tasks/mdl.py declares the task)
LIFECYCLE: dict[str, Any] = {"precheck": _check_runtime, "describe": _describe, "finite": ("mdl", "final"),
                             "complete": ("mdl",), "fingerprint": data_fingerprint}


def run_job(config: Mapping[str, Any] | JobConfig) -> Outcome:
    """One MDL job in the one lifecycle: `run(prepare(job))`."""
    return run_in_job_dir(config, lambda job: run(prepare(job)), **LIFECYCLE)


@dataclass(frozen=True)
class Prepared:
    """An MDL job's inputs (`prepare`): the coded data (labels permuted for a null), its erased images and how they
    were erased, the batches' eraser (`eraser.after_augment`) and the split into blocks."""

    job: JobRun
    data: LoadedData
    x: torch.Tensor
    erasure: dict[str, Any]
    batches: BatchErasure | None
    split: MdlSplit
    started: float  # perf_counter() when the job's body began (timings.before_mdl_s)


def prepare(job: JobRun) -> Prepared:
    """Data loaded (or what the precheck loaded), labels permuted, the eraser's fit split, erased (through the
    erased-data cache), and the MDL split of the coded rows."""
    cfg, started = job.cfg, time.perf_counter()
    data, x, erasure_info, batches = prepare_inputs(cfg, job.loaded)
    return Prepared(job, data, x, erasure_info, batches, split_of(cfg, len(data.y)), started)


def split_of(cfg: JobConfig, n: int) -> MdlSplit:
    """The job's MDL split of its `n` coded rows (validation set and blocks, drawn from its seed)."""
    m = cfg.mdl
    return make_split(n, cfg.seed, val_size=m.val_size, val_frac=m.val_frac, num_blocks=m.num_blocks,
                      min_block=m.min_block)


def run(prepared: Prepared) -> dict[str, Any]:
    """The block models, the code, the full-data run: result.json's fields."""
    job, data, split, erasure_info = prepared.job, prepared.data, prepared.split, prepared.erasure
    cfg = job.cfg
    logger = RunLogger(cfg.logger, cfg.to_dict(), job.path, run_id=f"{job.cfg_hash}-s{cfg.seed}",
                       out_dir=Path(cfg.paths.out_dir))
    try:
        m = cfg.mdl
        say_stop_keys(cfg, len(data.y))
        checkpoint = CheckpointStore(job.path, job.cfg_hash)
        if cfg.force:
            checkpoint.clear()  # force=true recomputes from scratch (as progress.json)
        trainer = Trainer(cfg, prepared.x, data.y, data.num_classes, split, job.device, batches=prepared.batches,
                          checkpoint=checkpoint)
        if packs.current() is not None:  # the memory estimate of a pack group (training/mdl/pack_group.py)
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
        return {
            "dataset": data.info,
            "eraser": erasure_info,
            "model": trainer.model_info,
            "optim": dataclasses.asdict(trainer.optim),
            "mdl": mdl,
            "final": final,
            "certificate": erasure_info.pop("certificate", None),
            "timings": {"erase_s": erasure_info["seconds"], "mdl_s": t_full - t_mdl,
                        "full_run_s": t_end - t_full, "before_mdl_s": t_mdl - prepared.started},
        }
    finally:
        logger.finish()
