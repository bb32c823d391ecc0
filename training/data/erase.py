"""Apply the configured eraser to a dataset through the erased-data cache, with certificates."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

from erasure import resolve_options
from erasure.progress import use as erasure_progress
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


def apply_eraser(data: LoadedData, eraser_cfg: EraserCfg, cache_dir: Path,
                 with_certificate: bool = True) -> tuple[torch.Tensor, dict[str, Any]]:
    """Erased images (same shape) and an info dict: report, cache hit, certificate before/after, seconds."""
    name, options = eraser_cfg.name, dict(eraser_cfg.options)
    t0 = time.perf_counter()
    info: dict[str, Any] = {"name": name, "options": options}
    identity = ERASERS.meta(name)["family"] == "control"
    if identity:
        x, info["report"], info["cache_hit"] = data.x, {"rank_removed": 0}, None
    else:
        rank_hint = None
        resolved = resolve_options(name, options)
        if "rank" in resolved and resolved["rank"] is None:  # a rank-matched baseline: ALF-QLEACE's rank
            rank_hint = alf_rank(data, cache_dir)
        x, info["report"], info["cache_hit"] = _erase_cached(data, name, options, cache_dir, rank_hint)
        log.info("eraser %s: %s", name, "cache hit" if info["cache_hit"] else "fitted and cached")
    info["seconds"] = time.perf_counter() - t0
    if with_certificate:
        before = certify_original(data, cache_dir)
        after = before if identity else certify(x, data.y)
        info["certificate"] = {"before": before, "after": after}
    return x, info
