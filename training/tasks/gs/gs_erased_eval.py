"""task=gs_erased_eval: a μP model trained on original data (ERM or SD), evaluated on held-out data erased by
`eraser` fitted on its training split (training/tasks/gs/erased_eval.py)."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

from training.tasks.gs.base import StarvationTask

if TYPE_CHECKING:
    from training.app.lifecycle import Outcome
    from training.app.schema import JobConfig
    from training.inputs.store import Store

log = logging.getLogger(__name__)
# the mdl keys it reads: the validation split and the early stopping of its one model
_MDL = tuple(f"mdl.{k}" for k in ("val_size", "val_frac", "patience", "max_epochs", "eval_every_steps",
                                  "stop_after_warmup", "min_steps", "patience_min_steps"))


@dataclass(frozen=True, kw_only=True)
class ErasedEvalOptions:
    """`gs.*` of task=gs_erased_eval (conf/experiment/gs_sd_erasure.yaml)."""

    test_frac: float = field(default=0.2, metadata={"check": lambda v: 0 < v < 1, "allowed": "a number in (0, 1)"})


class ErasedEval(StarvationTask):
    name = "gs_erased_eval"
    uses = ("dataset", "eraser", "arch", "optim", *_MDL, "regularizer", "gs")
    # the eraser is always fitted on the training split and applied to held-out data; the model trains on the
    # original images (a z-score of them is not implemented); no augmentation
    fixed = {"dataset.zscore": False, "dataset.zscore_order": "before", "eraser.fit_on": "all",
             "eraser.after_augment": False}
    options = ErasedEvalOptions

    def refusal(self, job: JobConfig) -> str | None:
        from erasure.registry import ERASERS
        from erasure.traits import eraser_traits

        if not eraser_traits(job.eraser.name).has_map:
            usable = [e.name for e in ERASERS if eraser_traits(e.name).has_map and not eraser_traits(e.name).identity]
            return (f"eraser={job.eraser.name} is not allowed with task=gs_erased_eval: it edits the images it is "
                    "fitted on and has no map to apply to the held-out test rows; use an eraser with a map: "
                    + ", ".join(usable))
        return None

    def lifecycle(self) -> dict[str, Any]:
        from training.inputs.pipeline import data_fingerprint  # the data now, and (for a rerun) the data itself

        return {**super().lifecycle(), "fingerprint": data_fingerprint}

    def implementation(self) -> ModuleType:
        import training.tasks.gs.erased_eval as erased_eval

        return erased_eval

    def __call__(self, config: Mapping[str, Any] | JobConfig, store: Store | None = None) -> Outcome:
        from erasure.traits import eraser_traits
        from training.app.lifecycle import Outcome
        from training.app.schema import JobConfig, load_config
        from training.app.tasks import own_groups

        cfg = config if isinstance(config, JobConfig) else load_config(config, self.spec, own_groups())
        if eraser_traits(cfg.eraser.name).identity:
            log.info("gs_erased_eval with eraser=control: nothing to erase (every erased job reports the "
                     "original held-out metrics); no job written to %s", cfg.paths.job_dir)
            return Outcome("skipped", Path(cfg.paths.job_dir), {})
        return super().__call__(cfg, store)


TASK = ErasedEval()
