"""What a result was computed with: `result["provenance"]` in every result.json (training/app/lifecycle.py).

    {"code": {"commit": "<sha or null>", "dirty": true | false | null, "version": "<package version>"},
     "python": "3.11.9", "torch": "2.3.1", "numpy": "1.26.4", "device_name": "NVIDIA H100 ...", "host": "node7",
     "started": "2026-01-01T12:00:00+00:00", "ended": "2026-01-01T12:03:10+00:00"}

`code.commit` is `git rev-parse HEAD` of the checkout holding the `training` package, `code.dirty` whether its
tracked files differ from that commit (`git status --porcelain --untracked-files=no`: untracked files, e.g. the
outputs, do not count). Outside a git checkout (an installed wheel) or when git fails, both are null and
`code.version` is what is known (pyproject.toml's in a checkout, the installed distribution's otherwise).
scripts/aggregate.py marks a cell whose seeds come from different commits. Computed once per process: a job costs
nothing for it.
"""

from __future__ import annotations

import functools
import logging
import os
import platform
import re
import socket
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import torch

log = logging.getLogger(__name__)
CHECKOUT = Path(__file__).resolve().parents[2]  # the directory holding the `training` package
GIT_TIMEOUT_S = 5.0


def now_utc() -> str:
    """The time now, ISO-8601 in UTC (seconds)."""
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _git(checkout: Path, *args: str) -> str | None:
    """stdout of `git <args>` in `checkout`, or None when git is absent, fails or takes too long."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}  # status never takes the index lock
    try:
        proc = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError) as err:
        log.debug("git %s in %s: %s", " ".join(args), checkout, err)
        return None
    return proc.stdout if proc.returncode == 0 else None


def package_version(checkout: Path = CHECKOUT) -> str | None:
    """The package's version: pyproject.toml's in a checkout (what runs), else the installed distribution's
    METADATA next to the package (read as text: no importlib, tests/test_layers.py), else None."""
    pyproject = checkout / "pyproject.toml"
    try:
        if pyproject.is_file():
            after = ("\n" + pyproject.read_text()).split("\n[project]\n", 1)[-1]
            project = re.split(r"^\[", after, flags=re.MULTILINE)[0]  # up to the next table
            found = re.search(r'^version\s*=\s*"([^"]+)"', project, flags=re.MULTILINE)
            return found.group(1) if found else None
        for meta in sorted(checkout.glob("erasure_mdl-*.dist-info/METADATA")):
            found = re.search(r"^Version:\s*(\S+)", meta.read_text(), flags=re.MULTILINE)
            if found:
                return found.group(1)
    except OSError:
        pass
    return None


@functools.cache
def code_provenance(checkout: Path = CHECKOUT) -> dict[str, Any]:
    """{"commit", "dirty", "version"} of the code in `checkout` (commit and dirty null outside a git checkout)."""
    commit, dirty = None, None
    if (checkout / ".git").exists():  # a checkout or a worktree (.git is then a file); never a parent's repo
        head = _git(checkout, "rev-parse", "HEAD")
        status = _git(checkout, "status", "--porcelain", "--untracked-files=no") if head else None
        if head and status is not None:
            commit, dirty = head.strip(), bool(status.strip())
        else:
            log.warning("provenance: cannot read the git commit of %s (git missing, failing or slow); the result "
                        "records commit null", checkout)
    return {"commit": commit, "dirty": dirty, "version": package_version(checkout)}


@functools.cache
def device_name(device: str) -> str:
    """The GPU's name for a CUDA device, else the CPU model (/proc/cpuinfo, else what `platform` says)."""
    dev = torch.device(device)
    if dev.type == "cuda":
        try:
            return torch.cuda.get_device_name(dev)
        except (RuntimeError, AssertionError, ValueError) as err:
            return f"cuda ({type(err).__name__})"
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or dev.type


def provenance(device: torch.device | str, started: str, ended: str) -> dict[str, Any]:
    """`result["provenance"]` of a job that ran on `device` from `started` to `ended` (ISO-8601 UTC)."""
    return {"code": dict(code_provenance()), "python": platform.python_version(), "torch": torch.__version__,
            "numpy": np.__version__, "device_name": device_name(str(device)), "host": socket.gethostname(),
            "started": started, "ended": ended}
