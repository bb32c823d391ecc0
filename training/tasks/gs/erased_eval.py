"""task=gs_erased_eval: does Spectral Decoupling make a model lean less on what an eraser removes?

Split the dataset (seeded, after the labels are permuted for a null): held-out test (`gs.test_frac`), validation
(MDL's val_size/val_frac, early stopping only) and training. The eraser is fitted on the training split only,
through the jobs' erase path (training/inputs/pipeline.py `erase_maybe_zscored`, the erased-data cache): in sample
on the training rows, out of sample (MDL's holdout options) on the test rows. The μP model of `arch` is trained on
the ORIGINAL training data with `regularizer` (ERM: none or λ=0; SD), then evaluated on original and erased test
(and training) data. Cross-entropy is reported raw and with one temperature fitted on the original validation set
(SD's logits are small by design; the temperature makes codes comparable). training/tasks/gs/gs_erased_eval.py
declares the task.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from training.app.lifecycle import JobRun
from training.data import LoadedData
from training.engine.batches import DeviceData
from training.engine.fit import Member, TrainData, cross_entropy_sum, fit, fit_temperature, predict_logits
from training.engine.regularizers import build_regularizer
from training.engine.seeding import generator, seeded_global_rng
from training.inputs.fit_settings import fit_config, resolve_optim
from training.inputs.pipeline import erase_maybe_zscored
from training.inputs.plan import FitPlan, with_permuted_labels
from training.inputs.store import Store
from training.tasks.gs.common import method_name
from training.tasks.gs.result import StarvationSections

log = logging.getLogger(__name__)
LN2 = math.log(2)


def split(n: int, seed: int, test_frac: float, val_size: int, val_frac: float) -> dict[str, Tensor]:
    perm = torch.randperm(n, generator=generator(seed, "gs_erased_eval", "split"))
    n_test = max(1, round(test_frac * n))
    n_val = max(1, min(val_size, int(val_frac * (n - n_test))))
    return {"test": perm[:n_test], "val": perm[n_test: n_test + n_val], "train": perm[n_test + n_val:]}


@torch.no_grad()
def scores(model: nn.Module, x: Tensor, y: Tensor, temperature: float) -> dict[str, float]:
    logits = predict_logits(model, x)
    n = len(y)
    return {"acc": float((logits.argmax(1) == y).double().mean()),
            "ce_bits": cross_entropy_sum(model, x, y) / n / LN2,
            "ce_bits_calibrated": cross_entropy_sum(model, x, y, temperature=temperature) / n / LN2,
            "confidence": float(logits.softmax(1).max(1).values.mean())}


@dataclass(frozen=True)
class Prepared:
    """The job's inputs: data (labels permuted for a null), its split, and the train and test rows erased by the
    eraser fitted on the train rows (through the erased-data cache)."""

    job: JobRun
    data: LoadedData
    idx: dict[str, Tensor]
    erased: dict[str, Tensor]
    erasure: dict[str, dict[str, Any]]


def prepare(job: JobRun) -> Prepared:
    cfg = job.cfg  # dataset.zscore, eraser.fit_on and eraser=gradient are refused (training/tasks/gs/gs_erased_eval.py)
    gs = cfg.task_options  # training/tasks/gs/gs_erased_eval.py ErasedEvalOptions
    store = job.store or Store.of(cfg.paths)  # the cell's, or the job's own
    data = store.load(cfg.dataset) if job.loaded is None else job.loaded
    data = with_permuted_labels(data, cfg.dataset.permute_labels, cfg.seed)  # the null: before the split
    idx = split(len(data.y), cfg.seed, gs.test_frac, cfg.mdl.val_size, cfg.mdl.val_frac)
    plans = {"train": FitPlan("self", coded_idx=idx["train"]),  # in sample: the rows it is fitted on
             "test": FitPlan("holdout", coded_idx=idx["test"], fit_idx=idx["train"])}
    erased, info = {}, {}
    for part, plan in plans.items():
        erased[part], info[part] = erase_maybe_zscored(data, cfg, store, plan)
    return Prepared(job, data, idx, erased, info)


def run(prepared: Prepared) -> StarvationSections:
    from models import build_with_facts

    job, data, idx, erasure = prepared.job, prepared.data, prepared.idx, prepared.erasure
    cfg, device, seed, k, name = job.cfg, job.device, job.cfg.seed, data.num_classes, job.cfg.eraser.name
    optim = resolve_optim(cfg.optim, cfg.arch)
    with seeded_global_rng(seed, "init", "gs_erased_eval"):
        model, facts = build_with_facts(cfg.arch, data.input_shape, k)
        model = model.to(device)
    opt = optim.build(model)
    on = {p: (data.x[i].to(device), data.y[i].to(device)) for p, i in idx.items()}
    member = Member(model, opt, torch.arange(len(on["train"][1]), device=device),
                    generator(seed, "batches", "gs_erased_eval"),
                    fit_config(cfg, optim.warmup_steps, cfg.mdl.eval_every_steps, numerics=job.numerics))
    x_train = on["train"][0]
    train = DeviceData(x_train, x_train.device, storage="float32")  # what TrainData makes of a tensor
    res = fit(member, TrainData(train, on["train"][1], *on["val"]), build_regularizer(cfg.regularizer, k),
              desc="gs_erased_eval")
    # fit() returns the best state with model and optimizer in eval mode: score as is.
    t = fit_temperature(model, *on["val"])
    out = {p: scores(model, *on[p], t) for p in ("train", "test")}
    out.update({f"{p}_erased": scores(model, prepared.erased[p].to(device), on[p][1], t) for p in ("train", "test")})
    gaps = {metric: out["test_erased"][metric] - out["test"][metric]
            for metric in ("acc", "ce_bits", "ce_bits_calibrated", "confidence")}
    log.info("%s on %s: test acc %.4f -> %.4f erased (gap %+.4f), calibrated CE %.4f -> %.4f bits", name,
             data.name, out["test"]["acc"], out["test_erased"]["acc"], gaps["acc"], out["test"]["ce_bits_calibrated"],
             out["test_erased"]["ce_bits_calibrated"])
    return StarvationSections.read({
        "method": method_name(cfg), "eval": out, "gap_erased_minus_original": gaps, "temperature": t,
        "fit": {"best_val_loss": res.best_val_loss, "best_epoch": res.best_epoch, "epochs": res.epochs,
                "steps": res.steps},
        "split_sizes": {p: len(i) for p, i in idx.items()},
        "eraser": {"name": name, "report": erasure["train"]["report"],
                   "cache_hit": {p: erasure[p]["cache_hit"] for p in erasure},
                   "test_options": erasure["test"]["options"]},
        "optim": dataclasses.asdict(optim), "model": facts, "dataset": data.info})
