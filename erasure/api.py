"""Library entry points: fit an eraser by name, or erase a dataset in one call (what training uses)."""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor

from .alf_qleace import fit_alf_qleace
from .base import Eraser
from .control import fit_control
from .gradient import DEFAULTS as GRADIENT_DEFAULTS
from .gradient import erase_dataset
from .leace import fit_leace
from .qleace import fit_qleace
from .random_projection import fit_random

FITTERS: dict[str, Callable[..., Eraser]] = {
    "control": fit_control, "leace": fit_leace, "qleace": fit_qleace, "alf_qleace": fit_alf_qleace,
    "random": fit_random,
}
NAMES: tuple[str, ...] = (*FITTERS, "gradient")


def default_options(name: str) -> dict[str, Any]:
    """Every option of eraser `name` with its default (what conf/eraser/<name>.yaml lists)."""
    if name == "gradient":
        return dict(GRADIENT_DEFAULTS)
    params = inspect.signature(_fitter(name)).parameters.values()
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY and p.name != "rank_hint"}


def resolve_options(name: str, options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Every option of `name` with `options` applied over the defaults (a canonical cache-key part):
    `{}` and the full default dict resolve to the same thing. Unknown options raise TypeError."""
    opts = dict(options or {})
    _check_options(name, opts)
    return {**default_options(name), **opts}


def _fitter(name: str) -> Callable[..., Eraser]:
    if name == "gradient":
        raise ValueError("'gradient' edits a dataset and has no reusable eraser: use erasure.erase('gradient', "
                         "x, y, options) or erasure.gradient.erase_dataset(x, y)")
    if name not in FITTERS:
        raise ValueError(f"unknown eraser {name!r}; choose one of {list(NAMES)}")
    return FITTERS[name]


def _check_options(name: str, options: Mapping[str, Any], extra: tuple[str, ...] = ()) -> None:
    unknown = set(options) - set(default_options(name)) - set(extra)
    if unknown:
        raise TypeError(f"{name}: unknown options {sorted(unknown)}; known: {sorted(default_options(name))}")


def fit(name: str, x: Tensor | np.ndarray, y: Tensor | np.ndarray, **options: Any) -> Eraser:
    """Fit eraser `name` (control, leace, qleace, alf_qleace, random) on x (n, d) or (n, C, H, W) and y."""
    fitter = _fitter(name)
    _check_options(name, options, ("rank_hint",) if name == "random" else ())
    return fitter(x, y, **options)


def erase(name: str, x: Tensor | np.ndarray, y: Tensor | np.ndarray, options: Mapping[str, Any] | None = None,
          rank_hint: int | None = None) -> tuple[Tensor, dict[str, Any]]:
    """Erased copy of x (same shape and dtype) and the report, for any of NAMES (including gradient).

    rank_hint: for `random` without an explicit `rank`, the rank to remove (the ALF-QLEACE rank).
    """
    opts = dict(options or {})
    t0 = time.perf_counter()
    if name == "gradient":
        _check_options(name, opts)
        out, report = erase_dataset(x, y, return_report=True, **opts)
    else:
        if name == "random":
            opts["rank_hint"] = rank_hint
        eraser = fit(name, x, y, **opts)
        xt = torch.as_tensor(x)
        out = eraser(xt, y) if eraser.needs_labels else eraser(xt)
        report = eraser.report()
    report["seconds"] = time.perf_counter() - t0
    return out, report
