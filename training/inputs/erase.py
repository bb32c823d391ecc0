"""The one erase path: a job's eraser fitted on its fit source (training/inputs/plan.py), applied to the coded rows
through the erased-data cache (`erase`), with certificates before and after (`apply_eraser`); the fitted eraser
itself for `eraser.after_augment` (`fitted_eraser`, applied to each training batch by `BatchEraser`)."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import erasure
from erasure import Eraser, data_options, eraser_traits, resolve_options
from erasure.progress import use as erasure_progress
from erasure.qleace import QleaceEraser, label_injection_risk
from erasure.rank_test import rank_test
from training.app.schema import EraserConfig
from training.common.files import atomic_write_json, read_json
from training.common.progress import progress_bar
from training.data.cache import code_version, unreadable_line
from training.data.registry import LoadedData
from training.engine.batches import ClassSegments
from training.errors import NonFiniteError, UserError
from training.inputs.plan import ALL, EraserSpec, FitPlan, FitSource, Rows, flat
from training.inputs.store import Store

log = logging.getLogger(__name__)


def cache_key(data: LoadedData, name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """Dataset identity + eraser + the options that change the erased data, defaults filled in (so `{}` and the
    yaml's defaults agree, and a progress bar or the device never forces a refit)."""
    return {"dataset": data.name, "content": data.content_hash(), "eraser": name,
            "options": data_options(name, dict(options))}


Erased = tuple[Tensor, dict[str, Any], bool, dict[str, Any]]  # erased x, report, cache hit, the entry's key


def erase(store: Store, coded: LoadedData, source: FitSource, spec: EraserSpec, fitted: Eraser | None = None
          ) -> Erased:
    """`coded` erased by `spec` fitted on `source`, through the erased-data cache (keyed by the coded data, the
    eraser and what it was fitted on); `fitted`: that eraser, already fitted (a miss then only applies it). In sample
    `erasure.erase` fits and applies it (an eraser that edits the data too: gradient). Erased data with NaN or Inf
    is refused (NonFiniteError): never cached, never trained on."""
    rows = flat(coded)

    def build() -> tuple[Tensor, dict[str, Any]]:
        if fitted is not None:
            return _apply_fitted(fitted, rows, coded.y, source.in_sample)
        log.info("%s", source.line(spec.name, coded))
        if source.in_sample:
            with erasure_progress(progress_bar):  # a long fit (gradient) shows the harness's bar / log lines
                return erasure.erase(spec.name, rows, coded.y, dict(spec.options), rank_hint=spec.rank_hint)
        t0 = time.perf_counter()
        out, report = _apply_fitted(source.fit(spec), rows, coded.y, in_sample=False)
        return out, {**report, "seconds": time.perf_counter() - t0}  # the fit's time included

    def checked() -> tuple[Tensor, dict[str, Any]]:
        x, report = build()
        if not bool(torch.isfinite(x).all()):
            raise NonFiniteError(f"non-finite erased data: eraser {spec.name} gave {int((~torch.isfinite(x)).sum())} "
                                 f"NaN/Inf values on {coded.name}; check eraser.options and the data; nothing was "
                                 "cached or written as a result")
        return x, report

    key = {**cache_key(coded, spec.name, spec.options), **source.fitted_on()}
    x, report, hit = store.erased(key, checked)
    return x.reshape(coded.x.shape), report, hit, key


def holdout_options(name: str, options: Mapping[str, Any]) -> dict[str, Any]:
    """`options` with the eraser's declared holdout options filling the unset ones (e.g. LEACE treats near-null
    directions of the fit sample as null out of sample, erasure/leace.py HOLDOUT_RTOL); an explicit option wins."""
    resolved = dict(options)
    for key, value in eraser_traits(name).holdout_options.items():
        if resolved.get(key) is None:
            resolved[key] = value
    return resolved


def _apply_fitted(eraser: Eraser, rows: Tensor, y: Tensor, in_sample: bool) -> tuple[Tensor, dict[str, Any]]:
    """`eraser` applied to (rows, y); `in_sample`: these are the rows it was fitted on (`Eraser.apply_in_sample`)."""
    t0 = time.perf_counter()
    out = (eraser.apply_in_sample(rows, y) if in_sample else eraser(rows, y)) if eraser.needs_labels else eraser(rows)
    return out, {**eraser.report(), "seconds": time.perf_counter() - t0}


def fitted_eraser(store: Store, source: Rows, spec: EraserSpec) -> tuple[Eraser, bool]:
    """The eraser `spec` fitted on `source` (a map eraser: `eraser_traits(name).has_map`), and whether it came from
    the cache (training/data/cache.py `cached_eraser`: QLEACE on CIFAR-10 costs minutes, and every seed/architecture
    of an `eraser.after_augment` sweep needs the same eraser). Keyed like the erased data plus the rank hint."""
    fit = source.data

    def build() -> Eraser:
        log.info("fitting eraser %s on %s (%d samples)", spec.name, fit.name, len(fit.y))
        return source.fit(spec)

    key = {**cache_key(fit, spec.name, spec.options), "object": "fitted eraser", "rank_hint": spec.rank_hint}
    return store.eraser(key, build)


def source_rank(data: LoadedData, source: str, store: Store) -> int | None:
    """The rank eraser `source` (default options; a `RankHint`'s source) removes on this dataset, fitting it through
    the cache if needed."""
    _, report, _, _ = erase(store, data, Rows(data, in_sample=True), EraserSpec(source, {}))
    rank = report.get("rank_removed")
    return int(rank) if rank is not None else None


def certify(x: Tensor, y: Tensor) -> dict[str, Any]:
    return erasure.certificate(x.reshape(len(x), -1), y)


def certify_original(data: LoadedData, store: Store) -> dict[str, Any]:
    """Certificate of the unerased data, cached per dataset content (every eraser's job needs it)."""
    path = store.cache_dir / "certificates" / f"{data.name}-{data.content_hash()}-{code_version()[:12]}.json"
    return _cached_certificate(path, data.x, data.y, write=True)


def certify_erased(x: Tensor, y: Tensor, key: Mapping[str, Any], store: Store) -> dict[str, Any]:
    """Certificate of erased data `x` (the erased-data cache entry of `key`) with labels `y`, cached in that entry
    as `certificate-<labels hash>.json`: every seed of a `fit_on=all` cell codes the same erased data and labels.
    Written only into a complete entry (its manifest present), so a rebuilt entry drops its old certificates."""
    entry = store.entry(key)
    labels = hashlib.sha256(y.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:16]
    return _cached_certificate(entry / f"certificate-{labels}.json", x, y, (entry / "manifest.json").is_file())


def _cached_certificate(path: Path, x: Tensor, y: Tensor, write: bool) -> dict[str, Any]:
    """The certificate of (x, y) cached at `path`, else computed (and cached there if `write`); a corrupt or
    unreadable file is recomputed with one log line, a failed write is one log line."""
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
    if write:
        try:
            atomic_write_json(path, cert)
        except OSError as err:  # a cache: not worth losing the job over
            log.warning("could not cache the certificate in %s (%s); going on", path, err)
    return cert


def apply_eraser(data: LoadedData, eraser_cfg: EraserConfig, store: Store, plan: FitPlan | None = None,
                 certificate: bool = True) -> tuple[Tensor, dict[str, Any]]:
    """Erased images and an info dict (report, cache hit, how it was fitted, certificate before/after, seconds). With
    a `plan`, the eraser is fitted as it says and the erased images are those of `plan.coded_idx`, in that order."""
    x, info, _ = apply_eraser_keeping_map(data, eraser_cfg, store, plan, certificate, keep_map=False)
    return x, info


def apply_eraser_keeping_map(data: LoadedData, eraser_cfg: EraserConfig, store: Store, plan: FitPlan | None = None,
                             certificate: bool = True, keep_map: bool = True
                             ) -> tuple[Tensor, dict[str, Any], Eraser | None]:
    """`apply_eraser`, and (`keep_map`) the fitted eraser too (None for the identity control, which has nothing to
    apply), for `eraser.after_augment`: the same erased images (the same cache entry), the eraser from
    `fitted_eraser`. A map eraser only: an eraser that edits the dataset (gradient) is refused."""
    if keep_map and not eraser_traits(eraser_cfg.name).has_map:
        raise ValueError(f"eraser {eraser_cfg.name} edits the dataset once and has no map to apply to other images")
    name, options = eraser_cfg.name, dict(eraser_cfg.options)
    t0 = time.perf_counter()
    plan = plan or ALL
    coded = plan.coded(data)
    source = plan.source(data)
    if plan.shuffle is not None and isinstance(source, Rows):  # fitted on shuffled labels, applied out of sample
        log.info("eraser %s: fitted on shuffled labels of its %d fit rows (eraser.fit_labels=shuffled)", name,
                 len(source.data.y))
    if not plan.in_sample:
        options = holdout_options(name, options)
    fit = {"fit_on": plan.fit_on, "fit_source": plan.fit_source, "n_fit": source.n_fit, "n_coded": len(coded.y),
           "fit_fraction": plan.fit_fraction, "repeat": plan.repeat}  # null where the mode does not use a key
    info: dict[str, Any] = {"name": name, "options": options, "fit": fit}
    traits = eraser_traits(name)
    eraser, key = None, None
    if traits.identity:
        x, info["report"], info["cache_hit"] = coded.x, {"rank_removed": 0}, None
    else:
        spec = EraserSpec(name, options)
        if traits.rank_hint is not None and traits.rank_hint.wanted(resolve_options(name, options)):
            ranked = plan.fit_rows(data)  # a rank-matched baseline's source rank: on the fit rows' own labels
            assert ranked is not None, "the schema refuses fit_on=oracle for an eraser without a moments fit"
            spec = EraserSpec(name, options, source_rank(ranked, traits.rank_hint.source, store))
        if keep_map:
            assert isinstance(source, Rows), "the schema refuses eraser.after_augment with fit_on=oracle"
            eraser, info["eraser_cache_hit"] = fitted_eraser(store, source, spec)
        if isinstance(source, Rows) and not source.in_sample and traits.needs_labels:
            # a label-dependent map (QLEACE's class maps) fitted on few samples injects the label into held-out data
            counts = torch.bincount(source.data.y, minlength=source.data.num_classes)
            if (line := label_injection_risk(counts, int(source.data.x[0].numel()))) is not None:
                log.warning("%s", line)
        x, info["report"], info["cache_hit"], key = erase(store, coded, source, spec, eraser)
        log.info("eraser %s: %s", name, "cache hit" if info["cache_hit"] else "fitted and cached")
        if isinstance(source, Rows) and traits.family == "linear" and traits.rank_hint is None:  # on its labels
            info["rank_test"] = rank_test(source.data.x, source.data.y)
    info["seconds"] = time.perf_counter() - t0
    if certificate:
        before = certify_original(coded, store)
        after = before if key is None else certify_erased(x, coded.y, key, store)
        info["certificate"] = {"before": before, "after": after}
    return x, info, eraser


def after_augment_refusal(of: str, singular: list[int]) -> str:
    """The one line refusing `eraser.after_augment=true` for a QLEACE coupling that adds noise."""
    return (f"eraser.after_augment=true is not allowed with qleace's rank_deficient=coupling here: classes "
            f"{singular} of {of} are singular, and the coupling noise that fills them has exact moments on whole "
            "classes, not on a batch; use eraser=qleace_paper (shrinkage, the paper code's estimator), "
            "eraser.options.rank_deficient=truncate or ridge, or eraser.after_augment=false")


class BatchEraser:
    """`eraser.after_augment`: a fitted eraser applied to each training batch (b, c, h, w) where it lies (the paper
    code's `transform(augment(x))`), called by the training loops as `batch_transform(x, y, segments)`. The math runs
    in float64 on the batch's device (`to` moves the state there once), back in the batch's dtype (None: the
    identity control). `then`: a map applied to the erased batch (the z-score of `dataset.zscore_order=after`).
    Refused for a QLEACE whose fit left coupling noise (`rank_deficient=coupling`): that noise has exact moments on
    the rows of one call, so on a batch it would be a fixed, batch-dependent draw rather than the coupling."""

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
        """The erased batch, without a host read: a label-free eraser maps the rows as they are; QLEACE maps each
        class's rows by `segments` (the host knows the labels), the arithmetic of `eraser(x, y)` (which reads the
        labels back: the fallback). The input is finite training data: not checked for NaN/Inf (a read back)."""
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

