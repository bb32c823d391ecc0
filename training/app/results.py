"""A job directory: result.json, the config hash, skip/refuse logic, and the lock a job holds on its directory.

    job = JobDir(job_dir, cfg_hash, force)
    with job.locked():                      # a second job with this directory waits here (and says so)
        if (done := job.finished()) is not None:
            return done                     # SKIP: finished with this configuration
        ...
        job.write_result(result)            # re-checks the stored hash first: never overwrites another config

A malformed result.json (`[]`, `42`, `{}`, no config hash) counts as absent: warned about and recomputed, never
taken for another configuration's result.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.app.result_codec import MalformedResultError, config_view, encode, flatten, read
from training.app.result_types import Result
from training.app.schema import JobConfig, config_hash, numerics_of, semantic
from training.common.files import atomic_write_json
from training.common.locks import waiting_lock
from training.errors import UserError

log = logging.getLogger(__name__)

RESULT_FILE = "result.json"
LOCK_FILE = ".job.lock"


def stored_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A result's stored config as dotted key -> value, read as today's schema spells it (result_codec.config_view:
    defaults for declared keys it lacks, tags defaulting to names, eraser.fold read as eraser.repeat)."""
    return config_view(config)


# Before hash v2 these were null in the config and resolved in Python to the paper's values, as they now are in conf/.
_V1_RESOLVED = ("optim.lr", "optim.beta1", "optim.warmup_steps")


def legacy_differences(old_config: Mapping[str, Any], cfg: Mapping[str, Any] | JobConfig) -> list[str]:
    """Semantic keys on which a result written before hash v2 differs from `cfg` (empty: the same job).

    A key the old config lacks counts as a difference (it was added since, possibly with new behaviour); a key
    only the old config has (since removed as dead) does not.
    """
    old, new = flatten(semantic(old_config, fill_defaults=False)), flatten(semantic(cfg))
    return sorted(k for k, v in new.items()
                  if k not in old or (old[k] != v and not (old[k] is None and k in _V1_RESOLVED)))


def legacy_result(cfg: JobConfig, job_dir: Path) -> Result | None:
    """A finished result of this configuration in its pre-v2 directory (`paths.legacy_job_dir`), if any."""
    legacy = cfg.paths.legacy_job_dir
    if not legacy or (job_dir / RESULT_FILE).exists():
        return None
    try:
        done = read(Path(legacy) / RESULT_FILE)
    except MalformedResultError:
        return None
    if done is None or done.hash_version >= 2 or done.config is None:
        return None
    if done.numerics_version != numerics_of(cfg.task):
        log.info("not reusing %s: written under numerics version %s, this job's is %d (README: Numerics "
                 "versions)", legacy, done.numerics_version, numerics_of(cfg.task))
        return None
    diff = legacy_differences(done.config, cfg)
    if diff:
        log.info("not reusing %s (written before job directories carried the config hash): it differs in %s",
                 legacy, ", ".join(diff[:6]) + (" ..." if len(diff) > 6 else ""))
        return None
    log.info("SKIP %s: the same configuration finished in %s (pre-v2 layout; README: Where results go)",
             job_dir, legacy)
    return done


class ConfigMismatchError(UserError, RuntimeError):
    """A job directory already holds a result of a different configuration."""


def read_result(path: Path) -> Result | None:
    """The stored result, or None when absent or malformed (a malformed file is warned about: it is recomputed)."""
    try:
        done = read(path)
    except MalformedResultError as err:
        log.warning("ignoring malformed %s (%s); recomputing it", path, err)
        return None
    if done is not None and not done.config_hash:
        log.warning("ignoring malformed %s (no config hash: keys %s); recomputing it", path,
                    sorted(encode(done))[:6])
        return None
    return done


def stored_hash(done: Result) -> str | None:
    """A stored result's config hash recomputed with today's definition of the hash, under the numerics version
    it was computed with (result_codec.upgrade: 1 for results written before numerics versions)."""
    return None if done.config is None else config_hash(done.config, numerics=done.numerics_version)


def same_config(done: Result, cfg_hash: str) -> bool:
    # the stored hash, or (when it predates a change of what the hash covers) the stored config rehashed
    return done.config_hash == cfg_hash or stored_hash(done) == cfg_hash


def mismatch_message(job_dir: Path, stored: object, cfg_hash: str) -> str:
    return (f"{job_dir} already holds a result of another configuration (hash {stored}, this job {cfg_hash}): "
            "pass force=true to replace it, or choose another paths.out_dir")


@dataclass
class JobDir:
    """One job's directory, seen by the job that writes it (see the module docstring)."""

    path: Path
    cfg_hash: str
    force: bool = False
    found: str | None = None  # hash of the result present when the job started: force=true replaces that one only

    @contextmanager
    def locked(self) -> Iterator[JobDir]:
        """Hold the directory's lock for the whole job: a second job with the same directory waits (logging that
        it waits, on what and since when), then skips or refuses according to what the first one left."""
        self.path.mkdir(parents=True, exist_ok=True)
        with waiting_lock(self.path / LOCK_FILE, f"job directory {self.path} (another job with it is running)"):
            yield self

    def finished(self, stale: Callable[[Result], str | None] | None = None) -> Result | None:
        """The stored result when this job already finished (logs SKIP), else None; refuses another config's
        result unless force=true. force=true also recomputes a finished job of this configuration, and so does a
        result that `stale` gives a reason not to reuse (incomplete, computed on other data): one line says why."""
        done = read_result(self.path / RESULT_FILE)
        if done is None:
            return None
        self.found = done.config_hash
        if same_config(done, self.cfg_hash):
            why = stale(done) if stale is not None and not self.force else None
            if why is not None:
                log.warning("not reusing %s: %s; running the job again", self.path / RESULT_FILE, why)
                return None
            if not self.force:
                log.info("SKIP %s (finished, config hash %s)", self.path, self.cfg_hash)
                return done
            log.warning("force=true: recomputing %s (finished with this configuration, hash %s)", self.path,
                        self.cfg_hash)
            return None
        if self.force:
            log.warning("force=true: replacing %s (hash %s -> %s)", self.path, self.found, self.cfg_hash)
            return None
        raise ConfigMismatchError(mismatch_message(self.path, self.found, self.cfg_hash))

    def write_result(self, result: Result) -> Path:
        """Write result.json (atomically, through the codec: `encode`) after re-checking what is there: a result
        of another configuration that appeared while this job ran (a process that ignored the lock) is never
        overwritten; this job's result then goes to `result.<hash>.json` and the job fails with one line."""
        path = self.path / RESULT_FILE
        done = read_result(path)
        if done is not None and not same_config(done, self.cfg_hash) and not (self.force and
                                                                               done.config_hash == self.found):
            aside = self.path / f"result.{self.cfg_hash}.json"
            atomic_write_json(aside, encode(result))
            raise ConfigMismatchError(
                f"{path} was written by another configuration (hash {done.config_hash}) while this job "
                f"({self.cfg_hash}) ran: not overwritten, this job's result is in {aside}; give the two "
                "configurations different directories (paths.out_dir)")
        atomic_write_json(path, encode(result))
        return path

