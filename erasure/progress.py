"""Progress of a long fit (gradient erasure's L-BFGS, class by class), shown however the caller chooses.

The library draws nothing itself (it imports only torch, numpy and the standard library): `progress_bar` gives a
silent bar unless a caller installed a factory, for the duration of a block:

    from tqdm.auto import tqdm
    with erasure.progress.use(tqdm):
        erasure.erase("gradient", x, y)

A factory takes tqdm's keywords (total, desc, unit, leave) and returns an object with `update(n)`, `set_postfix(...)`
and `close()`; tqdm itself is one. The harness installs its own (training/common/progress.py: a bar on a terminal,
periodic log lines in a log file).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

Factory = Callable[..., Any]

_lock = threading.Lock()
_factory: Factory | None = None


class _Off:
    def update(self, n: int = 1) -> None: ...
    def set_postfix(self, **kwargs: Any) -> None: ...
    def close(self) -> None: ...


@contextmanager
def use(factory: Factory | None) -> Iterator[None]:
    """Inside the block, `progress_bar` draws with `factory` (None: nothing); the previous one is back after it."""
    global _factory
    with _lock:
        previous, _factory = _factory, factory
    try:
        yield
    finally:
        with _lock:
            _factory = previous


def progress_bar(total: int | None = None, desc: str = "", unit: str = "it", leave: bool = False,
                 disable: bool = False) -> Any:
    """A bar from the installed factory; a silent one when none is installed or `disable`."""
    factory = _factory
    return _Off() if disable or factory is None else factory(total=total, desc=desc, unit=unit, leave=leave)
