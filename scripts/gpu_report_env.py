"""scripts/gpu_report.py's environment: the wheels installed where the harness is not (the GPU machine), and what
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
import time
from pathlib import Path

from scripts.gpu_report_model import DeviceInfo, Env, GitInfo, HostInfo, InstallInfo, build
from scripts.gpu_report_payload import Payload
from scripts.gpu_report_runner import ROOT, tail

SITE = Path(os.environ.get("GPU_REPORT_SITE", "/tmp/site"))  # where .whl/ is installed (shared/gpu/README.md)
REQUIRED = ("hydra", "omegaconf", "mup", "schedulefree", "filelock", "mlxtend")  # the harness cannot run without
PACKAGES = ("hydra-core", "omegaconf", "mup", "schedulefree", "timm", "numpy", "scipy", "pytest", "pytest-xdist",
            "concept-erasure", "numba")  # their versions are recorded
OPTIONAL = ("pytest", "xdist", "concept_erasure", "numba", "submitit", "wandb")  # some tests/steps need them


def ensure_packages() -> tuple[dict[str, str], InstallInfo]:
    """Make the harness importable here and in subprocesses: on a machine that lacks hydra etc. (the GPU
    machine), pip-install `.whl/` into /tmp/site (shared/gpu/README.md). Returns the subprocess environment and
    what the install did."""
    t0 = time.monotonic()
    info = InstallInfo()
    paths = [str(ROOT)]
    if SITE.is_dir() and str(SITE) not in sys.path:  # installed by an earlier call on this (warm) machine
        sys.path.insert(0, str(SITE))
    missing = [m for m in REQUIRED if importlib.util.find_spec(m) is None]
    wheels = sorted((ROOT / ".whl").glob("*.whl"))
    info.wheels = len(wheels)
    if missing and wheels:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--upgrade", "--target", str(SITE), *map(str, wheels)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        info.pip = {"rc": proc.returncode, "tail": tail(proc.stderr, 10, 1500)}
        if str(SITE) not in sys.path:
            sys.path.insert(0, str(SITE))
        importlib.invalidate_caches()
    if SITE.is_dir():
        paths.append(str(SITE))
    sys.path.insert(0, str(ROOT))
    info.missing = [m for m in (*REQUIRED, *OPTIONAL) if importlib.util.find_spec(m) is None]
    info.seconds = round(time.monotonic() - t0, 2)
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
    for top in ("conf", "erasure", "models", "scripts", "tests", "training"):
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
        proc = subprocess.run([sys.executable, "-m", "scripts.gpu_report_work", "device",
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
