"""task=gs_erased_eval: does Spectral Decoupling make a model lean less on what an eraser removes?

Split the dataset (seeded): held-out test (`gs.test_frac`), validation (MDL's val_size/val_frac, early
stopping only) and training. Fit `eraser` on the training split only, train the μP model of `arch` on
the ORIGINAL training data with `regularizer` (ERM: none or λ=0; SD), then evaluate it on original and
erased test (and training) data. Cross-entropy is reported raw and with one temperature fitted on the
original validation set (SD's logits are small by design; the temperature makes codes comparable).
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from training.app.lifecycle import JobRun, Outcome
from training.app.schema import JobConfig, load_config
from training.app.tasks import DECLARED, TASKS
from training.engine.batches import DeviceData
from training.engine.fit import Member, TrainData, cross_entropy_sum, fit, fit_temperature, predict_logits
from training.engine.regularizers import build_regularizer
from training.engine.seeding import generator, seeded_global_rng
from training.starvation.common import run_task

log = logging.getLogger(__name__)
LN2 = math.log(2)
USES = DECLARED["gs_erased_eval"]  # the config groups this task reads (and its hash covers)


@dataclass(frozen=True, kw_only=True)
class ErasedEvalTask:
    """`gs.*` of task=gs_erased_eval (conf/experiment/gs_sd_erasure.yaml)."""

    test_frac: float = field(default=0.2, metadata={"check": lambda v: 0 < v < 1, "allowed": "a number in (0, 1)"})


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


def run(job: JobRun) -> dict[str, Any]:
    import erasure
    from models import build_model
    from training.mdl.job import fit_config, resolve_optim
    from training.mdl.precheck import load_data, with_permuted_labels

    cfg, device = job.cfg, job.device  # dataset.zscore is refused by the config check (tasks.py FIXED)
    seed, gs, m = cfg.seed, cfg.task_options or ErasedEvalTask(), cfg.mdl
    data = with_permuted_labels(cfg, load_data(cfg, job.loaded))  # the null: before the split
    x, y, k = data.x, data.y, data.num_classes
    idx = split(len(y), seed, gs.test_frac, m.val_size, m.val_frac)
    name, options = cfg.eraser.name, dict(cfg.eraser.options)
    eraser = erasure.fit(name, x[idx["train"]], y[idx["train"]], **options)

    def erased(part: str) -> Tensor:  # fitted on the train rows: in sample there, out of sample elsewhere
        xs, ys = x[idx[part]], y[idx[part]]
        if not eraser.needs_labels:
            return eraser(xs)
        return eraser.apply_in_sample(xs, ys) if part == "train" else eraser(xs, ys)

    optim = resolve_optim(cfg)
    with seeded_global_rng(seed, "init", "gs_erased_eval"):
        model = build_model(cfg.arch, data.input_shape, k).to(device)
    opt = optim.build(model)
    on = {p: (x[i].to(device), y[i].to(device)) for p, i in idx.items()}
    member = Member(model, opt, torch.arange(len(on["train"][1]), device=device),
                    generator(seed, "batches", "gs_erased_eval"),
                    fit_config(cfg, optim.warmup_steps, m.eval_every_steps))
    x_train = on["train"][0]
    train = DeviceData(x_train, x_train.device, storage="float32")  # what TrainData makes of a tensor
    res = fit(member, TrainData(train, on["train"][1], *on["val"]), build_regularizer(cfg.regularizer, k),
              desc="gs_erased_eval")
    # fit() returns the best state with model and optimizer in eval mode: score as is.
    t = fit_temperature(model, *on["val"])
    out = {p: scores(model, *on[p], t) for p in ("train", "test")}
    for p in ("train", "test"):
        out[f"{p}_erased"] = scores(model, erased(p).to(device), on[p][1], t)
    gaps = {metric: out["test_erased"][metric] - out["test"][metric]
            for metric in ("acc", "ce_bits", "ce_bits_calibrated", "confidence")}
    log.info("%s on %s: test acc %.4f -> %.4f erased (gap %+.4f), calibrated CE %.4f -> %.4f bits", name,
             data.name, out["test"]["acc"], out["test_erased"]["acc"], gaps["acc"], out["test"]["ce_bits_calibrated"],
             out["test_erased"]["ce_bits_calibrated"])
    return {"eval": out, "gap_erased_minus_original": gaps, "temperature": t,
            "fit": {"best_val_loss": res.best_val_loss, "best_epoch": res.best_epoch, "epochs": res.epochs,
                    "steps": res.steps},
            "split_sizes": {p: len(i) for p, i in idx.items()}, "eraser": {"name": name, "report": eraser.report()},
            "optim": dataclasses.asdict(optim), "model": dict(getattr(model, "info", {})), "dataset": data.info}


@TASKS.register("gs_erased_eval", uses=USES, group="gs", options=ErasedEvalTask)
def task(config: Any) -> Outcome:
    cfg = config if isinstance(config, JobConfig) else load_config(config)
    from erasure.traits import eraser_traits  # the identity eraser (control) has nothing to erase
    if eraser_traits(cfg.eraser.name).identity:
        log.info("gs_erased_eval with eraser=control: nothing to erase (every erased job reports the "
                 "original held-out metrics); no job written to %s", cfg.paths.job_dir)
        return Outcome("skipped", Path(cfg.paths.job_dir), {})
    from training.mdl.precheck import data_fingerprint  # the data now, and (for a rerun) the data itself

    return run_task(cfg, run, fingerprint=data_fingerprint)

