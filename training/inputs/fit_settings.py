"""The fit settings the tasks share: a job's optimiser (`resolve_optim`, with the depth rule) and its fit loop's
settings (`fit_config`: batch size, `mdl.*` early stopping, augmentation, the batch eraser, numerics)."""

from __future__ import annotations

from models import depth_lr_multiplier
from training.app.schema import ArchConfig, JobConfig, MdlConfig, OptimConfig
from training.engine.fit import BatchTransform, FitConfig
from training.engine.numerics import JobNumerics
from training.engine.optim import OptimSettings


def resolve_optim(o: OptimConfig, arch: ArchConfig) -> OptimSettings:
    """The optimiser settings of the job (the paper's come from conf/ through optim.*), with the depth rule."""
    mult = float(depth_lr_multiplier(arch)) if o.depth_lr_rule else 1.0
    return OptimSettings(lr_base=float(o.lr), lr=float(o.lr) * mult, depth_lr_multiplier=mult, beta1=float(o.beta1),
                         beta2=float(o.beta2), weight_decay=float(o.weight_decay), warmup_steps=o.warmup_steps,
                         batch_size=o.batch_size, name=o.name, schedule=o.schedule)


def fit_config(cfg: JobConfig, warmup_steps: int, eval_every_steps: int | None = None,
               batch_transform: BatchTransform | None = None, numerics: JobNumerics | None = None) -> FitConfig:
    """A job's fit loop settings: `optim.batch_size`, `optim.schedule`, `mdl.*` early stopping, `dataset.augment`,
    `progress`, the map of each augmented batch (`eraser.after_augment`) and the job's numerics (`JobRun.numerics`)."""
    m = cfg.mdl
    return FitConfig(batch_size=cfg.optim.batch_size, patience=m.patience, max_epochs=m.max_epochs,
                     augment=cfg.dataset.augment, eval_every_steps=eval_every_steps, progress=cfg.progress,
                     lr_schedule=cfg.optim.schedule, stopping=m.stopping, batch_order=m.batch_order,
                     batch_transform=batch_transform, numerics=numerics, **stop_options(m, warmup_steps))


def stop_options(m: MdlConfig, warmup_steps: int) -> dict[str, int]:
    """The step-aware early-stopping options of `mdl` (training/engine/stopping.py) as FitConfig fields."""
    return {"warmup_steps": warmup_steps if m.stop_after_warmup else 0, "min_steps": m.min_steps,
            "patience_min_steps": m.patience_min_steps}
