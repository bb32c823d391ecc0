"""Run one benchmark measurement in a fresh Python process (so peak memory is its own) and read its JSON line."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def run_worker(script: str, args: list[str], threads: str = "1", label: str = "worker") -> dict[str, Any]:
    """`python -m tools.<script's name> --worker <args>` with wandb disabled; the worker prints its result as the last
    line."""
    env = {**os.environ, "WANDB_MODE": "disabled", "OMP_NUM_THREADS": threads}
    proc = subprocess.run([sys.executable, "-m", f"tools.{Path(script).stem}", "--worker", *args], capture_output=True,
                          text=True, cwd=ROOT, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{label} failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])
