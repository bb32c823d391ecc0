"""A job directory: result.json, the config hash, skip/refuse logic, and the lock a job holds on its directory.

    job = JobDir(job_dir, cfg_hash, spec, force)
    with job.locked():                      # a second job with this directory waits here (and says so)
        if (done := job.finished()) is not None:
            return done                     # SKIP: finished with this configuration
        job.write_result(result)            # re-checks the stored hash first: never overwrites another config

A malformed result.json (`[]`, `42`, `{}`, no config hash) counts as absent: warned about and recomputed.
"""

from __future__ import annotations

import errno
import glob
import hashlib
import logging
import os
import re
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.app.result_codec import MalformedResultError, NewerSchemaError, encode, flatten, read
from training.app.result_types import Fingerprint, Result
from training.app.schema import JobConfig, config_hash, numerics_of, semantic
from training.app.task_spec import TaskSpec
from training.common.files import atomic_write_json
from training.common.locks import waiting_lock
from training.errors import UserError

log = logging.getLogger(__name__)

RESULT_FILE = "result.json"
LOCK_FILE = ".job.lock"
READ_ONLY = (errno.EACCES, errno.EPERM, errno.EROFS)  # what opening a file in a directory we may not write raises


# Before hash v2 these were null in the config and resolved in Python to the paper's values, as they now are in conf/.
_V1_RESOLVED = ("optim.lr", "optim.beta1", "optim.warmup_steps")


def legacy_differences(old_config: Mapping[str, Any], cfg: JobConfig) -> list[str]:
    """Semantic keys on which a result written before hash v2 differs from `cfg` (empty: the same job): a key the
    old config lacks (added since) counts, a key only the old config has (since removed as dead) does not."""
    old, new = flatten(semantic(old_config, cfg.task_spec, fill_defaults=False)), flatten(semantic(cfg))
    return sorted(k for k, v in new.items()
                  if k not in old or (old[k] != v and not (old[k] is None and k in _V1_RESOLVED)))


def legacy_result(cfg: JobConfig, job_dir: Path) -> Result | None:
    """A finished result of this configuration in its pre-v2 directory (`paths.legacy_job_dir`), if any."""
    legacy = cfg.paths.legacy_job_dir
    if not legacy or (job_dir / RESULT_FILE).exists():
        return None
    try:
        done = read(Path(legacy) / RESULT_FILE, cfg.task_spec)
    except MalformedResultError:
        return None
    if done is None or done.hash_version >= 2 or done.config is None:
        return None
    if done.task != cfg.task or done.config.get("task", "mdl") != cfg.task:
        return None  # another task's result: another job
    if done.numerics_version != numerics_of(cfg.task_spec):
        log.info("not reusing %s: written under numerics version %s, this job's is %d (docs/running.md: Numerics "
                 "versions)", legacy, done.numerics_version, numerics_of(cfg.task_spec))
        return None
    diff = legacy_differences(done.config, cfg)
    if diff:
        log.info("not reusing %s (written before job directories carried the config hash): it differs in %s",
                 legacy, ", ".join(diff[:6]) + (" ..." if len(diff) > 6 else ""))
        return None
    log.info("SKIP %s: the same configuration finished in %s (pre-v2 layout; docs/running.md: Where results go)",
             job_dir, legacy)
    return done


@dataclass(frozen=True)
class Stale:
    """Why a finished result of this configuration is not reused; `keep_as`: the file name it is moved to (in its
    directory) before the job runs again, when it is a finished measurement of other data (None: replaced);
    `restore`: the set-aside name of the data now read, under which an earlier result of that data may wait."""

    reason: str
    keep_as: str | None = None
    restore: str | None = None


SET_ASIDE = "result.data-{}.json"  # a result of other data, moved aside: read by aggregate.py --set-aside only


def set_aside_name(fingerprint: Fingerprint) -> str:
    """The file a result computed on data `fingerprint` is moved to when the data changed (named by it)."""
    ident = fingerprint.content or hashlib.sha256(repr(fingerprint.identity()).encode()).hexdigest()[:16]
    return SET_ASIDE.format(re.sub(r"[^0-9A-Za-z_.-]", "_", ident)[:64])


def unused_path(path: Path) -> Path:
    """`path`, or `<stem>.2<suffix>`, `<stem>.3<suffix>`, ...: the first name no file holds (a file set aside is
    never replaced by a later one of the same name)."""
    n, free = 1, path
    while free.exists():
        n += 1
        free = path.with_name(f"{path.stem}.{n}{path.suffix}")
    return free


def set_aside_copies(job_dir: Path, name: str) -> list[Path]:
    """The files set aside in `job_dir` under `name` (see `unused_path`), newest first."""
    stem, suffix = Path(name).stem, Path(name).suffix
    found = [p for p in job_dir.glob(f"{glob.escape(stem)}*{suffix}")
             if p.name == name or re.fullmatch(re.escape(stem) + r"\.\d+" + re.escape(suffix), p.name)]
    return sorted(found, key=lambda p: p.stat().st_mtime_ns, reverse=True)


class ConfigMismatchError(UserError, RuntimeError):
    """A job directory already holds a result of a different configuration."""


class NewerResultError(UserError, RuntimeError):
    """A job directory holds a result written by newer code (a schema this code cannot read)."""


def read_result(path: Path, spec: TaskSpec | None, refuse_newer: bool = False) -> Result | None:
    """The stored result (of task `spec`'s class), or None when absent or malformed (warned about: recomputed).
    `refuse_newer` (a job about to write there, without force=true): a result of a newer schema raises
    NewerResultError (one line) instead, so an older checkout never replaces a newer one's result."""
    try:
        done = read(path, spec)
    except NewerSchemaError as err:
        if refuse_newer:
            who = "newer code" if "newer" in str(err) else "code that is not this one"
            raise NewerResultError(f"{path} was written by {who} ({err}): run this job with that code, or "
                                   "pass force=true to replace it") from err
        log.warning("ignoring %s (%s); read it with the code that wrote it", path, err)
        return None
    except MalformedResultError as err:
        log.warning("ignoring malformed %s (%s); recomputing it", path, err)
        return None
    if done is not None and not done.config_hash:
        log.warning("ignoring malformed %s (no config hash: keys %s); recomputing it", path,
                    sorted(encode(done))[:6])
        return None
    return done


def stored_hash(done: Result, spec: TaskSpec) -> str | None:
    """A stored result's config hash recomputed with today's definition of the hash, under the numerics version it
    was computed with; None for a result of another task than `spec` (its hash is another job's)."""
    if done.config is None or done.task != spec.name or done.config.get("task", "mdl") != spec.name:
        return None
    ran_on = {"device": done.device} if done.device else {}  # where a precision's numbers were made (tf32: CUDA)
    return config_hash({**done.config, **ran_on}, spec, numerics=done.numerics_version)


def same_config(done: Result, cfg_hash: str, spec: TaskSpec) -> bool:
    """Whether `done` is a result of the job of task `spec` hashed `cfg_hash`: the stored hash, or (when it
    predates a change of what the hash covers) the stored config rehashed."""
    return done.config_hash == cfg_hash or stored_hash(done, spec) == cfg_hash


def mismatch_message(job_dir: Path, stored: object, cfg_hash: str) -> str:
    return (f"{job_dir} already holds a result of another configuration (hash {stored}, this job {cfg_hash}): "
            "pass force=true to replace it, or choose another paths.out_dir")


@dataclass
class JobDir:
    """One job's directory, seen by the job that writes it (see the module docstring)."""

    path: Path
    cfg_hash: str
    spec: TaskSpec  # the job's task: how a stored result is read and rehashed
    force: bool = False
    found: str | None = None  # hash of the result present when the job started: force=true replaces that one only

    @contextmanager
    def locked(self) -> Iterator[JobDir]:
        """Hold the directory's lock for the whole job: a second job with the same directory waits (logging that
        it waits, on what and since when), then skips or refuses according to what the first one left."""
        with ExitStack() as stack:
            try:
                self.path.mkdir(parents=True, exist_ok=True)
                stack.enter_context(waiting_lock(self.path / LOCK_FILE,
                                                 f"job directory {self.path} (another job with it is running)"))
                if self.force:  # it replaces what is there: a directory this process cannot write is refused now
                    tempfile.TemporaryFile(dir=self.path).close()
            except OSError as err:  # a read-only directory (an archive): its finished result is still a SKIP
                if err.errno not in READ_ONLY or self.force or not (self.path / RESULT_FILE).is_file():
                    raise
                log.info("%s cannot be written (%s): reading its result without the job lock", self.path,
                         err.strerror)
            yield self

    def finished(self, stale: Callable[[Result], Stale | None] | None = None) -> Result | None:
        """The stored result when this job already finished (logs SKIP), else None; refuses another config's
        result unless force=true. force=true also recomputes a finished job of this configuration, and so does a
        result that `stale` gives a reason not to reuse (incomplete, computed on other data): one line says why."""
        done = read_result(self.path / RESULT_FILE, self.spec, refuse_newer=not self.force)
        if done is None:
            return None
        self.found = done.config_hash
        if same_config(done, self.cfg_hash, self.spec):
            why = stale(done) if stale is not None and not self.force else None
            if why is not None:
                kept = ""
                if why.keep_as is not None:  # a finished measurement of other data: never destroyed
                    os.replace(self.path / RESULT_FILE, aside := unused_path(self.path / why.keep_as))
                    kept = f" (kept as {aside.name})"
                if why.restore is not None and (back := self._restore(why.restore, stale)) is not None:
                    log.warning("not reusing the result of %s: %s%s; restored %s, its result on the data now read",
                                self.path, why.reason, kept, back[1])
                    return back[0]
                log.warning("not reusing %s: %s; running the job again%s", self.path / RESULT_FILE, why.reason, kept)
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

    def _restore(self, name: str, stale: Callable[[Result], Stale | None] | None) -> tuple[Result, str] | None:
        """A result of this configuration set aside under `name` (computed on the data now read) that `stale` finds
        nothing against, moved back to result.json, and the name it had; None when there is none."""
        for path in set_aside_copies(self.path, name):
            done = read_result(path, self.spec)
            if done is not None and same_config(done, self.cfg_hash, self.spec) and (stale is None or
                                                                                     stale(done) is None):
                os.replace(path, self.path / RESULT_FILE)
                return done, path.name
        return None

    def looks_finished(self) -> bool:
        """Whether the directory holds a result of this configuration (read without the lock; without force=true).
        A result of a newer schema is refused here already (NewerResultError), before anything is loaded."""
        done = None if self.force else read_result(self.path / RESULT_FILE, self.spec, refuse_newer=True)
        return done is not None and same_config(done, self.cfg_hash, self.spec)

    def write_result(self, result: Result) -> Path:
        """Write result.json (atomically, through the codec: `encode`) after re-checking what is there: a result
        of another configuration that appeared while this job ran (a process that ignored the lock) is never
        overwritten; this job's result then goes to `result.<hash>.json` and the job fails with one line."""
        path = self.path / RESULT_FILE
        aside = unused_path(self.path / f"result.{self.cfg_hash}.json")
        try:
            done = read_result(path, self.spec, refuse_newer=not self.force)
        except NewerResultError as err:  # written by newer code while this job ran: kept, this one's set aside
            atomic_write_json(aside, encode(result))
            raise NewerResultError(f"{err}; this job's result is in {aside}") from err
        if done is not None and not same_config(done, self.cfg_hash, self.spec) and not (self.force and
                                                                               done.config_hash == self.found):
            atomic_write_json(aside, encode(result))
            raise ConfigMismatchError(
                f"{path} was written by another configuration (hash {done.config_hash}) while this job "
                f"({self.cfg_hash}) ran: not overwritten, this job's result is in {aside}; give the two "
                "configurations different directories (paths.out_dir)")
        atomic_write_json(path, encode(result))
        return path

