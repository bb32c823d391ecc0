"""`device=auto|cpu|cuda|cuda:N` -> torch.device, with one clear line when the device asked for is not there."""

from __future__ import annotations

import contextlib
from pathlib import Path

import torch

from training.errors import Refused


def device_problem(name: str) -> str | None:
    """Why `device=<name>` cannot run here (one line: what is wrong and what to do), or None when it can."""
    if not name.startswith("cuda"):
        return None
    if not torch.cuda.is_available():
        why = "torch was built without CUDA" if torch.version.cuda is None else "no CUDA GPU is visible to torch"
        return (f"device={name!r} is not allowed: device must be auto or cpu on this machine ({why}); use device=auto "
                "(the GPU where there is one) or run the job on a GPU machine")
    index = name.partition(":")[2]
    count = torch.cuda.device_count()
    if index and int(index) >= count:
        return (f"device={name!r} is not allowed: device must be cuda or cuda:0..cuda:{count - 1} on this machine "
                f"({count} GPU{'s' if count != 1 else ''} visible; CUDA_VISIBLE_DEVICES renumbers them from 0)")
    return None


def resolve_device(name: str) -> torch.device:
    """The device of `device=<name>`; `Refused` (one line, nothing has run yet) when it is not there."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if (problem := device_problem(name)) is not None:
        raise Refused(problem)
    return torch.device(name)


def available_memory(device: torch.device) -> int | None:
    """Bytes a job can still allocate on `device`: a GPU's free memory (`torch.cuda.mem_get_info`); on CPU the
    kernel's MemAvailable (/proc/meminfo), or less where a cgroup limits this process. None when unknown."""
    if device.type == "cuda":
        try:
            return int(torch.cuda.mem_get_info(device)[0])
        except (RuntimeError, AssertionError):
            return None
    if device.type != "cpu":
        return None
    return min((v for v in (_meminfo_available(), _cgroup_room()) if v is not None), default=None)


def _meminfo_available() -> int | None:
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return None


def _cgroup_room() -> int | None:
    """Room left under this process's cgroup memory limit (v2 memory.max, v1 memory.limit_in_bytes); None if none."""
    for limit_file, usage_file in (("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory.current"),
                                   ("/sys/fs/cgroup/memory/memory.limit_in_bytes",
                                    "/sys/fs/cgroup/memory/memory.usage_in_bytes")):
        try:
            raw = Path(limit_file).read_text().strip()
            if raw == "max" or int(raw) >= 2**60:
                return None
            return max(0, int(raw) - int(Path(usage_file).read_text().strip()))
        except (OSError, ValueError):
            continue
    return None
