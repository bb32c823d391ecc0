"""The first thing tools/gpu_report.py does, before it imports anything of the harness or a third-party package:
on a machine that lacks hydra etc. (the bare GPU machine), pip-install `.whl/` into /tmp/site and put it first on
sys.path. Standard library only (tests/test_gpu_report.py runs it under a Python without hydra/omegaconf/mup)."""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("GPU_REPORT_SITE", "/tmp/site"))  # where .whl/ is installed (shared/gpu/README.md)
WHEELS = Path(os.environ.get("GPU_REPORT_WHEELS", ROOT / ".whl"))  # `make gpu-wheels` fills it
REQUIRED = ("hydra", "omegaconf", "mup", "schedulefree", "filelock", "mlxtend")  # the harness cannot run without


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def _key(version: str) -> tuple[int, ...]:
    return tuple(int(p) for p in re.findall(r"\d+", version)[:3])


def _stale(wheels: list[Path]) -> list[str]:
    """Floored packages whose wheel in `.whl/` is newer than the importable one (the GPU image's timm 1.0.29)."""
    out = []
    for w in wheels:
        m = re.match(r"(timm)-([^-]+)-", w.name)
        if m and _key(_version(m.group(1)) or "0") < _key(m.group(2)):
            out.append(m.group(1))
    return out


def bootstrap() -> dict[str, Any]:
    """Install `.whl/` where needed and put /tmp/site and this checkout first on sys.path. Returns what it did:
    {wheels, installed_for, pip: {rc, tail} | None, seconds}."""
    t0 = time.monotonic()
    if SITE.is_dir() and str(SITE) not in sys.path:  # installed by an earlier call on this (warm) machine
        sys.path.insert(0, str(SITE))
    wheels = sorted(WHEELS.glob("*.whl"))
    need = [m for m in REQUIRED if importlib.util.find_spec(m) is None] + _stale(wheels)
    pip = None
    if need and wheels:
        cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
               "--upgrade", "--target", str(SITE), *map(str, wheels)]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        pip = {"rc": proc.returncode, "tail": proc.stderr.strip()[-1500:]}
        if proc.returncode:
            print(f"[gpu-report] installing .whl/ failed (rc {proc.returncode}): {proc.stderr.strip()[-300:]}",
                  flush=True)
        if str(SITE) not in sys.path:
            sys.path.insert(0, str(SITE))
        importlib.invalidate_caches()
    if str(ROOT) not in sys.path[:1]:
        sys.path.insert(0, str(ROOT))
    return {"wheels": len(wheels), "installed_for": need if wheels else [], "pip": pip,
            "seconds": round(time.monotonic() - t0, 2)}


if __name__ == "__main__":  # python3 tools/gpu_report_bootstrap.py: install, then say what is importable
    done = bootstrap()
    print({"bootstrap": done, "missing": [m for m in REQUIRED if importlib.util.find_spec(m) is None]})
