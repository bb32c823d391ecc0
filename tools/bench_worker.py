"""What the benchmarks share: one measurement in a fresh Python process (so peak memory is its own), read back from
its last line; the memory figures they report; a job's config composed as `python -m training.run` composes it."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_worker(script: str, payload: dict[str, Any], threads: str | None = "1", label: str = "worker"
               ) -> dict[str, Any]:
    """`python -m tools.<script's name> --worker '<payload as JSON>'` with wandb disabled and OMP_NUM_THREADS=`threads`
    (None: as here); the worker prints its result as JSON on its last line."""
    env = {**os.environ, "WANDB_MODE": "disabled", **({"OMP_NUM_THREADS": threads} if threads is not None else {})}
    proc = subprocess.run([sys.executable, "-m", f"tools.{Path(script).stem}", "--worker", json.dumps(payload)],
                          capture_output=True, text=True, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{label} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def write_json(path: Path, value: Any) -> None:
    """A benchmark's --json file (its folder made if needed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=1) + "\n")


def rss_mb() -> float:
    """This process's resident memory now (MB)."""
    return int(Path("/proc/self/statm").read_text().split()[1]) * resource.getpagesize() / 2**20


def peak_mb(cuda: bool) -> float:
    """This process's peak memory (MB): torch's max_memory_allocated on CUDA, else the peak RSS (ru_maxrss, KiB)."""
    if cuda:
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def job_config(overrides: list[str]) -> dict[str, Any]:
    """The resolved config (conf/config.yaml) that `python -m training.run <overrides>` runs."""
    from hydra import compose, initialize_config_dir

    from training.common.conf import CONF_DIR, resolved_dict

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return resolved_dict(compose("config", overrides=overrides))
