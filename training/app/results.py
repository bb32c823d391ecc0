"""result.json: config hash, skip/refuse logic for a job directory."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from erasure.files import read_json

log = logging.getLogger(__name__)

# Keys that do not change the numbers: where things go, how they are logged, which device and engine run them
# (`training.*` engines are bitwise equal on CPU and equal up to float32 rounding on GPU: tests/test_vectorized.py).
NON_SEMANTIC_KEYS = ("paths", "logger", "force", "experiment_name", "claims", "device", "hydra", "progress", "training")
RESULT_FILE = "result.json"


def config_hash(cfg: Mapping[str, Any]) -> str:
    semantic = {k: v for k, v in cfg.items() if k not in NON_SEMANTIC_KEYS}
    blob = json.dumps(semantic, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


class ConfigMismatchError(RuntimeError):
    """A job directory already holds a result of a different configuration."""


def should_skip(job_dir: Path, cfg_hash: str, force: bool) -> bool:
    """True when job_dir holds a finished result with this hash; raise when it holds another config's."""
    done = read_json(job_dir / RESULT_FILE)
    if done is None:
        return False
    if done.get("config_hash") == cfg_hash:
        return True
    if isinstance(done.get("config"), dict) and config_hash(done["config"]) == cfg_hash:
        return True  # same config; the stored hash predates a change of NON_SEMANTIC_KEYS
    if force:
        log.warning("force=true: replacing %s (hash %s -> %s)", job_dir, done.get("config_hash"), cfg_hash)
        return False
    raise ConfigMismatchError(
        f"{job_dir} already holds a result for another configuration (hash {done.get('config_hash')}, "
        f"this run {cfg_hash}); pass force=true to replace it or choose another paths.out_dir"
    )


def finished_result(job_dir: Path, cfg_hash: str, force: bool) -> dict[str, Any] | None:
    """The stored result when this job already finished (logs SKIP), else None; refuses another config's dir."""
    if not should_skip(job_dir, cfg_hash, force):
        return None
    log.info("SKIP %s (finished, config hash %s)", job_dir, cfg_hash)
    return read_json(job_dir / RESULT_FILE) or {}
