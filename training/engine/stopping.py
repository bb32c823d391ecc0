"""Early stopping of one model, written once: `training.engine.fit.fit` and the lockstep group
(`training.engine.group`) both keep one `EarlyStopping` per model and ask it after every epoch whether to stop.

The caller reports every validation loss (`record`, which says whether it is a new best: the caller then keeps
the best state) and calls `end_epoch` once per epoch; the rule only ever stops at the end of an epoch.

The rule is step-aware (a model on a small block takes few optimizer steps per epoch, so "5 epochs without
improvement" can end training inside the learning-rate warm-up, when the validation loss of hard data often
rises before it falls; the code would then measure the patience, not the data):

* no stop (neither patience nor `max_epochs`) before `warmup_steps` (the optimiser's warm-up) and `min_steps`
  optimizer steps have been taken: a small model trains at least that long, even past `max_epochs`;
* patience counted in steps: stop once `max(patience × steps per epoch, patience_min_steps)` steps have passed
  since the end of the last epoch with a new best validation loss.

With `warmup_steps = min_steps = patience_min_steps = 0` this is exactly the plain rule "stop after `patience`
epochs in a row without a new best, or after `max_epochs` epochs".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

PATIENCE, MAX_EPOCHS = "patience", "max_epochs"  # why a model stopped (FitResult.stop_reason)


@dataclass
class EarlyStopping:
    """Best validation loss so far and the (step-aware) stop rule of one model. The rule's settings are all given
    (FitConfig.stopper; their defaults live once, in training/app/schema.py); the state starts empty."""

    patience: int  # epochs
    max_epochs: int
    steps_per_epoch: int
    warmup_steps: int  # no stop before the warm-up has ended (0: no such rule)
    min_steps: int  # no stop before this many optimizer steps (0: none)
    patience_min_steps: int  # floor of the patience in steps (0: none)
    best_loss: float = math.inf
    best_epoch: int = 0
    improved: bool = False  # a new best since the last epoch end
    improved_step: int = 0  # step at the end of the last epoch with a new best (0: none yet)

    @property
    def patience_steps(self) -> int:
        return max(self.patience * self.steps_per_epoch, self.patience_min_steps)

    @property
    def earliest_stop(self) -> int:
        """No stop before this optimizer step."""
        return max(self.warmup_steps, self.min_steps)

    def record(self, loss: float, epoch: int) -> bool:
        """One validation loss during `epoch`; True when it is a new best (the caller keeps that state)."""
        better = loss < self.best_loss
        if better:
            self.best_loss, self.best_epoch = loss, epoch
            self.improved = True
        return better

    def end_epoch(self, epoch: int, step: int) -> str | None:
        """`epoch` has ended after `step` optimizer steps in all (its validations recorded): why training
        stops here (`PATIENCE` or `MAX_EPOCHS`), or None to go on."""
        if self.improved:
            self.improved_step = step
        self.improved = False
        if step < self.earliest_stop:
            return None
        if step - self.improved_step >= self.patience_steps:
            return PATIENCE
        if epoch >= self.max_epochs:
            return MAX_EPOCHS
        return None
