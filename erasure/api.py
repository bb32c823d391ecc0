"""Library entry points: fit an eraser by name, or erase a dataset in one call (what training uses)."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .base import Eraser
from .registry import ERASERS
from .threads import one_thread
from .traits import eraser_traits

NAMES: tuple[str, ...] = tuple(ERASERS.names())


def default_options(name: str) -> dict[str, Any]:
    """Every option of eraser `name` with its default (what conf/eraser/<name>.yaml lists): its options dataclass
    (erasure/traits.py)."""
    return eraser_traits(name).defaults()


def resolve_options(name: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every option of `name` with `options` applied over the defaults (a canonical cache-key part):
    `{}` and the full default dict resolve to the same thing. Unknown options raise TypeError."""
    opts = dict(options or {})
    _check_options(name, opts)
    return {**default_options(name), **opts}


def data_options(name: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`resolve_options` without the options that do not change the erased data (the entry's
    `runtime_options`, e.g. a progress bar or the device): what the cache key and the job hash see."""
    runtime = eraser_traits(name).runtime_options
    return {k: v for k, v in resolve_options(name, options).items() if k not in runtime}


def _fitter(name: str) -> Callable[..., Eraser]:
    if name not in ERASERS:
        raise ValueError(f"unknown eraser {name!r}; choose one of {list(NAMES)}")
    if not eraser_traits(name).has_map:
        raise ValueError(f"{name!r} edits a dataset and has no reusable eraser: use erasure.erase({name!r}, x, y, "
                         "options)")
    return ERASERS.get(name)


def _takes_rank_hint(name: str) -> bool:
    return "rank_hint" in inspect.signature(ERASERS.get(name)).parameters


def _check_options(name: str, options: Mapping[str, Any], extra: tuple[str, ...] = ()) -> None:
    unknown = set(options) - set(default_options(name)) - set(extra)
    if unknown:
        raise TypeError(f"{name}: unknown options {sorted(unknown)}; known: {sorted(default_options(name))}")


def fit(name: str, x: Tensor | np.ndarray, y: Tensor | np.ndarray, **options: Any) -> Eraser:
    """Fit eraser `name` (control, leace, qleace, alf_qleace, random) on x (n, d) or (n, C, H, W) and y."""
    fitter = _fitter(name)
    _check_options(name, options, ("rank_hint",) if _takes_rank_hint(name) else ())
    with one_thread():
        return fitter(x, y, **options)


def erase(name: str, x: Tensor | np.ndarray, y: Tensor | np.ndarray, options: Mapping[str, Any] | None = None,
          rank_hint: int | None = None) -> tuple[Tensor, dict[str, Any]]:
    """Erased copy of x (same shape and dtype) and the report, for any of NAMES (including gradient).

    rank_hint: for an eraser that takes one (`random`) without an explicit `rank`, the rank to remove (the
    ALF-QLEACE rank).
    """
    opts = dict(options or {})
    t0 = time.perf_counter()
    if name in ERASERS and not eraser_traits(name).has_map:
        _check_options(name, opts)
        with one_thread():
            out, report = ERASERS.get(name)(x, y, return_report=True, **opts)
    else:
        if name in ERASERS and _takes_rank_hint(name):
            opts["rank_hint"] = rank_hint
        eraser = fit(name, x, y, **opts)
        xt = torch.as_tensor(x)
        out = eraser.apply_in_sample(xt, y) if eraser.needs_labels else eraser(xt)  # fitted on these very rows
        report = eraser.report()
    report["seconds"] = time.perf_counter() - t0
    return out, report
