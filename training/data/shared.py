"""The in-process memo of what the seeds of a cell share (the store's, training/inputs/store.py): loaded datasets,
erased data and fitted erasers, each in a small bounded `Memo` keyed by what identifies it. Nothing here is a
module-level registry (tests/test_no_global_state.py).

A job gets the same tensors, but its own LoadedData (eraser object) and its own copies of every dict. Tensors are not
copied (that is the saving): every entry remembers its tensors' version counters, and an entry whose tensor a job
modified in place is dropped (with a warning) and computed again, as a lone job would: the numbers never depend on
which jobs shared a process.
"""

from __future__ import annotations

import copy
import logging
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from torch import Tensor

log = logging.getLogger(__name__)
# per kind: a cell's seeds share one dataset (two with eraser.fit_source=pool) and one erased
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


def remembered(memo: Memo | None, key: Hashable, make: Callable[[], T], tensors: Callable[[T], list[Tensor]],
               own_copy: Callable[[T], T]) -> T:
    """`make()` once per `key` in `memo` (every call's result is `own_copy` of the shared one); just `make()` without
    a memo."""
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
