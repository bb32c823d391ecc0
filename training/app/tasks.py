"""What a job can do (`task=` in the config): a `Task`, declared once, in a package of `training.tasks` that owns its
declaration (__init__), code, typed result and tables (training/tasks/mdl/, training/tasks/gs/), in the repository or
in any <dir>/training/tasks/ with <dir> on sys.path. The package defines `TASK` (`TASKS`: several), whose class
attributes are all the core reads (`spec`, training/app/task_spec.py). A declaration imports none of its code at its
top level but its result type (tests/test_layers.py). Discovery imports every module or package of `training.tasks`
not starting with "_": adding a task is its package (+ a preset and a test); the command line runs
`get_task(cfg.task)(cfg)` and scripts/aggregate.py asks every task for its tables.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import Any, ClassVar

from erasure.registry import UnknownNameError
from training.app.lifecycle import JobRun, Outcome, failed, run_in_job_dir
from training.app.result_codec import decode, encode, read_json, upgrade
from training.app.result_types import Result, Sections
from training.app.schema import ConfigError, JobConfig, cell_hash, config_hash, load_config, semantic
from training.app.task_spec import TASKS as TASKS  # the declarations' names, re-exported
from training.app.task_spec import TaskSpec as TaskSpec
from training.app.task_spec import specs, task_spec
from training.app.task_spec import task_names as task_names


@dataclass(frozen=True)
class Collected:
    """What scripts/aggregate.py hands a task for its tables: the task's Results, the job table of MDL jobs (missing
    and failed jobs included: training/tasks/mdl/aggregate_collect.py), and where and under which name they go."""

    results: list[Result]
    jobs: Any  # a pandas DataFrame (training/tasks/mdl/aggregate_collect.py), empty without MDL jobs
    out: Path
    name: str
    title: str

    def as_written(self) -> list[dict[str, Any]]:
        """The results as their result.json holds them (a task's own open sections: curves, files, metrics)."""
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
        """The job's lifecycle `Hooks` as keyword arguments of `run_in_job_dir` (training/app/lifecycle.py)."""
        return {}

    def implementation(self) -> ModuleType:
        """The module with the task's `prepare(job)` and `run(prepared)`, imported here, when a job runs (the
        declaration imports no task code); or override `prepare` and `run` themselves."""
        raise NotImplementedError(f"task {self.name} names no implementation and overrides no prepare/run")

    def prepare(self, job: JobRun) -> Any:
        """The job's inputs: data loaded, labels permuted, split, erased (what `run` takes)."""
        return self.implementation().prepare(job)

    def run(self, prepared: Any) -> Sections:
        """The job's body on its prepared inputs: its result.json sections, typed (`result_type.sections_type`)."""
        sections: Sections = self.implementation().run(prepared)
        return sections

    def rows(self, collected: Collected) -> dict[str, str]:
        """The task's tables for the aggregate, file name (or stem) -> Markdown; it may write files (plots, CSV) to
        `collected.out`. Its results only (`collected.results`)."""
        return {}

    @property
    def spec(self) -> TaskSpec:
        """The declaration the core reads (training/app/task_spec.py)."""
        refuses = type(self).refusal is not Task.refusal
        return TaskSpec(self.name, self.uses, self.fixed, self.group, self.options, self.result_type, self.numerics,
                        self.refusal if refuses else None)

    def __call__(self, config: Mapping[str, Any] | JobConfig, store: Any = None) -> Outcome:
        """The job of `config` (one seed) in the one lifecycle; `store`: what the jobs of this process share
        (training/inputs/store.py; None: nothing)."""
        cfg = load_config(config, self.spec, own_groups())
        return run_in_job_dir(cfg, lambda job: self.run(self.prepare(job)), store=store, **self.lifecycle())

    def run_cell(self, cfgs: list[JobConfig], store: Any = None) -> list[Outcome]:
        """The jobs of a cell's seeds, an Outcome each: here one after another, sharing `store` (the MDL task trains
        them together). A seed that fails is recorded (`failed`) and the others go on."""
        outcomes = []
        for cfg in cfgs:
            try:
                outcomes.append(self(cfg, store))
            except Exception as err:  # noqa: BLE001 - this seed's failure
                outcomes.append(failed(cfg, err))
        return outcomes


def tasks() -> list[Task]:
    """Every task, by name (a `training/tasks/` directory added to sys.path since is searched again)."""
    return [entry.obj for entry in TASKS.discover()]


def get_task(name: str) -> Task:
    """Task `name` (its implementation is imported when it runs)."""
    task = TASKS.discover().get(name)
    assert isinstance(task, Task), task
    return task


# ---- the edges: a config's task name -> its TaskSpec, once (the command line, the ledger, the aggregate, the plan,
# scripts and tests); the core functions they call are handed the spec ----------------------------------------
def spec_of(config: Mapping[str, Any] | JobConfig | str) -> TaskSpec:
    """The TaskSpec of a config's task (its `task` key; a config without one is an MDL job's), or of a task name.
    ConfigError (one line, listing the tasks) for a task no module declares."""
    if isinstance(config, JobConfig):
        return config.task_spec
    name = config if isinstance(config, str) else config.get("task", "mdl")
    try:
        return task_spec(str(name))
    except UnknownNameError:
        raise ConfigError(f"task={name} is not allowed: task must be one of {', '.join(task_names())}") from None


def own_groups() -> set[str]:
    """The config groups tasks read of their own (`gs`): what their declared `uses` names beyond the job's
    groups. A sweep over tasks (gs_sd_erasure) composes each into every job."""
    job = {f.name for f in dataclasses.fields(JobConfig)}
    return {entry.partition(".")[0] for spec in specs() for entry in (spec.uses or ())} - job


def load_job(config: Mapping[str, Any] | JobConfig) -> JobConfig:
    """`load_config` of a composed config, handed the TaskSpec its `task` key names."""
    return config if isinstance(config, JobConfig) else load_config(config, spec_of(config), own_groups())


def job_hash(config: Mapping[str, Any] | JobConfig, numerics: int | None = None) -> str:
    """`config_hash` of a config, as its task's."""
    return config_hash(config, spec_of(config), numerics)


def job_cell_hash(config: Mapping[str, Any] | JobConfig) -> str:
    """`cell_hash` of a config, as its task's."""
    return cell_hash(config, spec_of(config))


def job_semantic(config: Mapping[str, Any] | JobConfig, fill_defaults: bool = True) -> dict[str, Any]:
    """`semantic` of a config, as its task's."""
    return semantic(config, spec_of(config), fill_defaults)


def decode_result(raw: Any) -> Result:
    """`decode` of a stored result.json, as its task's Result class (the plain envelope for a task not declared
    here)."""
    task = (upgrade(raw).get("task") or "mdl") if isinstance(raw, Mapping) else None  # as `decode` reads it
    found = TASKS.discover()
    return decode(raw, found.get(task).spec if isinstance(task, str) and task in found else None)


def read_any(path: Path) -> Result | None:
    """`read` of a stored result.json of any task, as its task's Result class."""
    raw = read_json(path)
    return None if raw is None else decode_result(raw)
