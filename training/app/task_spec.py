"""What the core knows of a task: its frozen declaration, `TaskSpec`, and the discovery of the task packages of
`training.tasks` (`TASKS`, filled on first use). The bottom of training/app: the config check, the job hash, the
result codec and the lifecycle are handed a `TaskSpec` and never look one up; a name becomes a spec once, at the
edges (command line, ledger, aggregate, plan: `task_spec(name)`, or `spec_of(config)`).
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from erasure.registry import Registry
from training.app.result_types import Result

NAMESPACE = "training.tasks"  # the package of task modules; it spans every <dir>/training/tasks/ on sys.path


@dataclass(frozen=True)
class TaskSpec:
    """A task's declaration, as the core reads it (a `Task`'s class attributes: training/app/tasks.py)."""

    name: str
    uses: tuple[str, ...] | None  # the groups it reads (hashed besides task, seed); None: all
    fixed: Mapping[str, Any]  # hashed keys it does not read, each with the one value it accepts
    group: str | None  # its own config group (e.g. `gs`), checked by `options`
    options: type[Any] | None  # that group's dataclass (`cfg.task_options`)
    result_type: type[Result]  # its result.json typed (training/app/result_types.py)
    numerics: int | None  # the numerics version its jobs are hashed under (None: the latest)
    # why it cannot run a job (one line), or None; it takes the job's JobConfig (training/app/sections.py, which
    # builds on this module: typed there, not imported here); None: the task refuses nothing of its own
    refusal: Callable[[Any], str | None] | None


class TaskRegistry(Registry[Any]):
    """The tasks discovered in `training.tasks` (each registered once, by its module's `TASK`)."""

    def __init__(self) -> None:
        super().__init__("task")
        self._modules: set[str] = set()
        self._searched: tuple[str, ...] = ()
        self._home: list[str] | None = None  # the package's own directory

    def discover(self) -> TaskRegistry:
        package = importlib.import_module(NAMESPACE)
        if self._home is None:
            self._home = list(package.__path__)
        paths = tuple(self._home + _outside(self._home))
        package.__path__[:] = paths  # where its modules are imported from
        if paths == self._searched:
            return self
        for info in pkgutil.iter_modules(paths, f"{NAMESPACE}."):
            if info.name.rpartition(".")[2].startswith("_") or info.name in self._modules:
                continue
            module = importlib.import_module(info.name)
            declared = getattr(module, "TASKS", None) or (getattr(module, "TASK", None),)
            for task in declared:
                spec = getattr(task, "spec", None)
                if not isinstance(spec, TaskSpec):
                    raise TypeError(f"{info.name} declares no task: define TASK = <a Task subclass>() (or TASKS)")
                self.add(spec.name, task)
            self._modules.add(info.name)
        self._searched = paths
        return self


def _outside(home: list[str]) -> list[str]:
    """Every <dir>/training/tasks/ with <dir> on sys.path now, besides the package's own: tasks kept elsewhere."""
    found: list[str] = []
    for entry in sys.path:
        extra = os.path.join(entry or ".", *NAMESPACE.split("."))
        if os.path.isdir(extra) and not any(os.path.samefile(extra, p) for p in [*home, *found]):
            found.append(extra)
    return found


TASKS: TaskRegistry = TaskRegistry()


def specs() -> list[TaskSpec]:
    """Every task's declaration, by name (a `training/tasks/` directory added to sys.path since is searched again)."""
    return [entry.obj.spec for entry in TASKS.discover()]


def task_names() -> list[str]:
    return TASKS.discover().names()


def task_spec(name: str) -> TaskSpec:
    """Task `name`'s declaration (UnknownNameError, listing the tasks, for a name no task has)."""
    spec: TaskSpec = TASKS.discover().get(name).spec
    return spec
