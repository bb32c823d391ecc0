"""Early stopping of one model, written once: `training.engine.fit.fit` and the lockstep group
(`training.engine.group`) both keep one `EarlyStopping` per model and ask it after every epoch whether to stop.

The caller reports every validation loss (`record`, which says whether it is a new best: the caller then keeps
the best state) and calls `end_epoch` once per epoch; the rule only ever stops at the end of an epoch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass
class EarlyStopping:
    """Best validation loss so far and the patience rule: stop after `patience` epochs in a row without a new
    best validation loss, or after `max_epochs` epochs."""

    patience: int
    max_epochs: int
    best_loss: float = math.inf
    best_epoch: int = 0
    since_best: int = 0  # epochs in a row (ended) without a new best
    improved: bool = False  # a new best since the last epoch end

    def record(self, loss: float, epoch: int) -> bool:
        """One validation loss during `epoch`; True when it is a new best (the caller keeps that state)."""
        better = loss < self.best_loss
        if better:
            self.best_loss, self.best_epoch = loss, epoch
            self.improved = True
        return better

    def end_epoch(self, epoch: int) -> bool:
        """`epoch` has ended (all its validations recorded); True when training stops here."""
        self.since_best = 0 if self.improved else self.since_best + 1
        self.improved = False
        return self.since_best >= self.patience or epoch >= self.max_epochs
