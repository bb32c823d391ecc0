"""What the jobs one process runs one after another (a pack: `hydra/launcher=packed`) share: a `Pack`, which the
packed launcher creates for its jobs (`packed(...)`) and hands to each job's run; a lone job gets none and shares
nothing. Its lifetime is the launcher's `with packed(...)` block: the memos are emptied and what was computed ahead
for nothing is reported when it ends. Nothing here is a module-level registry (tests/test_no_global_state.py).

It holds:
- the loaded datasets (`datasets`, read by `load_dataset`), the erased data (`erased`, by the erased-data cache,
  training/data/cache.py) and the fitted erasers (`erasers`, `eraser.after_augment`'s, by the fitted-eraser cache),
  each in a small bounded memo keyed by what identifies it (the dataset's config and data directory; the cache
  entry's hash: the data's content, the fit rows, the eraser and its options). A job gets the same tensors, but its
  own LoadedData (eraser object) and its own copies of every dict, so rebinding fields or editing `info` never
  reaches another job. Tensors are not copied (that is the saving), so a job that modified one in place would hand
  the next job other numbers: every entry remembers its tensors' version counters, and an entry whose tensor changed
  since is dropped (with a warning) and computed again, as a lone job would. The numbers therefore never depend on
  which jobs shared a process.
- the pack's seeds in the order they run and what an earlier job of the pack computed for a later one (`ahead`,
  keyed by the later job's config hash and a name: the block models of a pack group, training/tasks/mdl/pack_group.py).
  What a later job finds in `ahead` it checks before it uses it, so a wrong guess costs time, never numbers.
"""

from __future__ import annotations

import copy
import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, TypeVar

from torch import Tensor

log = logging.getLogger(__name__)
# per kind: a pack's jobs (seeds of one cell) share one dataset (two with eraser.fit_source=pool) and one erased
# entry (two for a rank-matched baseline: ALF-QLEACE's too); older entries are dropped, so what the memo keeps beyond
# the running job's own data is at most about one more copy of it
MAX_ENTRIES = 2
T = TypeVar("T")


class Memo:
    """A bounded least-recently-used memo of values holding tensors, refusing those modified in place since."""

    def __init__(self, kind: str, max_entries: int = MAX_ENTRIES) -> None:
        self.kind = kind
        self.max_entries = max_entries
        self._entries: OrderedDict[Hashable, tuple[Any, list[tuple[Tensor, int]]]] = OrderedDict()
        self.hits = 0

    def get(self, key: Hashable) -> Any | None:
        found = self._entries.get(key)
        if found is None:
            return None
        value, stamps = found
        if any(t._version != v for t, v in stamps):
            log.warning("shared %s %s was modified in place by a job: dropped, computed again", self.kind, key)
            del self._entries[key]
            return None
        self._entries.move_to_end(key)
        self.hits += 1
        return value

    def put(self, key: Hashable, value: Any, tensors: list[Tensor]) -> None:
        self._entries[key] = (value, [(t, t._version) for t in tensors])
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)

    def clear(self) -> None:
        self._entries.clear()
        self.hits = 0


@dataclass
class Pack:
    """What the jobs of one pack share (see the module docstring); the packed launcher makes one per pack."""

    seeds: tuple[int, ...] = ()  # the pack's jobs, in the order they run
    ahead: dict[tuple[str, str], Any] = field(default_factory=dict)  # (config hash, name) -> computed for that job
    job_dirs: dict[int, str] = field(default_factory=dict)  # seed -> its job's directory, where the launcher knows it
    datasets: Memo = field(default_factory=lambda: Memo("dataset"))
    erased: Memo = field(default_factory=lambda: Memo("erased data"))
    erasers: Memo = field(default_factory=lambda: Memo("fitted eraser"))

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


@contextmanager
def packed(seeds: Sequence[int] = (), job_dirs: dict[int, str] | None = None, share: Pack | None = None
           ) -> Iterator[Pack]:
    """A pack for the jobs run inside this block, in the order of `seeds` (`job_dirs`: seed -> its job's directory);
    its memos are emptied when the block ends, and results computed ahead that no job took are reported. `share`: a
    bucket's pack (hydra.launcher.pack_by=shape), whose memos this one uses (the bucket's block empties them)."""
    pack = Pack(tuple(int(s) for s in seeds), job_dirs=dict(job_dirs or {}))
    if share is not None:
        pack.datasets, pack.erased, pack.erasers = share.datasets, share.erased, share.erasers
    try:
        yield pack
    finally:
        if share is None:
            pack.datasets.clear()
            pack.erased.clear()
            pack.erasers.clear()
        if pack.ahead:
            log.warning("%d result(s) computed ahead for later jobs of this pack were not used (a job failed, was "
                        "already done, or its data differed)", len(pack.ahead))


def remembered(memo: Memo | None, key: Hashable, make: Callable[[], T], tensors: Callable[[T], list[Tensor]],
               own_copy: Callable[[T], T]) -> T:
    """`make()` once per `key` in `memo` (every call's result is `own_copy` of the shared one); just `make()` without
    a memo (a lone job)."""
    if memo is None:
        return make()
    found = memo.get(key)
    if found is None:
        found = make()
        memo.put(key, found, tensors(found))
    return own_copy(found)


def fresh(value: T) -> T:
    """A deep copy of plain data (dicts, lists, numbers), for the parts of a shared value a job may edit."""
    return copy.deepcopy(value)
