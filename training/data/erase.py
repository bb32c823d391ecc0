"""Apply the configured eraser to a dataset through the erased-data cache, with certificates."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

import torch
from torch import Tensor

from erasure import Eraser, data_options, eraser_traits, resolve_options
from erasure.progress import use as erasure_progress
from erasure.qleace import QleaceEraser, label_injection_risk
from erasure.streaming import fit_chunks
from training.common.files import atomic_write_json, read_json
from training.common.progress import progress_bar
from training.data.cache import cached_erase, cached_eraser, code_version, key_hash, unreadable_line
from training.data.registry import LoadedData
from training.data.shared import Memo
from training.engine.batches import ClassSegments
from training.engine.seeding import generator
from training.errors import NonFiniteError, UserError

log = logging.getLogger(__name__)


class EraserCfg(Protocol):
    """The typed `eraser` config group (training/app/schema.py EraserConfig): its name and fitter options."""

    @property
    def name(self) -> str: ...
    @property
    def options(self) -> Mapping[str, Any]: ...


def _cache_key(data: LoadedData, name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Dataset identity + eraser + the options that change the erased data, defaults filled in (so `{}` and the
    yaml's defaults agree, and a progress bar or the device never forces a refit)."""
    return {"dataset": data.name, "content": data.content_hash(), "eraser": name,
            "options": data_options(name, dict(options))}


def _finite(build: Callable[[], tuple[Tensor, dict[str, Any]]], name: str, dataset: str
            ) -> Callable[[], tuple[Tensor, dict[str, Any]]]:
    """`build`, refusing erased data with NaN/Inf: never cached, never trained on."""
    def checked() -> tuple[Tensor, dict[str, Any]]:
        x, report = build()
        if not bool(torch.isfinite(x).all()):
            raise NonFiniteError(f"non-finite erased data: eraser {name} gave {int((~torch.isfinite(x)).sum())} "
                                 f"NaN/Inf values on {dataset}; check eraser.options and the data; nothing was "
                                 "cached or written as a result")
        return x, report
    return checked


Erased = tuple[Tensor, dict[str, Any], bool, dict[str, Any]]  # erased x, report, cache hit, the entry's key


def _erase_cached(data: LoadedData, name: str, options: Mapping[str, Any], cache_dir: Path,
                  rank_hint: int | None = None, eraser: Eraser | None = None, memo: Memo | None = None) -> Erased:
    """`data` erased by `name` fitted on it, through the cache (and `memo`, a pack's: `cached_erase`); `eraser`: that
    eraser, already fitted (a cache miss then applies it, which is what `erasure.erase` does after fitting)."""
    from erasure import erase

    flat = data.x.reshape(len(data.x), -1)

    def build() -> tuple[torch.Tensor, dict[str, Any]]:
        if eraser is not None:
            x, report = _apply_fitted(eraser, flat, data.y, in_sample=True)
        else:
            log.info("fitting eraser %s on %s (%d x %d)", name, data.name, *flat.shape)
            with erasure_progress(progress_bar):  # a long fit (gradient) shows the harness's bar / log lines
                x, report = erase(name, flat, data.y, dict(options), rank_hint=rank_hint)
        return x, report

    key = _cache_key(data, name, options)
    x, report, hit = cached_erase(cache_dir, key, _finite(build, name, data.name), memo)
    return x.reshape(data.x.shape), report, hit, key


@dataclass(frozen=True)
class OracleFit:
    """`eraser.fit_on=oracle`: fresh draws of a generator dataset, streamed in chunks (`chunks()`), `n_fit` rows in
    all; `key` identifies them (the generator's options and the row count) in the erased-data cache key."""

    chunks: Callable[[], Iterable[tuple[Tensor, Tensor]]]
    n_fit: int
    key: dict[str, Any]


@dataclass(frozen=True)
class PopulationFit:
    """`eraser.fit_on=population`: a generator dataset's exact class moments (`moments()`, erasure ClassMoments);
    `key` identifies them (the generator's options) in the erased-data cache key."""

    moments: Callable[[], Any]
    key: dict[str, Any]


@dataclass(frozen=True)
class FitPlan:
    """How the eraser is fitted when not on every coded row (`eraser.fit_on` self | holdout | oracle | population;
    None: all).

    coded_idx: the rows of the loaded data that are coded (None: all of them). holdout fits on the rows `fit_idx` of
    the loaded data (a split) or on `pool` (rows beyond dataset.limit); self fits on the coded rows, oracle on
    `oracle`'s draws, population on `population`'s exact moments (coding the rows self codes). fit_source /
    fit_fraction / repeat: as configured where the mode reads them, else None."""

    fit_on: str
    coded_idx: Tensor | None = None
    fit_idx: Tensor | None = None
    pool: LoadedData | None = None
    oracle: OracleFit | None = None
    population: PopulationFit | None = None
    fit_source: str | None = None
    fit_fraction: float | None = None
    repeat: int | None = None
    shuffle: tuple[int, int] | None = None  # eraser.fit_labels=shuffled: (seed, repeat) of the fit labels' permutation

    @property
    def in_sample(self) -> bool:
        return self.fit_on in ("self", "all")

    def labelled(self, fit: LoadedData) -> LoadedData:
        """The fit rows with the labels the eraser is fitted on: their own, or (`shuffle`) a fixed permutation of
        them (the same class counts, no relation to the rows): the coded rows keep their true labels."""
        if self.shuffle is None:
            return fit
        perm = torch.randperm(len(fit.y), generator=generator(*self.shuffle, "fit_labels"))
        return LoadedData(fit.name, fit.x, fit.y[perm].contiguous(), fit.num_classes,
                          {**fit.info, "shuffled_fit_labels": True})

    def fit_rows(self, data: LoadedData) -> LoadedData | None:
        """The rows fitted on, out of sample (holdout): a part of `data` or the pool; None for self and oracle."""
        if self.fit_idx is not None:
            return data.subset(self.fit_idx)
        return self.pool

    def mapped(self, fn: Callable[[Tensor], Tensor]) -> FitPlan:
        """This plan with `fn` applied to the pool's images (the loaded data's z-score applies to the pool too)."""
        if self.pool is None:
            return self
        p = self.pool
        return replace(self, pool=LoadedData(p.name, fn(p.x), p.y, p.num_classes, dict(p.info)))


def holdout_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` with the eraser's declared holdout options filling the unset ones (e.g. LEACE treats near-null
    directions of the fit sample as null out of sample, erasure/leace.py HOLDOUT_RTOL); an explicit option wins."""
    resolved = dict(options)
    for key, value in eraser_traits(name).holdout_options.items():
        if resolved.get(key) is None:
            resolved[key] = value
    return resolved


def _erase_holdout(fit: LoadedData, coded: LoadedData, name: str, options: Mapping[str, Any], cache_dir: Path,
                   rank_hint: int | None, eraser: Eraser | None = None, memo: Memo | None = None) -> Erased:
    """Fit on `fit`, apply to `coded`, through the cache (keyed by both); `eraser`: already fitted on `fit`."""
    from erasure import fit as fit_eraser

    def build() -> tuple[torch.Tensor, dict[str, Any]]:
        if eraser is not None:
            return _apply_fitted(eraser, coded.x.reshape(len(coded.x), -1), coded.y, in_sample=False)
        log.info("fitting eraser %s on %d held-out samples of %s, applying it to the other %d", name, len(fit.y),
                 fit.name, len(coded.y))
        t0 = time.perf_counter()
        extra = {"rank_hint": rank_hint} if rank_hint is not None else {}
        fitted = fit_eraser(name, fit.x.reshape(len(fit.x), -1), fit.y, **options, **extra)
        out, report = _apply_fitted(fitted, coded.x.reshape(len(coded.x), -1), coded.y, in_sample=False)
        return out, {**report, "seconds": time.perf_counter() - t0}  # the fit's time included

    key = {**_cache_key(coded, name, options), "fitted_on": fit.content_hash()}
    x, report, hit = cached_erase(cache_dir, key, _finite(build, name, fit.name), memo)
    return x.reshape(coded.x.shape), report, hit, key


def _erase_oracle(coded: LoadedData, oracle: OracleFit, name: str, options: Mapping[str, Any], cache_dir: Path,
                  memo: Memo | None = None) -> Erased:
    """Fit on the oracle's fresh draws from moments accumulated chunk by chunk, apply to `coded`, through the cache
    (keyed by the coded data and the draws' identity)."""
    def build() -> tuple[torch.Tensor, dict[str, Any]]:
        log.info("fitting eraser %s on %d fresh draws of %s (oracle), applying it to the %d coded rows", name,
                 oracle.n_fit, coded.name, len(coded.y))
        t0 = time.perf_counter()
        fitted = fit_chunks(name, oracle.chunks(), coded.num_classes, **options)
        out, report = _apply_fitted(fitted, coded.x.reshape(len(coded.x), -1), coded.y, in_sample=False)
        return out, {**report, "seconds": time.perf_counter() - t0}

    key = {**_cache_key(coded, name, options), "fitted_on": {"oracle": oracle.key}}
    x, report, hit = cached_erase(cache_dir, key, _finite(build, name, coded.name), memo)
    return x.reshape(coded.x.shape), report, hit, key


def _erase_population(coded: LoadedData, population: PopulationFit, name: str, options: Mapping[str, Any],
                      cache_dir: Path, memo: Memo | None = None) -> Erased:
    """Fit from the generator's exact class moments, apply to `coded`, through the cache (keyed by the coded data and
    the generator's identity)."""
    from erasure.streaming import fit_moments
    from training.data.cache import cached_erase

    def build() -> tuple[torch.Tensor, dict[str, Any]]:
        log.info("fitting eraser %s on the exact class moments of %s (population), applying it to the %d coded "
                 "rows", name, coded.name, len(coded.y))
        t0 = time.perf_counter()
        fitted = fit_moments(name, population.moments(), **options)
        out, report = _apply_fitted(fitted, coded.x.reshape(len(coded.x), -1), coded.y, in_sample=False)
        return out, {**report, "seconds": time.perf_counter() - t0}

    key = {**_cache_key(coded, name, options), "fitted_on": {"population": population.key}}
    x, report, hit = cached_erase(cache_dir, key, _finite(build, name, coded.name), memo)
    return x.reshape(coded.x.shape), report, hit, key


def _apply_fitted(eraser: Eraser, flat: Tensor, y: Tensor, in_sample: bool) -> tuple[Tensor, dict[str, Any]]:
    """`eraser` applied to (flat, y); `in_sample`: these are the rows it was fitted on (`Eraser.apply_in_sample`)."""
    t0 = time.perf_counter()
    if not eraser.needs_labels:
        out = eraser(flat)
    else:
        out = eraser.apply_in_sample(flat, y) if in_sample else eraser(flat, y)
    return out, {**eraser.report(), "seconds": time.perf_counter() - t0}


def fit_cached(fit: LoadedData, name: str, options: Mapping[str, Any], cache_dir: Path,
               rank_hint: int | None = None, memo: Memo | None = None) -> tuple[Eraser, bool]:
    """The eraser `name` fitted on `fit` (a map eraser: `eraser_traits(name).has_map`), and whether it came
    from the cache (`<cache_dir>/erasers/`, training/data/cache.py `cached_eraser`).

    Cached rather than refitted per job: a fit costs seconds on MNIST-5k but QLEACE on CIFAR-10 (d = 3072) costs
    minutes, and every seed/architecture of an `eraser.after_augment` sweep needs the same eraser. Keyed like the
    erased data (dataset content, eraser, the options that change the result) plus the rank hint: what determines the
    fit, so a pack's (bucket's) jobs of one key get one eraser from `memo` (their seeds with `fit_on=all`, other
    mdl or optim settings), fitted or loaded once."""
    from erasure import fit as fit_eraser

    def build() -> Eraser:
        log.info("fitting eraser %s on %s (%d samples)", name, fit.name, len(fit.y))
        extra = {"rank_hint": rank_hint} if rank_hint is not None else {}
        with erasure_progress(progress_bar):
            return fit_eraser(name, fit.x.reshape(len(fit.x), -1), fit.y, **options, **extra)

    key = {**_cache_key(fit, name, options), "object": "fitted eraser", "rank_hint": rank_hint}
    return cached_eraser(cache_dir, key, build, memo)


def source_rank(data: LoadedData, source: str, cache_dir: Path, memo: Memo | None = None) -> int | None:
    """The rank eraser `source` (default options; a `RankHint`'s source) removes on this dataset, fitting it through
    the cache if needed."""
    _, report, _, _ = _erase_cached(data, source, {}, cache_dir, memo=memo)
    rank = report.get("rank_removed")
    return int(rank) if rank is not None else None


def certify(x: torch.Tensor, y: torch.Tensor) -> dict[str, Any]:
    from erasure import certificate

    return certificate(x.reshape(len(x), -1), y)


def certify_original(data: LoadedData, cache_dir: Path) -> dict[str, Any]:
    """Certificate of the unerased data, cached per dataset content (every eraser's job needs it)."""
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


def certify_erased(x: Tensor, y: Tensor, key: Mapping[str, Any], cache_dir: Path) -> dict[str, Any]:
    """Certificate of erased data `x` (the erased-data cache entry of `key`) with labels `y`, cached in that entry
    as `certificate-<labels hash>.json`: every seed of a `fit_on=all` cell codes the same erased data and labels.
    Written only into a complete entry (its manifest present), so a rebuilt entry drops its old certificates; a
    corrupt or unreadable file is recomputed with one log line."""
    entry = cache_dir / "erased" / key_hash(key)
    labels = hashlib.sha256(y.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]
    path = entry / f"certificate-{labels}.json"
    try:
        cached = read_json(path)
    except OSError as err:  # another user's file in a shared directory: not corrupt, not ours to replace
        log.warning("%s", unreadable_line(path, err, "cached certificate", "computing it again"))
        return certify(x, y)
    if isinstance(cached, dict):
        return cached
    if cached is not None:  # parsed, but not a certificate
        log.warning("ignoring %s: it holds a %s, not a certificate; computing it again", path, type(cached).__name__)
    cert = certify(x, y)
    if (entry / "manifest.json").is_file():
        try:
            atomic_write_json(path, cert)
        except OSError as err:  # a cache: not worth losing the job over
            log.warning("could not cache the certificate in %s (%s); going on", path, err)
    return cert


def apply_eraser(data: LoadedData, eraser_cfg: EraserCfg, cache_dir: Path, with_certificate: bool = True,
                 plan: FitPlan | None = None, memo: Memo | None = None) -> tuple[torch.Tensor, dict[str, Any]]:
    """Erased images and an info dict: report, cache hit, how it was fitted, certificate before/after, seconds.
    With a `plan`, the eraser is fitted as it says and the erased images are those of `plan.coded_idx` (the samples
    the code then sees), in that order. `memo`: a pack's erased data (training/data/shared.py), None for a lone job."""
    x, info, _ = _apply(data, eraser_cfg, cache_dir, with_certificate, plan, keep_eraser=False, memo=memo)
    return x, info


def apply_eraser_keeping_map(data: LoadedData, eraser_cfg: EraserCfg, cache_dir: Path, with_certificate: bool = True,
                             plan: FitPlan | None = None, memo: Memo | None = None, erasers: Memo | None = None
                             ) -> tuple[torch.Tensor, dict[str, Any], Eraser | None]:
    """`apply_eraser`, and the fitted eraser too (None for the identity control, which has nothing to apply), for
    `eraser.after_augment`: the same erased images (the same cache entry), the eraser from `fit_cached`. A map
    eraser only; an eraser that edits the dataset (gradient) has no map and is refused. `erasers`: a pack's fitted
    erasers (training/data/shared.py)."""
    if not eraser_traits(eraser_cfg.name).has_map:
        raise ValueError(f"eraser {eraser_cfg.name} edits the dataset once and has no map to apply to other images")
    return _apply(data, eraser_cfg, cache_dir, with_certificate, plan, keep_eraser=True, memo=memo, erasers=erasers)


def _apply(data: LoadedData, eraser_cfg: EraserCfg, cache_dir: Path, with_certificate: bool,
           plan: FitPlan | None, keep_eraser: bool, memo: Memo | None = None, erasers: Memo | None = None
           ) -> tuple[torch.Tensor, dict[str, Any], Eraser | None]:
    name, options = eraser_cfg.name, dict(eraser_cfg.options)
    t0 = time.perf_counter()
    coded = data if plan is None or plan.coded_idx is None else data.subset(plan.coded_idx)
    in_sample = plan is None or plan.in_sample
    fit = coded if in_sample else plan.fit_rows(data) if plan is not None else None
    ranked = fit  # a rank-matched baseline's source rank: on the fit rows' own labels
    shuffled = plan is not None and plan.shuffle is not None and fit is not None
    if shuffled:  # fitted on shuffled labels, then applied like a holdout eraser to the true-label coded rows
        assert plan is not None and fit is not None
        fit = plan.labelled(fit)
        log.info("eraser %s: fitted on shuffled labels of its %d fit rows (eraser.fit_labels=shuffled)", name,
                 len(fit.y))
    if not in_sample:
        options = holdout_options(name, options)
    info: dict[str, Any] = {"name": name, "options": options, "fit": _fit_info(plan, fit, coded)}
    traits = eraser_traits(name)
    eraser, key = None, None
    if traits.identity:
        x, info["report"], info["cache_hit"] = coded.x, {"rank_removed": 0}, None
    else:
        rank_hint = None
        resolved = resolve_options(name, options)
        if traits.rank_hint is not None and traits.rank_hint.wanted(resolved):  # a rank-matched baseline
            assert ranked is not None, "the schema refuses fit_on=oracle for an eraser without a moments fit"
            rank_hint = source_rank(ranked, traits.rank_hint.source, cache_dir, memo)
        if keep_eraser:
            assert fit is not None, "the schema refuses eraser.after_augment with fit_on=oracle"
            eraser, info["eraser_cache_hit"] = fit_cached(fit, name, options, cache_dir, rank_hint, erasers)
        if in_sample and not shuffled:
            x, info["report"], info["cache_hit"], key = _erase_cached(coded, name, options, cache_dir, rank_hint,
                                                                      eraser, memo)
        elif plan is not None and plan.population is not None:
            x, info["report"], info["cache_hit"], key = _erase_population(coded, plan.population, name, options,
                                                                          cache_dir, memo)
        elif plan is not None and plan.oracle is not None:
            x, info["report"], info["cache_hit"], key = _erase_oracle(coded, plan.oracle, name, options, cache_dir,
                                                                      memo)
        else:
            assert fit is not None
            _warn_label_injection(name, fit)
            x, info["report"], info["cache_hit"], key = _erase_holdout(fit, coded, name, options, cache_dir,
                                                                       rank_hint, eraser, memo)
        log.info("eraser %s: %s", name, "cache hit" if info["cache_hit"] else "fitted and cached")
    info["seconds"] = time.perf_counter() - t0
    if with_certificate:
        before = certify_original(coded, cache_dir)
        after = before if key is None else certify_erased(x, coded.y, key, cache_dir)
        info["certificate"] = {"before": before, "after": after}
    return x, info, eraser


def after_augment_refusal(of: str, singular: list[int]) -> str:
    """The one line refusing `eraser.after_augment=true` for a QLEACE coupling that adds noise."""
    return (f"eraser.after_augment=true is not allowed with qleace's rank_deficient=coupling here: classes "
            f"{singular} of {of} are singular, and the coupling noise that fills them has exact moments on whole "
            "classes, not on a batch; use eraser=qleace_paper (shrinkage, the paper code's estimator), "
            "eraser.options.rank_deficient=truncate or ridge, or eraser.after_augment=false")


class BatchEraser:
    """`eraser.after_augment`: a fitted eraser applied to each training batch (b, c, h, w) where it lies (the
    paper code's `transform(augment(x))`); the training loops call it as `batch_transform(x, y, segments)` after
    augmentation.

    The eraser's math runs in float64 on the batch's device (`to` moves its state there once) and the result comes
    back in the batch's dtype; a label-dependent eraser (QLEACE) gets the batch's labels (None: the identity
    control). `then`: a map applied to the erased batch (the z-score of `dataset.zscore_order=after`), with a
    `to(device)` of its own. Refused for a QLEACE whose fit left coupling noise (singular classes,
    `rank_deficient=coupling`): that noise has exact moments on the rows of one call and a fixed seed per class, so
    on a batch it would be a fixed, batch-dependent draw rather than the coupling."""

    def __init__(self, eraser: Eraser | None, then: Any = None) -> None:
        if eraser is not None and getattr(eraser, "has_noise", False):  # the precheck predicts this, up front
            classes = [c for c, q in enumerate(eraser.state["noise_rank"].tolist()) if q > 0]
            raise UserError(after_augment_refusal("the fitted eraser", classes))
        self.eraser, self.then = eraser, then
        self.needs_labels = eraser is not None and eraser.needs_labels  # the loops then pass the class segments

    def tensors(self) -> list[Tensor]:
        """What the map is made of (the eraser's state, the z-score after it): two batch erasers of equal tensors (and
        eraser class) map every batch alike."""
        state = [] if self.eraser is None else [self.eraser.state[k] for k in sorted(self.eraser.state)]
        return state + ([] if self.then is None else [self.then.mean, self.then.std])

    def to(self, device: torch.device | str) -> BatchEraser:
        return type(self)(None if self.eraser is None else self.eraser.to(device),
                          None if self.then is None else self.then.to(device))

    def __call__(self, x: Tensor, y: Tensor, segments: ClassSegments | None = None) -> Tensor:
        """The erased batch. Without a host read where the training loops call it: a label-free eraser maps the rows
        as they are; QLEACE maps each class's rows by `segments` (the host knows every batch's labels ahead), the
        same arithmetic as `eraser(x, y)`, which reads the labels back to find the classes (the fallback without
        segments). The input is not checked for NaN/Inf here (that too is a read back): it is finite training data."""
        e = self.eraser
        if e is None:
            out = x
        elif not e.needs_labels:
            out = _rows(x, e.device, e.map_rows)
        elif segments is not None and isinstance(e, QleaceEraser):
            out = _rows(x, e.device, lambda x64: e.apply_sorted(x64, segments.order, segments.counts))
        else:
            out = e(x, y)
        return out if self.then is None else self.then(out)


def _rows(x: Tensor, device: torch.device, apply: Callable[[Tensor], Tensor]) -> Tensor:
    """`apply` on x's rows flattened, in float64 on `device`, back in x's dtype, device and shape."""
    return apply(x.reshape(len(x), -1).to(device, torch.float64)).to(x.device, x.dtype).reshape(x.shape)


def _fit_info(plan: FitPlan | None, fit: LoadedData | None, coded: LoadedData) -> dict[str, Any]:
    """result.json `eraser.fit`: how the eraser was fitted, null where the mode does not use a key."""
    if plan is None:
        return {"fit_on": "all", "fit_source": None, "n_fit": len(coded.y), "n_coded": len(coded.y),
                "fit_fraction": None, "repeat": None}
    n_fit = plan.oracle.n_fit if plan.oracle is not None else len(fit.y) if fit is not None else None
    return {"fit_on": plan.fit_on, "fit_source": plan.fit_source, "n_fit": n_fit, "n_coded": len(coded.y),
            "fit_fraction": plan.fit_fraction, "repeat": plan.repeat}


def _warn_label_injection(name: str, fit: LoadedData) -> None:
    """A label-dependent map (QLEACE's class maps) estimated from few samples injects the label into held-out data:
    one warning line."""
    if not eraser_traits(name).needs_labels:
        return
    counts = torch.bincount(fit.y, minlength=fit.num_classes)
    line = label_injection_risk(counts, int(fit.x[0].numel()))
    if line is not None:
        log.warning("%s", line)
