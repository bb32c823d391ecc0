"""Apply the configured eraser to a dataset through the erased-data cache, with certificates."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from erasure import resolve_options
from erasure.leace import HOLDOUT_RTOL
from erasure.progress import use as erasure_progress
from erasure.qleace import label_injection_risk
from erasure.registry import ERASERS
from training.common.files import atomic_write_json, read_json
from training.common.progress import progress_bar
from training.data import LoadedData

log = logging.getLogger(__name__)


class EraserCfg(Protocol):
    """The typed `eraser` config group (training/app/schema.py EraserConfig): its name and fitter options."""

    name: str
    options: Mapping[str, Any]


def _cache_key(data: LoadedData, name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Dataset identity + eraser + the options that change the erased data, defaults filled in (so `{}` and the
    yaml's defaults agree, and a progress bar or the device never forces a refit)."""
    from erasure import data_options

    return {"dataset": data.name, "content": data.content_hash(), "eraser": name,
            "options": data_options(name, dict(options))}


def _erase_cached(data: LoadedData, name: str, options: Mapping[str, Any], cache_dir: Path,
                  rank_hint: int | None = None) -> tuple[torch.Tensor, dict[str, Any], bool]:
    from erasure import erase
    from training.data.cache import cached_erase

    flat = data.x.reshape(len(data.x), -1)

    def build() -> tuple[torch.Tensor, dict[str, Any]]:
        log.info("fitting eraser %s on %s (%d x %d)", name, data.name, *flat.shape)
        with erasure_progress(progress_bar):  # a long fit (gradient) shows the harness's bar / log lines
            return erase(name, flat, data.y, dict(options), rank_hint=rank_hint)

    x, report, hit = cached_erase(cache_dir, _cache_key(data, name, options), build)
    return x.reshape(data.x.shape), report, hit


@dataclass(frozen=True)
class Holdout:
    """`eraser.fit_on=holdout`: the eraser is fitted on `fit_idx` and applied to `coded_idx` (disjoint)."""

    fit_idx: Tensor
    coded_idx: Tensor
    fold: int
    folds: int


# Out of sample, LEACE treats near-null directions of the fit sample as null (erasure/leace.py HOLDOUT_RTOL), so
# held-out rows are not blown up along directions the fit never saw; an explicit option wins.
HOLDOUT_OPTIONS = {"leace": {"rtol": HOLDOUT_RTOL}, "alf_qleace": {"leace_rtol": HOLDOUT_RTOL}}


def holdout_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    resolved = dict(options)
    for key, value in HOLDOUT_OPTIONS.get(name, {}).items():
        if resolved.get(key) is None:
            resolved[key] = value
    return resolved


def _erase_holdout(fit: LoadedData, coded: LoadedData, name: str, options: Mapping[str, Any], cache_dir: Path,
                   rank_hint: int | None) -> tuple[torch.Tensor, dict[str, Any], bool]:
    """Fit on `fit`, apply to `coded`, through the cache (keyed by both)."""
    from erasure import fit as fit_eraser
    from training.data.cache import cached_erase

    def build() -> tuple[torch.Tensor, dict[str, Any]]:
        log.info("fitting eraser %s on %d held-out samples of %s, applying it to the other %d", name, len(fit.y),
                 fit.name, len(coded.y))
        t0 = time.perf_counter()
        extra = {"rank_hint": rank_hint} if rank_hint is not None else {}
        eraser = fit_eraser(name, fit.x.reshape(len(fit.x), -1), fit.y, **options, **extra)
        flat = coded.x.reshape(len(coded.x), -1)
        out = eraser(flat, coded.y) if eraser.needs_labels else eraser(flat)
        return out, {**eraser.report(), "seconds": time.perf_counter() - t0}

    key = {**_cache_key(coded, name, options), "fitted_on": fit.content_hash()}
    x, report, hit = cached_erase(cache_dir, key, build)
    return x.reshape(coded.x.shape), report, hit


def alf_rank(data: LoadedData, cache_dir: Path) -> int | None:
    """The rank ALF-QLEACE (default options) removes on this dataset, fitting it through the cache if needed."""
    _, report, _ = _erase_cached(data, "alf_qleace", {}, cache_dir)
    rank = report.get("rank_removed")
    return int(rank) if rank is not None else None


def certify(x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    from erasure import certificate

    return certificate(x.reshape(len(x), -1), y)


def certify_original(data: LoadedData, cache_dir: Path) -> dict[str, Any]:
    """Certificate of the unerased data, cached per dataset content (every eraser's job needs it)."""
    from training.data.cache import code_version, unreadable_line

    path = cache_dir / "certificates" / f"{data.name}-{data.content_hash()}-{code_version()[:12]}.json"
    try:
        cached = read_json(path)
    except OSError as err:  # another user's file in a shared directory: not corrupt, not ours to replace
        log.warning("%s", unreadable_line(path, err, "cached certificate", "computing it again"))
        return certify(data.x, data.y)
    if cached is not None:
        return cached
    cert = certify(data.x, data.y)
    try:
        atomic_write_json(path, cert)
    except OSError as err:  # a cache: not worth losing the job over
        log.warning("could not cache the certificate in %s (%s); going on", path, err)
    return cert


def apply_eraser(data: LoadedData, eraser_cfg: EraserCfg, cache_dir: Path, with_certificate: bool = True,
                 holdout: Holdout | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """Erased images and an info dict: report, cache hit, how it was fitted, certificate before/after, seconds.
    With `holdout`, the eraser is fitted on `holdout.fit_idx` and the erased images are those of
    `holdout.coded_idx` (the samples the code then sees), in that order."""
    name, options = eraser_cfg.name, dict(eraser_cfg.options)
    t0 = time.perf_counter()
    fit, coded = (data, data) if holdout is None else (data.subset(holdout.fit_idx), data.subset(holdout.coded_idx))
    if holdout is not None:
        options = holdout_options(name, options)
    info: dict[str, Any] = {"name": name, "options": options, "fit": _fit_info(fit, coded, holdout)}
    identity = ERASERS.meta(name)["family"] == "control"
    if identity:
        x, info["report"], info["cache_hit"] = coded.x, {"rank_removed": 0}, None
    else:
        rank_hint = None
        resolved = resolve_options(name, options)
        if "rank" in resolved and resolved["rank"] is None:  # a rank-matched baseline: ALF-QLEACE's rank
            rank_hint = alf_rank(fit, cache_dir)
        if holdout is None:
            x, info["report"], info["cache_hit"] = _erase_cached(data, name, options, cache_dir, rank_hint)
        else:
            _warn_label_injection(name, fit)
            x, info["report"], info["cache_hit"] = _erase_holdout(fit, coded, name, options, cache_dir, rank_hint)
        log.info("eraser %s: %s", name, "cache hit" if info["cache_hit"] else "fitted and cached")
    info["seconds"] = time.perf_counter() - t0
    if with_certificate:
        before = certify_original(coded, cache_dir)
        after = before if identity else certify(x, coded.y)
        info["certificate"] = {"before": before, "after": after}
    return x, info


def _fit_info(fit: LoadedData, coded: LoadedData, holdout: Holdout | None) -> dict[str, Any]:
    out: dict[str, Any] = {"fit_on": "all" if holdout is None else "holdout", "n_fit": len(fit.y),
                           "n_coded": len(coded.y)}
    if holdout is not None:
        out.update(fold=holdout.fold, folds=holdout.folds)
    return out


def _warn_label_injection(name: str, fit: LoadedData) -> None:
    """QLEACE's class maps estimated from few samples inject the label into held-out data: one warning line."""
    if name != "qleace":
        return
    counts = torch.bincount(fit.y, minlength=fit.num_classes)
    line = label_injection_risk(counts, int(fit.x[0].numel()))
    if line is not None:
        log.warning("%s", line)
