"""Test helpers: compose a job config the way `python -m training.run` would."""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf

if TYPE_CHECKING:
    from training.app.lifecycle import Outcome

CONF = Path(__file__).resolve().parents[1] / "conf"
# The environment of a job run as a subprocess (`python -m training.run ...`), and a tiny MDL job's overrides.
REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled",
       "PYTHONPATH": str(REPO)}
ENV.pop("HYDRA_FULL_ERROR", None)
TINY = ["dataset=digits", "mdl=quick", "mdl.max_epochs=2", "mdl.min_steps=0", "mdl.patience_min_steps=0",
        "mdl.full_run=false", "arch.width=16", "optim.warmup_steps=5", "certificate=false"]


def job_config(out_dir: Path, overrides: Sequence[str] = ()) -> dict[str, Any]:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.out_dir={out_dir}", "logger=none", "progress=false",
                                           *overrides])
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert isinstance(resolved, dict)
    return cast(dict[str, Any], resolved)  # a composed config's keys are strings


def result_of(outcome: Outcome) -> dict[str, Any]:
    """A job's result.json (`Outcome.result`), which a job that did not fail has (a failed one: its error)."""
    assert outcome.result is not None, outcome.error
    return outcome.result


def fixture_job_dir(root: Path, cfg: dict[str, Any]) -> Path:
    """Where a hand-written result.json fixture goes, in the job-path scheme (training/tasks/mdl/job_paths.py), with a
    cell hash of its own (a fixture's config is partial: a digest of it without the seed)."""
    from training.tasks.mdl.job_paths import JobPath

    cell = hashlib.sha256(json.dumps({k: v for k, v in cfg.items() if k != "seed"}, sort_keys=True).encode())
    a = cfg["arch"]
    return JobPath(cfg["dataset"]["tag"], cfg["eraser"]["name"], a["tag"], int(a["width"]), int(a["depth"]),
                   f"c{cell.hexdigest()[:8]}", int(cfg["seed"])).under(root)


# The engine's settings have no defaults (every default lives once: training/app/schema.py); an engine test gives
# what it tests and, through these, turns the rest off.
FIT_OFF = {"augment": False, "eval_every_steps": None, "progress": False, "warmup_steps": 0, "min_steps": 0,
           "patience_min_steps": 0, "lr_schedule": "constant", "stopping": "patience", "batch_order": "shuffled"}
GROUP_PLAIN = {"engine": "auto", "progress": False, "compile": None, "fused_optimizer": False, "workers": 1,
               "rows": None, "poll_every": "auto"}
ADAMW_PLAIN = {"beta2": 0.999, "weight_decay": 0.0, "warmup_steps": 0}


def fit_settings(**given: Any) -> Any:
    """A `training.engine.fit.FitConfig` of `given`, the rest off (FIT_OFF)."""
    from training.engine.fit import FitConfig

    return FitConfig(**{**FIT_OFF, **given})


def group_options(**given: Any) -> Any:
    """A `training.engine.group.GroupOptions` of `given`, the rest plain (GROUP_PLAIN)."""
    from training.engine.group import GroupOptions

    return GroupOptions(**{**GROUP_PLAIN, **given})


def optimizer(model: Any, **given: Any) -> Any:
    """`models.make_optimizer` with `given` (lr, beta1, ...), the rest plain (ADAMW_PLAIN)."""
    from models import make_optimizer

    return make_optimizer(model, **{**ADAMW_PLAIN, **given})


def job_states(runs: Path) -> tuple[set[Path], set[Path]]:
    """(finished job directories, those with a progress file and no result yet) under `runs`."""
    from training.app.lifecycle import PROGRESS_FILE

    finished = {p.parent for p in runs.rglob("result.json")}
    return finished, {p.parent for p in runs.rglob(PROGRESS_FILE)} - finished


def kill_once_one_done_one_partial(command: Sequence[str], runs: Path, log_path: Path, cwd: Path,
                                   env: dict[str, str]) -> tuple[set[Path], set[Path]]:
    """Start `command` in its own process group, SIGKILL the group as soon as one job under `runs` is finished and
    another has a finished block model, and return the job states then."""
    return kill_when(command, runs, log_path, cwd, env, lambda finished, partial: bool(finished and partial))


def kill_when(command: Sequence[str], runs: Path, log_path: Path, cwd: Path, env: dict[str, str],
              ready: Callable[[set[Path], set[Path]], bool]) -> tuple[set[Path], set[Path]]:
    """Start `command` in its own process group, SIGKILL the group as soon as `ready(finished, partial)` (the job
    states under `runs`: `job_states`), and return the job states then."""
    import signal
    import subprocess
    import time

    with log_path.open("w") as log:
        proc = subprocess.Popen(list(command), cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
        deadline = time.monotonic() + 300
        try:
            while True:
                finished, partial = job_states(runs)
                if ready(finished, partial):
                    os.killpg(proc.pid, signal.SIGKILL)
                    break
                assert proc.poll() is None, "ended before it was killed:\n" + log_path.read_text()
                assert time.monotonic() < deadline, "timed out waiting for the first finished block"
                time.sleep(0.01)
        finally:
            proc.wait(timeout=60)
    return job_states(runs)


def prepare_data(cfg: Any) -> tuple[Any, Any, dict[str, Any]]:
    """A job's coded data, erased images and erasure info (training/inputs/pipeline.py `prepare_inputs` without the
    batch eraser), the data loaded from its own `paths`."""
    from training.inputs.pipeline import prepare_inputs
    from training.inputs.store import Store

    inputs = prepare_inputs(cfg, Store.of(cfg.paths), after_augment=False)
    return inputs.data, inputs.x, inputs.erasure


# --- a toy task: the new-task errand's three files (docs/errands/new-task.md), which tests/test_errands.py writes into
# a copy of the repository and tests/test_extending.py into a directory of its own on sys.path -----------------------
TOY_TASK = "toy_count"
TOY_TASK_INIT = '''"""task=toy_count: the data's class counts and the mean pixel (× toy.scale) of a seeded half."""

from __future__ import annotations

from typing import Any

from training.app.tasks import Collected, Task
from training.tasks.toy_count.result import ToyCountOptions, ToyCountResult, ToyCountSections


class ToyCount(Task):
    name = "toy_count"
    uses = ("dataset", "toy")
    group = "toy"
    options = ToyCountOptions
    result_type = ToyCountResult
    fixed = {"dataset.augment": False, "dataset.zscore": False, "dataset.zscore_order": "before",
             "dataset.permute_labels": False}

    def prepare(self, job: Any) -> Any:
        from training.data import load_dataset

        return job.cfg, load_dataset(job.cfg.dataset, job.cfg.paths.data_dir)

    def run(self, prepared: Any) -> ToyCountSections:
        import torch

        cfg, data = prepared
        half = torch.randperm(len(data.y), generator=torch.Generator().manual_seed(cfg.seed))[: len(data.y) // 2]
        counts = torch.bincount(data.y, minlength=data.num_classes).tolist()
        return ToyCountSections.read({"counts": counts,
                                      "mean_pixel": float(data.x[half].double().mean()) * cfg.task_options.scale})

    def rows(self, collected: Collected) -> dict[str, str]:
        from training.analysis.tables import md_table

        rows = [[r.config["dataset"]["name"], str(r.config["seed"]), f"{r.body.mean_pixel:.6f}",
                 str(sum(r.body.counts))]
                for r in collected.results if isinstance(r, ToyCountResult)]
        return {"toy_count": md_table(["dataset", "seed", "mean pixel × scale", "samples"], rows)}


TASK = ToyCount()
'''
TOY_TASK_RESULT = '''"""task=toy_count's result.json, typed."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from training.app.result_types import Result, Sections


@dataclass(frozen=True, kw_only=True)
class ToyCountOptions:
    scale: float = 1.0


@dataclass(frozen=True)
class ToyCountSections(Sections):
    counts: tuple[int, ...] = ()
    mean_pixel: float = 0.0

    @classmethod
    def read(cls, written: Mapping[str, Any]) -> ToyCountSections:
        return cls(written, tuple(written["counts"]), float(written["mean_pixel"]))


@dataclass(frozen=True)
class ToyCountResult(Result):
    sections_type = ToyCountSections
    body: ToyCountSections = field(default_factory=ToyCountSections)
'''
TOY_TASK_PRESET = """# @package _global_
defaults:
  - override /dataset: digits

task: toy_count
experiment_name: toy_count
toy:
  scale: 2.0
paths:
  job_subdir: toy_count/${dataset.tag}/${paths.cell}/seed${seed}
"""
