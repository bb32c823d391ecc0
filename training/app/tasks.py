"""What a job can do (`task=` in the config): a `Task`, declared once, in a module of its own in the package
`training.tasks` (training/tasks/<name>.py or training/tasks/<name>/__init__.py, in the repository or in any
<dir>/training/tasks/ directory with <dir> on sys.path).

A task module defines `TASK`, an instance of a `Task` subclass, whose class attributes declare what the core needs:
its `name`, the config groups it reads (`uses`, which the job hash covers), the hashed keys it does not read
(`fixed`), and its own config group with its options dataclass (`group`, `options`). The core (the config check,
the job hash `schema.semantic`) reads only these, so a task module imports at its top level nothing of its
implementation (training.mdl, training.starvation, torch): its methods import that when a job runs
(tests/test_layers.py checks both).

Discovery (`TASKS`, filled on first use) is the one dynamic import of the harness: every module of `training.tasks`
whose name does not start with "_". Adding a task is its module (+ a preset and a test); nothing else
names it: the command line runs `get_task(cfg.task)(cfg)` and scripts/aggregate.py asks every task for its tables.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

from erasure.registry import Registry
from training.app.result_types import Result

if TYPE_CHECKING:  # the lifecycle imports torch: the hash (which reads the declarations) does not need it
    from training.app.lifecycle import JobRun, Outcome
    from training.app.schema import JobConfig

NAMESPACE = "training.tasks"  # the package of task modules; it spans every <dir>/training/tasks/ on sys.path


@dataclass(frozen=True)
class Collected:
    """What scripts/aggregate.py hands a task for its tables: the task's Results (training/app/result_types.py),
    the job table the collection made of MDL jobs (scripts/aggregate_collect.py; missing and failed jobs included),
    and where and under which file stem and title the tables go."""

    results: list[Result]
    jobs: Any  # a pandas DataFrame (scripts/aggregate_collect.py), empty without MDL jobs
    out: Path
    name: str
    title: str

    def as_written(self) -> list[dict[str, Any]]:
        """The results as their result.json holds them (a task's own open sections: curves, files, metrics)."""
        from training.app.result_codec import encode

        return [encode(r) for r in self.results]


class Task:
    """A task. Subclasses declare the class attributes and name their implementation (a module with `prepare` and
    `run`, imported inside the method); `__call__` runs the job in the one lifecycle (training/app/lifecycle.py)."""

    name: ClassVar[str]
    uses: ClassVar[tuple[str, ...] | None] = None  # the groups it reads (hashed besides task, seed); None: all
    # hashed keys (of the groups it reads) it does not read, each with the one value it accepts: any other value is
    # refused in one line (a key that enters the hash and changes nothing makes a "null" that is not one)
    fixed: ClassVar[Mapping[str, Any]] = MappingProxyType({})
    group: ClassVar[str | None] = None  # its own config group (e.g. `gs`), checked by `options`
    options: ClassVar[type[Any] | None] = None  # that group's dataclass (`cfg.task_options`)
    result_type: ClassVar[type[Result]] = Result  # its result.json typed (training/app/result_types.py)
    # the numerics version its jobs are computed and hashed under: the last NUMERICS bump that changed this task's
    # numbers (training/app/schema.py); None: the latest (a task that pins none follows every bump)
    numerics: ClassVar[int | None] = None

    def refusal(self, job: JobConfig) -> str | None:
        """Why this task cannot run `job` (one line, for a ConfigError), or None. Called by the config check."""
        return None

    def lifecycle(self) -> dict[str, Any]:
        """Keyword arguments of `run_in_job_dir` (precheck, describe, finite, complete, fingerprint)."""
        return {}

    def implementation(self) -> ModuleType:
        """The module with the task's `prepare(job)` and `run(prepared)`, imported here, when a job runs (the
        declaration imports no task code); or override `prepare` and `run` themselves."""
        raise NotImplementedError(f"task {self.name} names no implementation and overrides no prepare/run")

    def prepare(self, job: JobRun) -> Any:
        """The job's inputs: data loaded, labels permuted, split, erased (what `run` takes)."""
        return self.implementation().prepare(job)

    def run(self, prepared: Any) -> dict[str, Any]:
        """The job's body on its prepared inputs: result.json's fields."""
        return dict(self.implementation().run(prepared))

    def rows(self, collected: Collected) -> dict[str, str]:
        """The task's tables for the aggregate, file name (or stem) -> Markdown; it may write files (plots, CSV) to
        `collected.out`. Its results only (`collected.results`)."""
        return {}

    def __call__(self, config: Mapping[str, Any] | JobConfig) -> Outcome:
        from training.app.lifecycle import run_in_job_dir

        return run_in_job_dir(config, lambda job: self.run(self.prepare(job)), **self.lifecycle())


class TaskRegistry(Registry[Task]):
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
            task = getattr(importlib.import_module(info.name), "TASK", None)
            if not isinstance(task, Task):
                raise TypeError(f"{info.name} declares no task: define TASK = <a training.app.tasks.Task subclass>()")
            self.add(task.name, task)
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


def tasks() -> list[Task]:
    """Every task, by name (a `training/tasks/` directory added to sys.path since is searched again)."""
    reg = TASKS.discover()
    return [entry.obj for entry in reg]


def task_names() -> list[str]:
    return TASKS.discover().names()


def get_task(name: str) -> Task:
    """Task `name` (its implementation is imported when it runs)."""
    reg = TASKS.discover()
    return reg.get(name)


def _declared(name: str) -> Task | None:
    reg = TASKS.discover()
    return reg.get(name) if name in reg else None


def task_uses(name: str) -> tuple[str, ...] | None:
    """The groups task `name` reads and its hash covers; None for every group (and for an unknown name)."""
    task = _declared(name)
    return None if task is None or task.uses is None else tuple(task.uses)


def fixed_keys(name: str) -> Mapping[str, Any]:
    """The hashed keys task `name` does not read, each with the one value it accepts (`Task.fixed`)."""
    task = _declared(name)
    return {} if task is None else task.fixed


def task_numerics(name: str) -> int | None:
    """The numerics version task `name` declares (None: the latest, and for a task not declared here)."""
    task = _declared(name)
    return None if task is None else task.numerics


def result_type(name: str) -> type[Result]:
    """The Result class of task `name`'s results (the plain envelope for a task not declared here)."""
    task = _declared(name)
    return Result if task is None else task.result_type


def task_group(name: str) -> tuple[str | None, type[Any] | None]:
    """Task `name`'s own config group and its options dataclass; (None, None) for an unknown name."""
    task = _declared(name)
    return (None, None) if task is None else (task.group, task.options)
