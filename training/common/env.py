"""The environment variables the harness reads, each named once, here, with its type and default: code elsewhere calls
the accessor (`env.wandb_mode()`), never `os.environ` by name; the multirun ledger's two variables are also set here
(`set_multirun`), so that workers and sbatch jobs inherit them.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path

MEMORY_CHECK = "ERASURE_MDL_MEMORY_CHECK"  # 0: skip the memory check (its estimate is rough)
PROGRESS_SECONDS = "ERASURE_MDL_PROGRESS_SECONDS"  # seconds between progress lines (default 60)
LOCK_LOG_EVERY = "ERASURE_MDL_LOCK_LOG_EVERY"  # seconds between "still waiting" lines of a lock (default 60)
MULTIRUN_LEDGER = "ERASURE_MDL_MULTIRUN_LEDGER"  # the running multirun's ledger directory (training/cli/ledger.py)
MULTIRUN_TOTAL = "ERASURE_MDL_MULTIRUN_TOTAL"  # how many jobs it launches ("" unknown)
SWEEP_PARENT = "ERASURE_MDL_SWEEP_PARENT"  # pid of a sweep's launching process whose workers are its children
FULL_ERROR = "HYDRA_FULL_ERROR"  # 1: a traceback with each error (the user's choice; Hydra's own variable)
USER_FULL_ERROR = "ERASURE_MDL_FULL_ERROR"  # the user's HYDRA_FULL_ERROR while the entry sets it for Hydra
DEFAULT_LOCK_LOG_EVERY = 60.0


def _set(name: str) -> str | None:
    """The variable's value; None where it is unset or empty."""
    return os.environ.get(name) or None


def memory_check() -> bool:
    """Whether the MDL precheck refuses a job its device has not the memory for (ERASURE_MDL_MEMORY_CHECK=0: no)."""
    return os.environ.get(MEMORY_CHECK) != "0"


def progress_seconds() -> float:
    """Seconds between progress lines (training/common/progress.py)."""
    return float(os.environ.get(PROGRESS_SECONDS, "60"))


def lock_log_every() -> float:
    """Seconds between a waiting lock's log lines: at least 0.01; the default for a value that is not a number."""
    try:
        return max(0.01, float(os.environ.get(LOCK_LOG_EVERY, DEFAULT_LOCK_LOG_EVERY)))
    except ValueError:
        return DEFAULT_LOCK_LOG_EVERY


def multirun_ledger() -> Path | None:
    """The ledger directory of the multirun this job is part of (None: a single run)."""
    found = _set(MULTIRUN_LEDGER)
    return None if found is None else Path(found)


def multirun_total() -> str:
    """How many jobs the multirun launches, as the progress line shows it ("?" unknown)."""
    return _set(MULTIRUN_TOTAL) or "?"


def set_multirun(ledger: Path, total: int | None) -> None:
    """Name the multirun's ledger and size for the processes it starts (joblib/submitit workers, sbatch jobs)."""
    os.environ[MULTIRUN_LEDGER] = str(ledger)
    os.environ[MULTIRUN_TOTAL] = "" if total is None else str(total)


def set_sweep_parent(pid: int) -> None:
    """The launching process of a sweep whose jobs run in its child processes (joblib/loky workers)."""
    os.environ[SWEEP_PARENT] = str(pid)


def sweep_parent() -> int | None:
    found = _set(SWEEP_PARENT)
    return int(found) if found and found.isdigit() else None


def hydra_full_error() -> bool:
    """Whether the user asked for tracebacks (HYDRA_FULL_ERROR=1), also where `hydra_raises` set it for Hydra."""
    return os.environ.get(USER_FULL_ERROR, os.environ.get(FULL_ERROR)) == "1"


def hydra_raises() -> Callable[[], None]:
    """Make Hydra raise its errors to the caller instead of printing them (HYDRA_FULL_ERROR=1), keeping the user's
    choice for `hydra_full_error`, here and in the processes this one starts; returns what puts both back."""
    return setting({USER_FULL_ERROR: os.environ.get(USER_FULL_ERROR, os.environ.get(FULL_ERROR, "")), FULL_ERROR: "1"})


def cxx() -> str | None:
    """The C++ compiler the user named (CXX)."""
    return _set("CXX")


def submitit_executor() -> str | None:
    """`slurm` or `local` inside a submitit job; None elsewhere."""
    return _set("SUBMITIT_EXECUTOR")


def submitit_preempt_signal() -> str:
    """The name (without SIG) of the signal submitit sends at a time limit."""
    return os.environ.get("SUBMITIT_PREEMPT_SIGNAL", "USR2")


def wandb_mode() -> str | None:
    """WANDB_MODE as the user set it (None: the logger config's mode)."""
    return os.environ.get("WANDB_MODE")


def unset(names: Mapping[str, str]) -> dict[str, str]:
    """The entries of `names` (variable -> value) whose variable is unset or empty."""
    return {var: value for var, value in names.items() if _set(var) is None}


def setting(values: Mapping[str, str]) -> Callable[[], None]:
    """Set the variables; returns what puts back the values they had (unset ones unset again)."""
    old = {var: os.environ.get(var) for var in values}
    os.environ.update(values)

    def restore() -> None:
        for var, was in old.items():
            if was is None:
                os.environ.pop(var, None)
            else:
                os.environ[var] = was

    return restore
