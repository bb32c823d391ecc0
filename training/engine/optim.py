"""The optimiser of a fit as the engine takes it: μP schedule-free AdamW (or torch's AdamW, `optim.name=adamw`) with the
job's settings, all given (every default lives once, in `OptimConfig` or conf/optim: tests/test_defaults_once.py).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class OptimSettings:
    """The resolved optimiser settings of a job (result.json's `optim` section, in this order)."""

    lr_base: float  # optim.lr
    lr: float  # lr_base × depth_lr_multiplier
    depth_lr_multiplier: float  # the depth rule's (1 without optim.depth_lr_rule)
    beta1: float
    beta2: float
    weight_decay: float
    warmup_steps: int
    batch_size: int
    name: str  # schedulefree | adamw
    schedule: str  # adamw's learning-rate schedule: constant | cosine (over the fit's max_epochs)

    def build(self, model: nn.Module) -> torch.optim.Optimizer:
        """A fresh optimizer of `model` with these settings (models/build.py `make_optimizer`, `make_adamw`)."""
        from models import make_adamw, make_optimizer

        if self.name == "adamw":
            return make_adamw(model, lr=self.lr, beta1=self.beta1, beta2=self.beta2, weight_decay=self.weight_decay)
        return make_optimizer(model, lr=self.lr, beta1=self.beta1, beta2=self.beta2, weight_decay=self.weight_decay,
                              warmup_steps=self.warmup_steps)
