"""The job-path scheme, made and parsed in this one module:

    <paths.out_dir>/runs/<dataset.tag>/<eraser.name>/<arch.tag>-w<arch.width>-d<arch.depth>/c<cell hash>/seed<seed>

The cell hash (8 hex digits, training/app/schema.py `cell_hash`) names the configuration without its seed, so two
configurations never share a directory and the seeds of one sit side by side. Results written before hash v2 live in
the same layout without the c<hash> part (`paths.legacy_job_dir`). conf/paths/default.yaml spells the scheme as
interpolations (Hydra resolves them before any Python runs); tests/test_job_paths.py checks that it agrees with
`JobPath.of` on every preset that uses it (the Gradient Starvation presets lay out their jobs by their own keys,
which nothing parses).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.app.schema import NON_CONFIG_KEYS, cell_hash
from training.app.task_spec import TaskSpec

RUNS = "runs"  # the folder under paths.out_dir that holds every job directory
_PATTERN = re.compile(r"(?P<dataset>[^/]+)/(?P<eraser>[^/]+)/(?P<arch>[^/]+)-w(?P<width>\d+)-d(?P<depth>\d+)"
                      r"(?:/(?P<cell>c[0-9a-f]{8}))?/seed(?P<seed>\d+)$")


@dataclass(frozen=True)
class JobPath:
    """Where a job's directory is, and what its path says about the job."""

    dataset: str  # dataset.tag
    eraser: str  # eraser.name
    arch: str  # arch.tag
    width: int
    depth: int
    cell: str | None  # "c" + the cell hash; None in the pre-v2 layout
    seed: int

    @classmethod
    def of(cls, cfg: Mapping[str, Any], spec: TaskSpec, legacy: bool = False) -> JobPath:
        """The path of a resolved job config of task `spec` (a plain dict, as composed); `legacy`: its pre-v2
        directory."""
        a = cfg["arch"]
        cell = None if legacy else "c" + cell_hash({k: v for k, v in cfg.items()
                                                    if k not in NON_CONFIG_KEYS and k != "paths"}, spec)
        return cls(str(cfg["dataset"]["tag"]), str(cfg["eraser"]["name"]), str(a["tag"]), int(a["width"]),
                   int(a["depth"]), cell, int(cfg["seed"]))

    @classmethod
    def parse(cls, path: str | Path) -> JobPath | None:
        """What a job directory's path says (its last parts, either layout); None for a path of another shape."""
        m = _PATTERN.search(Path(path).as_posix())
        if m is None:
            return None
        d = m.groupdict()
        return cls(d["dataset"], d["eraser"], d["arch"], int(d["width"]), int(d["depth"]), d["cell"], int(d["seed"]))

    @property
    def subdir(self) -> str:
        """The job's directory below `<out_dir>/runs` (paths.job_subdir)."""
        cell = "" if self.cell is None else f"/{self.cell}"
        return f"{self.dataset}/{self.eraser}/{self.arch}-w{self.width}-d{self.depth}{cell}/seed{self.seed}"

    def under(self, runs: str | Path) -> Path:
        """The job's directory in the folder `runs` (normally `<paths.out_dir>/runs`)."""
        return Path(runs) / self.subdir


def job_dir(out_dir: str | Path, cfg: Mapping[str, Any], spec: TaskSpec) -> Path:
    """paths.job_dir of a resolved job config of task `spec`, for `out_dir`."""
    return JobPath.of(cfg, spec).under(Path(out_dir) / RUNS)
