"""The pack a job runs in (`hydra/launcher=packed`): the seeds of the pack's jobs in the order they run, and what an
earlier job of the pack computed for a later one (`ahead`, keyed by the later job's config hash and a name: the
block models of a pack group, training/mdl/pack_group.py).

The packed launcher enters `packed(seeds)` around its jobs; outside it `current()` is None and every job runs
exactly as it runs alone. What a later job finds in `ahead` it checks before it uses it, so a wrong guess costs
time, never numbers. Whatever is left in `ahead` when the pack ends was computed for nothing: one line says so.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)


@dataclass
class Pack:
    seeds: tuple[int, ...]  # the pack's jobs, in the order they run
    ahead: dict[tuple[str, str], Any] = field(default_factory=dict)  # (config hash, name) -> computed for that job
    job_dirs: dict[int, str] = field(default_factory=dict)  # seed -> its job's directory, where the launcher knows it

    def same_cell(self, seed: int, job_dir: str) -> bool:
        """Whether the pack's job of `seed` is the job whose directory is `job_dir` (False where a key follows the
        seed, e.g. dataset.data_seed=${seed}: that job is another configuration, in another cell); True where the
        launcher did not say."""
        return self.job_dirs.get(seed, job_dir) == job_dir

    def later(self, seed: int) -> tuple[int, ...]:
        """The seeds of the pack's jobs that run after the job of `seed` (none for a seed not in the pack)."""
        return self.seeds[self.seeds.index(seed) + 1:] if seed in self.seeds else ()

    def take(self, cfg_hash: str, name: str) -> Any | None:
        """What an earlier job computed for the job `cfg_hash` under `name` (removed: it is used once), or None."""
        return self.ahead.pop((cfg_hash, name), None)


_stack: list[Pack] = []


def current() -> Pack | None:
    """The pack this process is running, or None (a lone job)."""
    return _stack[-1] if _stack else None


@contextmanager
def packed(seeds: Sequence[int], job_dirs: dict[int, str] | None = None) -> Iterator[Pack]:
    """Jobs run inside this block form one pack, in the order of `seeds` (`job_dirs`: seed -> its job's directory)."""
    pack = Pack(tuple(int(s) for s in seeds), job_dirs=dict(job_dirs or {}))
    _stack.append(pack)
    try:
        yield pack
    finally:
        _stack.pop()
        if pack.ahead:
            log.warning("%d result(s) computed ahead for later jobs of this pack were not used (a job failed, was "
                        "already done, or its data differed)", len(pack.ahead))
