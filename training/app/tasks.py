"""What a job can do (`task=` in the config): each task takes the job's config and returns result.json's dict.

Tasks register themselves in their own module (`@TASKS.register("name")`); the registry finds every module of
training.mdl and training.starvation on first lookup. `hash_keys=(...)` declares the config groups a task reads:
its config hash covers only those (plus task and seed); without it, every semantic key.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from erasure.registry import Registry
from training.app.results import config_hash

Task = Callable[[Mapping[str, Any]], dict[str, Any]]
TASKS: Registry[Task] = Registry("task", discover=("training.mdl", "training.starvation"))


def get_task(name: str) -> Task:
    return TASKS.get(name)


def job_hash(cfg: Mapping[str, Any]) -> str:
    """The config hash a job of `cfg["task"]` stores in result.json (what identifies its configuration)."""
    keys = TASKS.meta(str(cfg.get("task", "mdl"))).get("hash_keys")
    if keys is None:
        return config_hash(cfg)
    return config_hash({k: cfg[k] for k in ("task", "seed", *keys) if k in cfg})
