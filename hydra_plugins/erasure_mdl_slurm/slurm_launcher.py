"""`hydra/launcher=slurm`: hydra-submitit-launcher's SLURM launcher, one array task per job (a cell: its seeds train
together), with arrays no larger than the cluster allows: sbatch refuses an array of more tasks than the cluster's
`MaxArraySize` (`scontrol show config`), so the sweep's jobs are cut into arrays of at most that many, all submitted
at once, their results returned in the sweep's order (each job keeps its `hydra.job.num`). Hydra takes launchers
from the `hydra_plugins` namespace package only; this module imports nothing of the harness."""

from __future__ import annotations

import logging
import re
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from hydra.core.utils import JobReturn
from hydra.plugins.launcher import Launcher
from hydra.types import HydraContext, TaskFunction
from omegaconf import DictConfig

log = logging.getLogger(__name__)


def max_array_size() -> int | None:
    """The cluster's MaxArraySize (an array's task ids are below it), or None when scontrol cannot say."""
    try:
        out = subprocess.run(["scontrol", "show", "config"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    found = re.search(r"^MaxArraySize\s*=\s*(\d+)", out, re.M)
    return int(found.group(1)) if found else None


def unreachable() -> str | None:
    """Why no SLURM controller answers here (`scontrol ping`'s telling error line), or None when one does."""
    try:
        proc = subprocess.run(["scontrol", "ping"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError) as err:
        return f"scontrol ping: {err}"
    lines = [ln.strip() for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    if proc.returncode == 0:
        return None
    return next((ln for ln in lines if "fatal" in ln), lines[0] if lines else f"scontrol ping: exit {proc.returncode}")


def array_slices(count: int, limit: int | None) -> list[range]:
    """The jobs 0..count-1 cut into arrays of at most `limit` (None: one array)."""
    size = count if limit is None or limit < 1 else limit
    return [range(i, min(i + size, count)) for i in range(0, count, max(1, size))]


class SlurmLauncher(Launcher):
    """hydra-submitit-launcher's SLURM launcher (`submitit`, made here: importing it when this module is imported
    would let Hydra's plugin scan load its config classes a second time), its sweeps cut into arrays."""

    def __init__(self, **params: Any) -> None:
        from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher as Submitit

        self.submitit = Submitit(**params)
        self.params = self.submitit.params

    def setup(self, *, hydra_context: HydraContext, task_function: TaskFunction, config: DictConfig) -> None:
        self.submitit.setup(hydra_context=hydra_context, task_function=task_function, config=config)

    def launch(self, job_overrides: Sequence[Sequence[str]], initial_job_idx: int) -> Sequence[JobReturn]:
        parts = array_slices(len(job_overrides), max_array_size())
        if len(parts) <= 1:
            return self.submitit.launch(job_overrides, initial_job_idx)
        log.info("%d jobs: %d job arrays (the cluster's MaxArraySize is %d)", len(job_overrides), len(parts),
                 len(parts[0]))
        with ThreadPoolExecutor(len(parts), thread_name_prefix="slurm-array") as pool:  # submitted at once
            futures = [pool.submit(self.submitit.launch, [job_overrides[i] for i in part], initial_job_idx + part.start)
                       for part in parts]
            return [ret for future in futures for ret in future.result()]
