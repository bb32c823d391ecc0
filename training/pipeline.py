"""One job: dataset -> eraser -> prequential MDL (one fresh model per block) -> full-data run -> result.json.

`run_job(cfg)` takes the resolved config as a plain dict; the Hydra entrypoint is a thin shell around it.
Each block model draws its init, batch order and augmentation from generators derived from
(seed, block), so a job killed after block i and resumed gives exactly the uninterrupted numbers.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from training.data import load_dataset
from training.erase_step import apply_eraser
from training.fit import FitConfig, FitResult, cross_entropy_sum, fit, fit_temperature
from training.mdl import paper_code, prequential_code
from training.regularizers import build_regularizer
from training.results import RESULT_FILE, atomic_write_json, config_hash, read_json, should_skip
from training.seeding import generator, seeded_global_rng
from training.splits import MdlSplit, make_split
from training.wandb_logger import RunLogger

log = logging.getLogger(__name__)
PROGRESS_FILE = "progress.json"
LN2 = math.log(2)


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise RuntimeError(f"device={name} requested but CUDA is not available")
    return torch.device(name)


def resolve_optim(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """Learning rate, β₁ and warmup: explicit values win, else the paper's for (arch, eraser, dataset)."""
    from models import depth_lr_multiplier, paper_defaults

    o = cfg["optim"]
    paper = paper_defaults(cfg["arch"]["name"], cfg["eraser"]["name"], cfg["dataset"]["name"])
    lr = float(o["lr"] if o.get("lr") is not None else paper["lr"])
    mult = float(depth_lr_multiplier(cfg["arch"])) if o.get("depth_lr_rule", True) else 1.0
    return {
        "lr_base": lr,
        "lr": lr * mult,
        "depth_lr_multiplier": mult,
        "beta1": float(o["beta1"] if o.get("beta1") is not None else paper["beta1"]),
        "weight_decay": float(o.get("weight_decay", 0.0)),
        "warmup_steps": int(o["warmup_steps"] if o.get("warmup_steps") is not None else paper.get("warmup_steps", 0)),
        "batch_size": int(o.get("batch_size", 128)),
    }


class Trainer:
    """Builds a fresh μP model + optimizer per fit and trains it on index subsets of on-device data."""

    def __init__(self, cfg: Mapping[str, Any], x: torch.Tensor, y: torch.Tensor, num_classes: int,
                 split: MdlSplit, device: torch.device):
        self.cfg, self.seed = cfg, int(cfg["seed"])
        self.x, self.y = x.to(device), y.to(device)
        self.num_classes, self.split, self.device = num_classes, split, device
        self.hp = resolve_optim(cfg)
        self.regularizer = build_regularizer(cfg.get("regularizer"), num_classes)
        self.x_val, self.y_val = self.x[split.val_idx.to(device)], self.y[split.val_idx.to(device)]
        self.input_shape = tuple(int(s) for s in x.shape[1:])
        self.model_info: dict[str, Any] = {}

    def fit_cfg(self, eval_every_steps: int | None = None) -> FitConfig:
        m = self.cfg["mdl"]
        return FitConfig(batch_size=self.hp["batch_size"], patience=int(m["patience"]),
                         max_epochs=int(m["max_epochs"]), augment=bool(self.cfg["dataset"].get("augment", False)),
                         eval_every_steps=eval_every_steps, progress=bool(self.cfg.get("progress", True)))

    def train(self, idx: torch.Tensor, tag: object, eval_every_steps: int | None = None):
        from models import build_model, make_optimizer

        with seeded_global_rng(self.seed, "init", tag):
            model = build_model(self.cfg["arch"], self.input_shape, self.num_classes).to(self.device)
        self.model_info = dict(getattr(model, "info", {}))
        opt = make_optimizer(model, lr=self.hp["lr"], beta1=self.hp["beta1"],
                             weight_decay=self.hp["weight_decay"], warmup_steps=self.hp["warmup_steps"])
        idx = idx.to(self.device)
        # Dropout/drop-path draw from the global RNG: seed it per (seed, tag) so a resumed job's block i
        # sees the same stream as in an uninterrupted run (and runs do not depend on earlier blocks).
        with seeded_global_rng(self.seed, "train", tag):
            res = fit(model, opt, self.x[idx], self.y[idx], self.x_val, self.y_val,
                      self.fit_cfg(eval_every_steps), generator(self.seed, "batches", tag), self.regularizer,
                      desc=f"{tag}")
        return model, res

    def code_bits(self, model: torch.nn.Module, idx: torch.Tensor) -> tuple[float, float]:
        """Mean cross-entropy in bits of `model` (already in eval mode) on the samples `idx`, and the
        temperature used (1 unless `mdl.calibrate_temperature`, then fitted on the validation set)."""
        idx = idx.to(self.device)
        t = fit_temperature(model, self.x_val, self.y_val) if self.cfg["mdl"].get("calibrate_temperature") else 1.0
        return cross_entropy_sum(model, self.x[idx], self.y[idx], temperature=t) / len(idx) / LN2, t


def _fit_summary(res: FitResult) -> dict[str, Any]:
    return {"best_val_loss": res.best_val_loss, "best_epoch": res.best_epoch, "epochs": res.epochs,
            "steps": res.steps}


def run_mdl(trainer: Trainer, job_dir: Path, cfg_hash: str, logger: RunLogger) -> dict[str, Any]:
    """Train the B-1 block models (resuming finished ones from progress.json) and return the code."""
    split, protocol = trainer.split, trainer.cfg["mdl"]["protocol"]
    num_blocks = len(split.block_sizes)
    progress_path = job_dir / PROGRESS_FILE
    saved = read_json(progress_path) or {}
    blocks: list[dict[str, Any]] = saved.get("blocks", []) if saved.get("config_hash") == cfg_hash else []
    if blocks:
        log.info("resuming after block model %d/%d from %s", len(blocks), num_blocks - 1, progress_path)
    for i in range(len(blocks) + 1, num_blocks):
        t0 = time.perf_counter()
        model, res = trainer.train(split.prefix(i), ("block", i))
        coded = split.block(i + 1) if protocol == "prequential" else split.block(num_blocks)
        ce, temperature = trainer.code_bits(model, coded)
        blocks.append({"block": i + 1, "train_size": split.cumsizes[i - 1], "coded_size": len(coded),
                       "ce_bits": ce, "temperature": temperature, "seconds": time.perf_counter() - t0,
                       **_fit_summary(res)})
        atomic_write_json(progress_path, {"config_hash": cfg_hash, "blocks": blocks})
        log.info("block %d/%d: trained on %d, coded %d at %.4f bits/sample (%d epochs, %.1fs)",
                 i + 1, num_blocks, split.cumsizes[i - 1], len(coded), ce, res.epochs, blocks[-1]["seconds"])
        logger.log({"mdl/block": i + 1, "mdl/ce_bits": ce, "mdl/train_size": split.cumsizes[i - 1]})
    ces = [b["ce_bits"] for b in blocks]
    if protocol == "prequential":
        code = prequential_code(split.block_sizes, ces, trainer.num_classes)
    elif protocol == "paper":
        code = paper_code(split.block_sizes, ces)
    else:
        raise ValueError(f"unknown mdl.protocol {protocol!r} (prequential | paper)")
    out = code.as_dict()
    out["blocks"] = blocks
    out["num_classes"] = trainer.num_classes
    out["n_coded"] = sum(split.block_sizes)
    out["n_val"] = len(split.val_idx)
    return out


def run_full(trainer: Trainer, logger: RunLogger) -> dict[str, Any]:
    """One model on all non-validation data, logging the validation loss curve (paper Figs 9-15)."""
    every = trainer.cfg["mdl"].get("eval_every_steps")
    model, res = trainer.train(trainer.split.order, "full", eval_every_steps=int(every) if every else None)
    for step, loss in res.curve:
        logger.log({"full/val_loss": loss}, step=step)
    return {"val_loss": res.best_val_loss, "val_loss_bits": res.best_val_loss / LN2,
            "val_loss_curve": [[s, v] for s, v in res.curve], **_fit_summary(res)}


def zscore(x: torch.Tensor) -> torch.Tensor:
    """Per-channel standardisation over the whole dataset."""
    mean = x.mean(dim=(0, 2, 3), keepdim=True)
    std = x.std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-8)
    return (x - mean) / std


def run_job(cfg: dict[str, Any]) -> dict[str, Any]:
    job_dir = Path(cfg["paths"]["job_dir"])
    cfg_hash = config_hash(cfg)
    if should_skip(job_dir, cfg_hash, bool(cfg.get("force", False))):
        log.info("SKIP %s (finished, config hash %s)", job_dir, cfg_hash)
        return read_json(job_dir / RESULT_FILE) or {}
    job_dir.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    device = resolve_device(str(cfg.get("device", "auto")))
    seed = int(cfg["seed"])
    logger = RunLogger(cfg.get("logger"), cfg, job_dir, run_id=f"{cfg_hash}-s{seed}")
    try:
        data = load_dataset(cfg["dataset"], cfg["paths"]["data_dir"])
        x, erasure_info = apply_eraser(data, cfg["eraser"], Path(cfg["paths"]["cache_dir"]),
                                       with_certificate=bool(cfg.get("certificate", True)))
        if cfg["dataset"].get("zscore"):
            x = zscore(x)
        m = cfg["mdl"]
        split = make_split(len(data.y), seed, val_size=int(m["val_size"]), val_frac=float(m["val_frac"]),
                           num_blocks=int(m["num_blocks"]), min_block=int(m["min_block"]))
        trainer = Trainer(cfg, x, data.y, data.num_classes, split, device)
        log.info("job %s: %s, %d samples (%d validation), blocks %s, lr %.3g, device %s", job_dir, data.name,
                 len(data.y), len(split.val_idx), split.block_sizes, trainer.hp["lr"], device)
        t_mdl = time.perf_counter()
        mdl = run_mdl(trainer, job_dir, cfg_hash, logger)
        t_full = time.perf_counter()
        final = run_full(trainer, logger) if m.get("full_run", True) else None
        t_end = time.perf_counter()
        result = {
            "config_hash": cfg_hash,
            "job_dir": str(job_dir),
            "config": cfg,
            "dataset": data.info,
            "eraser": erasure_info,
            "model": trainer.model_info,
            "optim": trainer.hp,
            "mdl": mdl,
            "final": final,
            "certificate": erasure_info.pop("certificate", None),
            "device": str(device),
            "timings": {"erase_s": erasure_info["seconds"], "mdl_s": t_full - t_mdl,
                        "full_run_s": t_end - t_full, "total_s": t_end - t_start},
        }
        logger.summary({"mdl/bits_per_sample": mdl["bits_per_sample"], "mdl/legacy": mdl["legacy"]})
        atomic_write_json(job_dir / RESULT_FILE, result)  # the job's last act: its presence means "done"
        (job_dir / PROGRESS_FILE).unlink(missing_ok=True)
        log.info("done %s: %.4f bits/sample (%s), legacy %.4f, %.1fs", job_dir, mdl["bits_per_sample"],
                 mdl["protocol"], mdl["legacy"], t_end - t_start)
        return result
    finally:
        logger.finish()
