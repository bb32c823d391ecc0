"""What the benchmarks share: one measurement in a fresh Python process (so peak memory is its own), read back from
its last line, and the memory figures they report."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_worker(script: str, args: list[str], threads: str | None = "1", label: str = "worker") -> dict[str, Any]:
    """`python -m tools.<script's name> --worker <args>` with wandb disabled and OMP_NUM_THREADS=`threads` (None: as
    here); the worker prints its result as JSON on its last line."""
    env = {**os.environ, "WANDB_MODE": "disabled", **({"OMP_NUM_THREADS": threads} if threads is not None else {})}
    proc = subprocess.run([sys.executable, "-m", f"tools.{Path(script).stem}", "--worker", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{label} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def rss_mb() -> float:
    """This process's resident memory now (MB)."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def peak_mb(cuda: bool) -> float:
    """This process's peak memory (MB): torch's max_memory_allocated on CUDA, else the peak RSS (ru_maxrss, KiB)."""
    if cuda:
        import torch

        return torch.cuda.max_memory_allocated() / 2**20
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
