"""result.json: skip/refuse logic for a job directory, and finding results of the pre-v2 layout."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from erasure.files import read_json
from training.app.schema import config_hash, semantic

log = logging.getLogger(__name__)

RESULT_FILE = "result.json"


def to_plain(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """A typed or plain config as nested plain dicts (what result.json stores)."""
    return {str(k): to_plain(v) if isinstance(v, Mapping) else v for k, v in cfg.items()}


def _flat(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


# Before hash v2 these were null in the config and resolved in Python to the paper's values, as they now are in conf/.
_V1_RESOLVED = ("optim.lr", "optim.beta1", "optim.warmup_steps")


def legacy_differences(old_config: Mapping[str, Any], cfg: Mapping[str, Any]) -> list[str]:
    """Semantic keys on which a result written before hash v2 differs from `cfg` (empty: the same job).

    A key the old config lacks counts as a difference (it was added since, possibly with new behaviour); a key
    only the old config has (since removed as dead) does not.
    """
    old, new = _flat(semantic(old_config)), _flat(semantic(cfg))
    return sorted(k for k, v in new.items()
                  if k not in old or (old[k] != v and not (old[k] is None and k in _V1_RESOLVED)))


def legacy_result(cfg: Mapping[str, Any], job_dir: Path) -> dict[str, Any] | None:
    """A finished result of this configuration in its pre-v2 directory (`paths.legacy_job_dir`), if any."""
    legacy = (cfg.get("paths") or {}).get("legacy_job_dir")
    if not legacy or (job_dir / RESULT_FILE).exists():
        return None
    done = read_json(Path(legacy) / RESULT_FILE)
    if not isinstance(done, dict) or "hash_version" in done or not isinstance(done.get("config"), dict):
        return None
    diff = legacy_differences(done["config"], cfg)
    if diff:
        log.info("not reusing %s (written before job directories carried the config hash): it differs in %s",
                 legacy, ", ".join(diff[:6]) + (" ..." if len(diff) > 6 else ""))
        return None
    log.info("SKIP %s: the same configuration finished in %s (pre-v2 layout; README: Where results go)",
             job_dir, legacy)
    return done


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
        return True  # same config; the stored hash predates a change of what the hash covers
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
