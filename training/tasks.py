"""What a job can do (`task=` in the config). Each task takes the resolved config and returns result.json's dict."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Task = Callable[[dict[str, Any]], dict[str, Any]]


def _mdl(cfg: dict[str, Any]) -> dict[str, Any]:
    from training.pipeline import run_job

    return run_job(cfg)


TASKS: dict[str, Task] = {"mdl": _mdl}


def register_task(name: str, fn: Task) -> None:
    TASKS[name] = fn


def get_task(name: str) -> Task:
    _load_plugins()
    if name not in TASKS:
        raise ValueError(f"unknown task {name!r}; choose one of {sorted(TASKS)}")
    return TASKS[name]


def _load_plugins() -> None:
    """Task modules register themselves on import; a missing optional module is not an error."""
    import importlib

    for module in ("training.starvation",):
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name != module:
                raise
