"""Early stopping of one model, written once: `training.engine.fit.fit` and the lockstep group keep one
`EarlyStopping` per model, report every validation loss (`record`: a new best? the caller then keeps that state) and
ask it once per epoch whether to stop (`end_epoch`); the rule only ever stops at the end of an epoch.

The rule is step-aware (a model on a small block takes few steps per epoch, so "5 epochs without improvement" can
end training inside the warm-up, when the validation loss of hard data often rises before it falls):
* no stop (neither patience nor `max_epochs`) before `warmup_steps` and `min_steps` optimizer steps have been
  taken: a small model trains at least that long, even past `max_epochs`;
* patience counted in steps: stop once `max(patience × steps per epoch, patience_min_steps)` steps have passed
  since the end of the last epoch with a new best validation loss.
With `warmup_steps = min_steps = patience_min_steps = 0` this is the plain rule "stop after `patience` epochs in a
row without a new best, or after `max_epochs` epochs".
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

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
        return MAX_EPOCHS if epoch >= self.max_epochs else None


REASONS = ("", PATIENCE, MAX_EPOCHS)  # RowStopping.reason's codes


class RowStopping:
    """`EarlyStopping` of every row of a lockstep group as device tensors of length rows: the same comparisons on
    the same float64 losses, with no read back. `record` says which rows have a new best, `end_epoch` sets `done`; a
    done row changes nothing more, so the host may read `done` any number of steps later (`training.poll_every`) and
    still finish the member with the numbers of the step it stopped at."""

    STATE = ("best_loss", "best_epoch", "improved", "improved_step", "epoch", "first", "done", "reason",
             "stop_step", "patience_steps", "earliest", "max_epochs")

    def __init__(self, rules: list[EarlyStopping], epochs: list[int], first: list[int], device: torch.device) -> None:
        def vec(values: list, dtype: torch.dtype) -> Tensor:
            return torch.tensor(values, dtype=dtype, device=device)

        self.best_loss = vec([s.best_loss for s in rules], torch.float64)
        self.best_epoch = vec([s.best_epoch for s in rules], torch.long)
        self.improved = vec([s.improved for s in rules], torch.bool)
        self.improved_step = vec([s.improved_step for s in rules], torch.long)
        self.epoch, self.first = vec(epochs, torch.long), vec(first, torch.long)  # its epoch; its first group step
        self.done = torch.zeros(len(rules), dtype=torch.bool, device=device)
        self.reason = torch.zeros(len(rules), dtype=torch.long, device=device)  # index into REASONS
        self.stop_step = torch.zeros(len(rules), dtype=torch.long, device=device)  # its own steps when it stopped
        self.patience_steps = vec([s.patience_steps for s in rules], torch.long)
        self.earliest = vec([s.earliest_stop for s in rules], torch.long)
        self.max_epochs = vec([s.max_epochs for s in rules], torch.long)

    def record(self, sel: Tensor | slice, losses: Tensor) -> Tensor:
        """Validation losses (float64) of rows `sel`: which rows (not done) have a new best (`EarlyStopping.record`)."""
        better = ~self.done[sel] & (losses < self.best_loss[sel])
        self.best_loss[sel] = torch.where(better, losses, self.best_loss[sel])
        self.best_epoch[sel] = torch.where(better, self.epoch[sel], self.best_epoch[sel])
        self.improved[sel] |= better
        return better

    def end_epoch(self, sel: Tensor, step: int) -> None:
        """Rows `sel` ended an epoch at group step `step` (`EarlyStopping.end_epoch`): a stop sets `done`, else the
        row's next epoch starts."""
        live, own = ~self.done[sel], step - self.first[sel]
        improved_step = torch.where(live & self.improved[sel], own, self.improved_step[sel])
        self.improved_step[sel] = improved_step
        self.improved[sel] &= ~live
        may = own >= self.earliest[sel]
        patience = may & (own - improved_step >= self.patience_steps[sel])
        longest = may & (self.epoch[sel] >= self.max_epochs[sel])
        reason = torch.where(patience, 1, torch.where(longest, 2, 0))
        stop = live & (reason > 0)
        self.reason[sel] = torch.where(stop, reason, self.reason[sel])
        self.stop_step[sel] = torch.where(stop, own, self.stop_step[sel])
        self.done[sel] |= stop
        self.epoch[sel] += (live & ~stop).long()

    def replace(self, row: int, rule: EarlyStopping, first: int) -> None:
        """A new member (its fresh rule) takes `row` at group step `first`."""
        for name, value in (("best_loss", rule.best_loss), ("best_epoch", 0), ("improved", False),
                            ("improved_step", 0), ("epoch", 1), ("first", first), ("done", False), ("reason", 0),
                            ("stop_step", 0), ("patience_steps", rule.patience_steps),
                            ("earliest", rule.earliest_stop), ("max_epochs", rule.max_epochs)):
            getattr(self, name)[row] = value

    def keep(self, keep: Tensor) -> None:
        for name in self.STATE:
            setattr(self, name, getattr(self, name)[keep])

    def state_dict(self) -> dict[str, Tensor]:
        return {name: getattr(self, name).clone() for name in self.STATE}

    def load_state_dict(self, saved: dict[str, Tensor]) -> None:
        for name in self.STATE:
            setattr(self, name, saved[name].to(self.done.device))
