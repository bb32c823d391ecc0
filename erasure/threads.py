"""Erasure's float64 linear algebra on one CPU thread, so its results do not depend on the core count.

A BLAS/LAPACK reduction split over threads adds its partial sums in a thread-dependent order: LEACE fits on 1 and 2
threads differed by ~1e-17 in the erased data, QLEACE ones by up to 0.44 (digits) and 0.80 (MNIST-5k), where the
round-off moved a singular value across a rank threshold and the coupling noise changed. Fits, maps and
certificates therefore run under `one_thread()`, at the cost of the fit's CPU parallelism; a fit on a GPU is
unaffected (CUDA kernels are not split by `torch.set_num_threads`).

Re-entrant, and per thread: torch's thread count (OpenMP's) belongs to the calling thread, so each thread sets and
restores its own; erasers called from the training's worker threads leave each thread's count as it was.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import ParamSpec, TypeVar

import torch

_state = threading.local()  # depth (nesting) and saved (the count to restore) of this thread

P = ParamSpec("P")
R = TypeVar("R")


@contextmanager
def one_thread() -> Iterator[None]:
    """torch's intra-op CPU threads set to 1 inside the block, restored after it (see the module docstring)."""
    depth = getattr(_state, "depth", 0)
    if depth == 0:
        _state.saved = torch.get_num_threads()
        if _state.saved != 1:
            torch.set_num_threads(1)
    _state.depth = depth + 1
    try:
        yield
    finally:
        _state.depth -= 1
        if _state.depth == 0 and _state.saved != 1:
            torch.set_num_threads(_state.saved)


def single_threaded(fn: Callable[P, R]) -> Callable[P, R]:
    """`fn` run under `one_thread()`."""

    @functools.wraps(fn)
    def wrapper(*args: P.args, **kwargs: P.kwargs) -> R:
        with one_thread():
            return fn(*args, **kwargs)

    return wrapper
