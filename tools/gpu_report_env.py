"""tools/gpu_report.py's environment: the wheels installed where the harness is not (the GPU machine), and what
the report records of the machine, the packages and the code (commit, source digest)."""

from __future__ import annotations

import argparse
import hashlib
import importlib
import importlib.util
import json
import os
import platform
import subprocess
import sys
from typing import Any

from tools.gpu_report_bootstrap import REQUIRED, SITE
from tools.gpu_report_model import DeviceInfo, Env, GitInfo, HostInfo, InstallInfo, build
from tools.gpu_report_payload import Payload
from tools.gpu_report_runner import ROOT, tail

PACKAGES = ("hydra-core", "omegaconf", "mup", "schedulefree", "timm", "numpy", "scipy", "pytest", "pytest-xdist",
            "concept-erasure", "numba")  # their versions are recorded
OPTIONAL = ("pytest", "xdist", "concept_erasure", "numba", "submitit", "wandb")  # some tests/steps need them


def ensure_packages(done: dict[str, Any]) -> tuple[dict[str, str], InstallInfo]:
    """The subprocess environment (this checkout and /tmp/site on PYTHONPATH) and what the bootstrap did
    (tools/gpu_report_bootstrap.py, run before anything was imported)."""
    info = InstallInfo(wheels=done["wheels"], seconds=done["seconds"], pip=done["pip"])
    paths = [str(ROOT), *([str(SITE)] if SITE.is_dir() else [])]
    info.missing = [m for m in (*REQUIRED, *OPTIONAL) if importlib.util.find_spec(m) is None]
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*paths, *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])])
    env.setdefault("WANDB_MODE", "disabled")
    env["PYTHONUNBUFFERED"] = "1"
    return env, info


def version(module: str) -> str | None:
    try:
        from importlib.metadata import version as dist_version

        return dist_version(module)
    except Exception:
        try:
            return str(getattr(importlib.import_module(module), "__version__", "?"))
        except Exception:
            return None


def tree_digest() -> str:
    """sha256 of the tracked-looking sources (.py, .yaml, Makefile, pyproject): ties a run on a machine without
    .git to a commit (compute it here on a checkout and compare)."""
    h = hashlib.sha256()
    files = [ROOT / "Makefile", ROOT / "pyproject.toml"]
    for top in ("conf", "erasure", "models", "scripts", "tests", "tools", "training"):
        files += [p for p in (ROOT / top).rglob("*") if p.suffix in (".py", ".yaml") and "__pycache__" not in p.parts]
    for p in sorted(files):
        if p.is_file():
            h.update(str(p.relative_to(ROOT)).encode() + b"\0" + p.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def git_info(commit: str | None) -> GitInfo:
    info = GitInfo(tree_digest=tree_digest())
    found = None
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
        if head.returncode == 0:
            found = head.stdout.strip()
            dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                                   capture_output=True, text=True, timeout=10)
            info.dirty = bool(dirty.stdout.strip())
    except (OSError, subprocess.SubprocessError):
        pass
    info.commit_given = commit or None
    info.commit = found or commit or os.environ.get("GIT_COMMIT") or "unknown (no git here; pass --commit)"
    return info


def environment(args: argparse.Namespace, install: InstallInfo) -> Env:
    import torch

    cpu = platform.processor() or "?"
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    host = HostInfo(cpu, len(os.sched_getaffinity(0)), platform.platform(),
                    round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 1e9, 1))
    if args.device.startswith("cuda"):  # asked in a subprocess: this process holds no CUDA context (memory)
        proc = subprocess.run([sys.executable, "-m", "tools.gpu_report_work", "device",
                               Payload(device=args.device).to_json()], capture_output=True, text=True, timeout=120,
                              cwd=ROOT)
        if proc.returncode != 0:
            raise SystemExit(f"gpu_report: cannot read the CUDA device: {tail(proc.stderr, 3)}")
        device = build(DeviceInfo, json.loads(proc.stdout.strip().splitlines()[-1].removeprefix("RESULT ")))
    else:
        device = DeviceInfo(f"CPU: {cpu}", "cpu", extra={"threads": torch.get_num_threads()})
    return Env(python=platform.python_version(), torch=torch.__version__, cuda=torch.version.cuda,
               cudnn=torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
               host=host, git=git_info(args.commit), device=device, install=install,
               packages={m: version(m) for m in PACKAGES})
