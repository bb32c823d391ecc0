"""Stop keys that pull against each other: `mdl.max_epochs` caps the epochs, but no model stops before
`mdl.min_steps` optimizer steps (nor, with `mdl.stop_after_warmup`, inside the warm-up). On a small block (one step an
epoch) the step floor wins: `mdl=quick mdl.max_epochs=8` trains block model 1 for 300 epochs. That is the rule (it
keeps small blocks from stopping inside the warm-up), so it is not refused; the job says so in one line when it
starts (in its directory, after the checks that may refuse it): a warning when the user set one of the keys on the
command line, else an info line.
"""

from __future__ import annotations

import logging
import math

from training.app.schema import MdlConfig, OptimConfig
from training.tasks.mdl.code import most_blocks, partition_logspace
from training.tasks.mdl.splits import validation_size

log = logging.getLogger(__name__)
STOP_KEYS = ("mdl.max_epochs", "mdl.min_steps", "mdl.stop_after_warmup", "optim.warmup_steps", "optim.batch_size")


def floor_outlasts_cap(m: MdlConfig, optim: OptimConfig, n_coded: int, smallest: int | None = None) -> str | None:
    """One line when the step floor keeps the smallest block model past `mdl.max_epochs`, else None. `smallest`:
    block 1's size where the job has its split (None: from `mdl.min_block`, an integer)."""
    warmup = optim.warmup_steps if m.stop_after_warmup else 0
    floor = max(m.min_steps, warmup)
    rest = n_coded - validation_size(n_coded, m.val_size, m.val_frac)
    if floor == 0 or m.num_blocks > most_blocks(rest):  # infeasible: the precheck refuses it
        return None
    if smallest is None:  # block model 1 trains on block 1 alone
        smallest = partition_logspace(rest, m.num_blocks, int(m.min_block))[0]
    per_epoch = math.ceil(smallest / optim.batch_size)
    if m.max_epochs * per_epoch >= floor:
        return None
    epochs = math.ceil(floor / per_epoch)
    by = (f"mdl.min_steps={m.min_steps}" if m.min_steps >= warmup else
          f"the warm-up (optim.warmup_steps={optim.warmup_steps} with mdl.stop_after_warmup=true)")
    cure = "mdl.min_steps=0" + (" mdl.stop_after_warmup=false" if warmup > 0 else "")
    return (f"{by} outlasts mdl.max_epochs={m.max_epochs}: block model 1 ({smallest} samples, {per_epoch} "
            f"step{'s' if per_epoch > 1 else ''} an epoch) trains {epochs} epochs, not {m.max_epochs} "
            f"(no model stops before step {floor}); set {cure} to stop every model by mdl.max_epochs")


def say_stop_keys(m: MdlConfig, optim: OptimConfig, n_coded: int, smallest: int) -> None:
    """Log `floor_outlasts_cap`'s line, if any: a warning when this Hydra job's command line set a stop key (or
    outside Hydra: the caller chose every key), else info."""
    if (line := floor_outlasts_cap(m, optim, n_coded, smallest)) is not None:
        from hydra.core.hydra_config import HydraConfig

        told = not HydraConfig.initialized() or any(o.lstrip("+~").split("=", 1)[0] in STOP_KEYS
                                                    for o in HydraConfig.get().overrides.task)
        log.log(logging.WARNING if told else logging.INFO, "%s", line)
