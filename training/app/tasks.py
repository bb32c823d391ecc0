"""What a job can do (`task=` in the config): each task takes the job's config and returns result.json's dict.

Tasks register themselves in their own module (`@TASKS.register("name")`); the registry finds every module of
training.mdl and training.starvation on first lookup.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from erasure.registry import Registry

Task = Callable[[Mapping[str, Any]], dict[str, Any]]
TASKS: Registry[Task] = Registry("task", discover=("training.mdl", "training.starvation"))


def get_task(name: str) -> Task:
    return TASKS.get(name)
