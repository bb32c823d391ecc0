"""What a result was computed with: `result["provenance"]` in every result.json (training/app/lifecycle.py).

    {"code": {"commit": "<sha or null>", "dirty": true | false | null, "version": "<package version>"},
     "python": "3.11.9", "torch": "2.3.1", "numpy": "1.26.4", "device_name": "NVIDIA H100 ...", "host": "node7",
     "started": "2026-01-01T12:00:00+00:00", "ended": "2026-01-01T12:03:10+00:00"}

`code.commit` is read from the git directory's files of the checkout holding `training` (a checkout another user
owns, which git refuses, still gives it); `code.dirty` is whether its tracked files differ from it (`git status
--untracked-files=no`; null, with git's reason in a warning, where git refuses). Outside a git checkout both are null
and `code.version` is what is known (pyproject.toml's, else the installed distribution's). Computed once per process.
"""

from __future__ import annotations

import contextlib
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


def _git(checkout: Path, *args: str) -> tuple[str | None, str]:
    """(stdout of `git <args>` in `checkout`, "") or (None, why it failed: git's own first error line, or that
    git is missing or slow)."""
    env = {**os.environ, "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}  # status never takes the index lock
    try:
        proc = subprocess.run(["git", "-C", str(checkout), *args], capture_output=True, text=True,
                              timeout=GIT_TIMEOUT_S, env=env, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return None, f"git took more than {GIT_TIMEOUT_S:g} s"
    except (OSError, subprocess.SubprocessError) as err:
        return None, f"git cannot run: {err}"
    if proc.returncode == 0:
        return proc.stdout, ""
    lines = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    return None, lines[0] if lines else f"git exited with {proc.returncode}"


def package_version(checkout: Path = CHECKOUT) -> str | None:
    """The package's version: pyproject.toml's in a checkout (what runs), else the installed distribution's
    METADATA next to the package (read as text: no importlib, tests/test_layers.py), else None."""
    pyproject = checkout / "pyproject.toml"
    with contextlib.suppress(OSError):
        if pyproject.is_file():
            after = ("\n" + pyproject.read_text()).split("\n[project]\n", 1)[-1]
            project = re.split(r"^\[", after, flags=re.MULTILINE)[0]  # up to the next table
            found = re.search(r'^version\s*=\s*"([^"]+)"', project, flags=re.MULTILINE)
            return found.group(1) if found else None
        for meta in sorted(checkout.glob("erasure_mdl-*.dist-info/METADATA")):
            found = re.search(r"^Version:\s*(\S+)", meta.read_text(), flags=re.MULTILINE)
            if found:
                return found.group(1)
    return None


SHA = re.compile(r"^[0-9a-f]{40}([0-9a-f]{24})?$")


class NoCommit(Exception):
    """Why the commit of a checkout could not be read from its files (the message says exactly what failed)."""


def _git_dir(checkout: Path) -> Path:
    """The checkout's git directory: `.git` itself, or where a worktree's `.git` file points (`gitdir: ...`)."""
    dot = checkout / ".git"
    if dot.is_dir():
        return dot
    text = dot.read_text().strip()
    if not text.startswith("gitdir:"):
        raise NoCommit(f"{dot} is neither a directory nor a 'gitdir:' file")
    target = Path(text.removeprefix("gitdir:").strip())
    return target if target.is_absolute() else (checkout / target).resolve()


def _ref(git_dir: Path, common: Path, name: str) -> str | None:
    for base in (git_dir, common):  # per-worktree refs first, then the repository's loose refs
        loose = base / name
        if loose.is_file():
            return loose.read_text().strip()
    packed = common / "packed-refs"
    if packed.is_file():
        for line in packed.read_text().splitlines():
            sha, _, ref = line.partition(" ")
            if ref.strip() == name and SHA.match(sha):
                return sha
    return None


def head_from_files(checkout: Path) -> str:
    """The commit HEAD names, read from the git directory's files (git refuses a repository another user owns, its
    files do not); NoCommit says why when it cannot be (unreadable files, an unborn branch, a reftable repository)."""
    try:
        git_dir = _git_dir(checkout)
        common_file = git_dir / "commondir"
        common = (git_dir / common_file.read_text().strip()).resolve() if common_file.is_file() else git_dir
        head = (git_dir / "HEAD").read_text().strip()
        for _ in range(5):  # a symbolic ref may point at another symbolic ref
            if SHA.match(head):
                return head
            if not head.startswith("ref:"):
                raise NoCommit(f"{git_dir / 'HEAD'} holds neither a commit nor a ref: {head[:60]!r}")
            name = head.removeprefix("ref:").strip()
            target = _ref(git_dir, common, name)
            if target is None:
                why = " (a reftable repository)" if (common / "reftable").exists() else ""
                raise NoCommit(f"{name} has no commit in {common}{why}")
            head = target
        raise NoCommit(f"HEAD of {git_dir} is a chain of more than 5 symbolic refs")
    except OSError as err:
        raise NoCommit(f"cannot read {getattr(err, 'filename', None) or checkout}: {err.strerror or err}") from err


@functools.cache
def code_provenance(checkout: Path = CHECKOUT) -> dict[str, Any]:
    """{"commit", "dirty", "version"} of the code in `checkout` (commit and dirty null outside a git checkout). The
    commit is read from the git directory's files (`head_from_files`); `dirty` needs `git status`, which git refuses
    for a checkout another user owns (null then). Each warning says exactly what could not be read and why."""
    commit, dirty = None, None
    if (checkout / ".git").exists():  # a checkout or a worktree (.git is then a file); never a parent's repo
        try:
            commit = head_from_files(checkout)
        except NoCommit as err:
            log.warning("provenance: cannot read the git commit of %s: %s; the result records commit null",
                        checkout, err)
        status, why = _git(checkout, "status", "--porcelain", "--untracked-files=no")
        if status is not None:
            dirty = bool(status.strip())
        else:
            hint = "; add it to git's safe.directory to record it" if "dubious ownership" in why else ""
            log.warning("provenance: cannot tell whether %s has uncommitted changes, git status failed: %s; the "
                        "result records dirty null (the commit is read from its files)%s", checkout, why, hint)
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
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or dev.type


def provenance(device: torch.device | str, started: str, ended: str) -> dict[str, Any]:
    """`result["provenance"]` of a job that ran on `device` from `started` to `ended` (ISO-8601 UTC)."""
    return {"code": dict(code_provenance()), "python": platform.python_version(), "torch": torch.__version__,
            "numpy": np.__version__, "device_name": device_name(str(device)), "host": socket.gethostname(),
            "started": started, "ended": ended}
