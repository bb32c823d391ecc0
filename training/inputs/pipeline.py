"""A job's inputs in one pass (`prepare_inputs`): the data loaded, labels permuted for the null control, the eraser's
fit plan (training/inputs/plan.py), fitted and applied through the erased-data cache (training/inputs/erase.py),
z-scored, with the certificates; and with `eraser.after_augment` what the training batches are drawn from."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import torch

from erasure import Eraser
from erasure.registry import ERASERS
from training.app.lifecycle import DataOnDisk
from training.app.schema import JobConfig
from training.data import LoadedData
from training.inputs.erase import BatchEraser, apply_eraser, apply_eraser_keeping_map
from training.inputs.plan import FitPlan, fit_plan, with_permuted_labels
from training.inputs.store import Store

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


def data_fingerprint(cfg: JobConfig, store: Store | None = None) -> DataOnDisk:
    """The fingerprint of the job's data as it is on disk now (result.json's `dataset.fingerprint`), to compare with a
    finished result's, and the data, for the job's body in case it runs again (`store`: the cell's, else its own)."""
    data = (store or Store.of(cfg.paths)).load(cfg.dataset)
    return DataOnDisk(data.info["fingerprint"], data)


@dataclass(frozen=True)
class Inputs:
    """A job's inputs: the coded data (labels permuted for a null), its erased images (z-scored as configured) and how
    they were erased (`erasure`: report, cache hit, fit, certificate, seconds), and with `eraser.after_augment` what
    the training batches are drawn from (`batches`; None: the erased images)."""

    data: LoadedData
    x: torch.Tensor
    erasure: dict[str, Any]
    batches: BatchErasure | None = None


def prepare_inputs(cfg: JobConfig, store: Store, loaded: LoadedData | None = None, after_augment: bool = True
                   ) -> Inputs:
    """The coded data of a job: `loaded` (what its precheck read) or loaded now, labels permuted for the null control
    (`dataset.permute_labels`), erased as its fit plan says and z-scored (`erase_maybe_zscored`); with
    `eraser.fit_on=holdout` or `self` the coded part only. With `eraser.after_augment` (and `after_augment`) the
    training batches are drawn from the unerased images and erased by the fitted eraser (`BatchErasure`; none for the
    identity control without a z-score after it); the erased images are the same as without it (one cache entry)."""
    dataset, eraser = cfg.dataset, cfg.eraser
    after_augment = after_augment and eraser.after_augment
    if after_augment and ERASERS.meta(eraser.name)["kind"] == "edit":  # a dataset edit has no map to apply per batch
        log.info("eraser.after_augment: %s edits the dataset once (as the paper's precomputed datasets); the "
                 "augmented batches are drawn from the edited data", eraser.name)
        after_augment = False
    data = with_permuted_labels(store.load(dataset) if loaded is None else loaded, dataset.permute_labels, cfg.seed)
    plan = fit_plan(eraser, dataset, cfg.seed, data, store)
    x, info, fitted, then, raw = _erased(data, cfg, store, plan, keep_map=after_augment)
    info["after_augment"] = after_augment
    coded = data if plan is None else plan.coded(data)
    if not after_augment:
        return Inputs(coded, x, info)
    info["batch_eraser"] = ({"applied": False, "why": "the identity control has nothing to erase"} if fitted is None
                            else {"applied": True, "report": fitted.report(),
                                  "cache_hit": info.pop("eraser_cache_hit")})
    if fitted is None and then is None:
        return Inputs(coded, x, info)
    return Inputs(coded, x, info, BatchErasure((raw if plan is None else plan.coded(raw)).x, BatchEraser(fitted, then)))


def erase_maybe_zscored(data: LoadedData, cfg: JobConfig, store: Store, plan: FitPlan | None = None
                        ) -> tuple[torch.Tensor, dict[str, Any]]:
    """The eraser `cfg.eraser` fitted as `plan` says and applied to the coded part (with a plan); with
    `dataset.zscore` the data standardised per coordinate "before" erasure (statistics of the raw data) or "after" it
    (of the erased data, as the paper's code did); gradient erasure (pixels in [0, 1]) erases first, then gets the
    "before" standardisation. `cfg.certificate`: with the certificates before and after."""
    x, info, _, _, _ = _erased(data, cfg, store, plan, keep_map=False)
    return x, info


def _erased(data: LoadedData, cfg: JobConfig, store: Store, plan: FitPlan | None, keep_map: bool
            ) -> tuple[torch.Tensor, dict[str, Any], Eraser | None, ZScore | None, LoadedData]:
    """`erase_maybe_zscored`, and (`keep_map`, `eraser.after_augment`) what the batch eraser is made of: the fitted
    eraser, the z-score applied after it, and the data whose coded rows the batches are drawn from."""
    eraser, dataset, cert = cfg.eraser, cfg.dataset, cfg.certificate

    def apply(d: LoadedData, p: FitPlan | None) -> tuple[torch.Tensor, dict[str, Any], Eraser | None]:
        return apply_eraser_keeping_map(d, eraser, store, p, cert, keep_map)

    if not dataset.zscore:
        return (*apply(data, plan), None, data)
    if dataset.zscore_order == "after":
        x, info, fitted = apply(data, plan)
        info["zscore"] = "after erasure (statistics of the erased data)"
        then = ZScore(x)
        return then(x), info, fitted, then, data
    standardize = ZScore(data.x)
    if ERASERS.meta(eraser.name)["kind"] == "edit":  # never with keep_map (prepare_inputs)
        x, info = apply_eraser(data, eraser, store, None, cert)
        info["zscore"] = "after erasure (gradient erasure works in pixel space)"
        return standardize(x), info, None, None, data
    zdata = LoadedData(data.name, standardize(data.x), data.y, data.num_classes, dict(data.info))
    x, info, fitted = apply(zdata, None if plan is None else plan.mapped(standardize))
    info["zscore"] = "before erasure"
    return x, info, fitted, None, zdata


@dataclass(frozen=True)
class BatchErasure:
    """`eraser.after_augment=true`: the training batches are drawn from `raw`, the coded part's images unerased
    (z-scored when `dataset.zscore_order=before`), each (augmented) batch erased on the device by `transform`."""

    raw: torch.Tensor
    transform: BatchEraser
