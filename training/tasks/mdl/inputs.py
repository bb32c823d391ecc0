"""The MDL job's inputs: the data loaded, labels permuted, the eraser's fit plan, erased (through the erased-data
cache) and z-scored (`prepare_inputs`), and with `eraser.after_augment` what the training batches are drawn from."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from erasure.registry import ERASERS
from training.app.schema import DatasetConfig, EraserConfig, JobConfig, PathsConfig
from training.data import LoadedData
from training.data.erase import BatchEraser, FitPlan, apply_eraser, apply_eraser_keeping_map
from training.data.shared import Pack, erased_of, erasers_of
from training.tasks.mdl.precheck import fit_plan, load_data, with_permuted_labels

log = logging.getLogger(__name__)


class ZScore:
    """Per-coordinate (pixel, channel) standardisation with the statistics of `x` (paper Fig. 16), in float64, back
    to the input's dtype. Constant coordinates (std < 1e-8, e.g. MNIST borders) are centred and left unscaled."""

    def __init__(self, x: torch.Tensor) -> None:
        mean = x.double().mean(dim=0, keepdim=True)
        std = x.double().std(dim=0, keepdim=True)
        self.mean, self.std = mean, torch.where(std < 1e-8, torch.ones_like(std), std)

    def to(self, device: torch.device | str) -> ZScore:
        out = object.__new__(ZScore)
        out.mean, out.std = self.mean.to(device), self.std.to(device)
        return out

    def __call__(self, v: torch.Tensor) -> torch.Tensor:
        return ((v.double() - self.mean) / self.std).to(v.dtype)


def zscore_map(x: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor]:
    """Per-coordinate standardisation with the statistics of `x` (`ZScore`)."""
    return ZScore(x)


def prepare_data(cfg: JobConfig, loaded: LoadedData | None = None, pack: Pack | None = None
                 ) -> tuple[LoadedData, torch.Tensor, dict[str, Any]]:
    """The coded data of a job: loaded (or `loaded`, what its precheck read), labels permuted for the null control
    (`dataset.permute_labels`, seeded by the job seed, before anything else sees them), then erased
    (`erase_maybe_zscored`). With `eraser.fit_on=holdout` or `self` the returned data and erased images are the
    coded part only. `pack`: what the job shares with its pack's others (training/data/shared.py), None alone."""
    coded, x, info, _ = _prepare(cfg.dataset, cfg.eraser, cfg.seed, cfg.paths, cfg.certificate, False, loaded, pack)
    return coded, x, info


def prepare_inputs(cfg: JobConfig, loaded: LoadedData | None = None, pack: Pack | None = None
                   ) -> tuple[LoadedData, torch.Tensor, dict[str, Any], BatchErasure | None]:
    """`prepare_data`, and with `eraser.after_augment` what the training batches are drawn from instead: the
    unerased images and the fitted eraser (`BatchErasure`). The erased images (validation set, coded blocks) are
    the same as without it."""
    edits = ERASERS.meta(cfg.eraser.name)["kind"] == "edit"  # a dataset edit has no map to apply per batch
    if cfg.eraser.after_augment and edits:
        log.info("eraser.after_augment: %s edits the dataset once (as the paper's precomputed datasets); the "
                 "augmented batches are drawn from the edited data", cfg.eraser.name)
    return _prepare(cfg.dataset, cfg.eraser, cfg.seed, cfg.paths, cfg.certificate,
                    cfg.eraser.after_augment and not edits, loaded, pack)


def _prepare(dataset: DatasetConfig, eraser: EraserConfig, seed: int, paths: PathsConfig, certificate: bool,
             after_augment: bool, loaded: LoadedData | None, pack: Pack | None
             ) -> tuple[LoadedData, torch.Tensor, dict[str, Any], BatchErasure | None]:
    data = load_data(dataset, paths.data_dir, loaded, pack)  # loaded by the precheck (precheck.py), or now
    data = with_permuted_labels(data, dataset.permute_labels, seed)
    plan = fit_plan(eraser, dataset, seed, data, paths.data_dir, pack)
    coded = data if plan is None or plan.coded_idx is None else data.subset(plan.coded_idx)
    how = (eraser, dataset, Path(paths.cache_dir), certificate)
    if after_augment:
        x, info, batches = erase_after_augment(data, *how, plan, pack)
        return coded, x, info, batches
    x, info = erase_maybe_zscored(data, *how, plan, pack)
    info["after_augment"] = False
    return coded, x, info, None


def erase_maybe_zscored(data: LoadedData, eraser: EraserConfig, dataset: DatasetConfig, cache_dir: Path,
                        certificate: bool, plan: FitPlan | None = None, pack: Pack | None = None
                        ) -> tuple[torch.Tensor, dict[str, Any]]:
    """Apply the eraser (fitted as `plan` says and applied to the coded part, with a plan); with
    `dataset.zscore` the data is standardised per coordinate, `dataset.zscore_order`: "before" erasure
    (statistics of the raw data) or "after" it (statistics of the erased data, as the paper's code did). Gradient
    erasure optimises pixels in [0, 1] (sigmoid), so with "before" it erases first and then gets the same affine
    standardisation (statistics of the unerased data)."""
    cert, memo = certificate, erased_of(pack)
    if not dataset.zscore:
        return apply_eraser(data, eraser, cache_dir, with_certificate=cert, plan=plan, memo=memo)
    if dataset.zscore_order == "after":
        x, info = apply_eraser(data, eraser, cache_dir, with_certificate=cert, plan=plan, memo=memo)
        info["zscore"] = "after erasure (statistics of the erased data)"
        return zscore_map(x)(x), info
    standardize = zscore_map(data.x)
    if ERASERS.meta(eraser.name)["kind"] == "edit":
        x, info = apply_eraser(data, eraser, cache_dir, with_certificate=cert, memo=memo)
        info["zscore"] = "after erasure (gradient erasure works in pixel space)"
        return standardize(x), info
    zdata = LoadedData(data.name, standardize(data.x), data.y, data.num_classes, dict(data.info))
    x, info = apply_eraser(zdata, eraser, cache_dir, with_certificate=cert,
                           plan=None if plan is None else plan.mapped(standardize), memo=memo)
    info["zscore"] = "before erasure"
    return x, info


@dataclass(frozen=True)
class BatchErasure:
    """`eraser.after_augment=true`: the training batches are drawn from `raw`, the coded part's images unerased
    (z-scored when `dataset.zscore_order=before`), and each (augmented) batch is erased on the device by
    `transform(x, y)`."""

    raw: torch.Tensor
    transform: BatchEraser


def erase_after_augment(data: LoadedData, eraser: EraserConfig, dataset: DatasetConfig, cache_dir: Path,
                        certificate: bool, plan: FitPlan | None = None, pack: Pack | None = None
                        ) -> tuple[torch.Tensor, dict[str, Any], BatchErasure | None]:
    """`erase_maybe_zscored` (the same erased images, from the same cache entry: validation set and coded blocks are
    erased once, unaugmented), plus the fitted eraser and the unerased images for the training batches. With
    `dataset.zscore_order=after` each erased batch is then standardised with the statistics of the erased data,
    as the erased images are. None instead of a `BatchErasure` where the batches are the erased images anyway (the
    identity control without a z-score after it)."""
    cert, memo, erasers = certificate, erased_of(pack), erasers_of(pack)
    then: ZScore | None = None
    if dataset.zscore and dataset.zscore_order == "before":
        standardize = zscore_map(data.x)
        data = LoadedData(data.name, standardize(data.x), data.y, data.num_classes, dict(data.info))
        plan = None if plan is None else plan.mapped(standardize)
        x, info, fitted = apply_eraser_keeping_map(data, eraser, cache_dir, with_certificate=cert,
                                                   plan=plan, memo=memo, erasers=erasers)
        info["zscore"] = "before erasure"
    else:
        x, info, fitted = apply_eraser_keeping_map(data, eraser, cache_dir, with_certificate=cert,
                                                   plan=plan, memo=memo, erasers=erasers)
        if dataset.zscore:
            then = ZScore(x)
            x = then(x)
            info["zscore"] = "after erasure (statistics of the erased data)"
    info["after_augment"] = True
    info["batch_eraser"] = ({"applied": False, "why": "the identity control has nothing to erase"} if fitted is None
                            else {"applied": True, "report": fitted.report(),
                                  "cache_hit": info.pop("eraser_cache_hit")})
    if fitted is None and then is None:  # the control: the batches are the erased (= unerased) images, as without
        return x, info, None
    coded = data if plan is None or plan.coded_idx is None else data.subset(plan.coded_idx)
    return x, info, BatchErasure(coded.x, BatchEraser(fitted, then))
