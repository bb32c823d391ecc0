"""What a job can do (`task=` in the config): each task takes the job's config and returns its Outcome (done, skipped,
reused or failed, with result.json's dict: training/app/lifecycle.py).

Two halves, so that the core never needs a task's code:

* `DECLARED` (here, static): every task's name and `uses`, the config groups it reads and its hash covers (None:
  all of them). The config check (`task=` must be one of these) and the job hash (`schema.semantic`) read only this,
  so hashing a config (scripts/aggregate.py, the multirun check) imports neither training.mdl nor
  training.starvation.
* `TASKS` (filled on import): each implementation registers itself in its module
  (`@TASKS.register("name", uses=...)`), which must match its declaration here. The command line
  (training/cli/run.py) imports every implementation; the core imports none.

A new task is its module, its line in `DECLARED`, and its import in training/cli/run.py.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from erasure.registry import Registry

if TYPE_CHECKING:  # the lifecycle imports torch: the hash (which reads DECLARED) does not need it
    from training.app.lifecycle import Outcome
    from training.app.schema import JobConfig

# the job's config (typed, or as composed) -> its Outcome (result.json's fields in `.result`)
Task = Callable[["Mapping[str, Any] | JobConfig"], "Outcome"]

# name -> the config groups the task reads (hashed besides `task` and `seed`); None: every group. A dotted entry
# (`mdl.patience`) names one key of a group the task reads only in part.
_ERASED_EVAL_MDL = tuple(f"mdl.{k}" for k in ("val_size", "val_frac", "patience", "max_epochs", "eval_every_steps",
                                              "stop_after_warmup", "min_steps", "patience_min_steps"))
DECLARED: Mapping[str, tuple[str, ...] | None] = MappingProxyType({
    "mdl": None,  # training/mdl/job.py
    "gs_two_moons": ("dataset", "regularizer", "gs"),  # training/starvation/moons.py
    "gs_colored_mnist": ("dataset", "regularizer", "gs"),  # training/starvation/colored_mnist.py
    "gs_erased_eval": ("dataset", "eraser", "arch", "optim", *_ERASED_EVAL_MDL, "regularizer", "gs"),  # erased_eval.py
})

# name -> hashed keys (of the groups it reads) that the task does not read, each with the one value it accepts:
# any other value is refused in one line (a key that enters the hash and changes nothing makes a "null" that is
# not one). tests/test_task_keys.py walks every task × every hashed key.
_NOT_AN_IMAGE_PIPELINE = {"dataset.augment": False, "dataset.zscore": False, "dataset.zscore_order": "before",
                          "dataset.limit": None, "dataset.permute_labels": False}
FIXED: Mapping[str, Mapping[str, Any]] = MappingProxyType({
    "mdl": {},
    "gs_two_moons": {"dataset.name": "two_moons", **_NOT_AN_IMAGE_PIPELINE},
    "gs_colored_mnist": {"dataset.name": "colored_mnist", **_NOT_AN_IMAGE_PIPELINE},
    # the eraser is always fitted on the training split and applied to held-out data; no augmentation
    "gs_erased_eval": {"dataset.zscore": False, "dataset.zscore_order": "before", "eraser.fit_on": "all",
                       "eraser.after_augment": False},
})


class TaskRegistry(Registry[Task]):
    """A Registry whose entries must be declared in DECLARED, with the same `uses`."""

    def add(self, name: str, obj: Task, **meta: Any) -> None:
        if name not in DECLARED:
            raise ValueError(f"task {name!r} is not declared: add it and its `uses` to DECLARED in "
                             "training/app/tasks.py")
        uses = meta.get("uses")
        if (tuple(uses) if uses is not None else None) != DECLARED[name]:
            raise ValueError(f"task {name!r} registers uses={uses!r} but training/app/tasks.py declares "
                             f"{DECLARED[name]!r}: the job hash follows the declaration; make them agree")
        super().add(name, obj, **meta)


TASKS: TaskRegistry = TaskRegistry("task", meta=("uses",))


def task_names() -> list[str]:
    return sorted(DECLARED)


def task_uses(name: str) -> tuple[str, ...] | None:
    """The groups task `name` reads and its hash covers; None for every group (and for an unknown name)."""
    return DECLARED.get(name)


def fixed_keys(name: str) -> Mapping[str, Any]:
    """The hashed keys task `name` does not read, each with the one value it accepts (see FIXED)."""
    return FIXED.get(name, {})


def get_task(name: str) -> Task:
    """The implementation of task `name`; its module must have been imported (training/cli/run.py imports all)."""
    if name in DECLARED and name not in TASKS:
        raise LookupError(f"task {name!r} is declared but its implementation is not imported (import it, or "
                          "training.cli.run, which imports every task)")
    return TASKS.get(name)
