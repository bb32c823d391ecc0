"""Models for erasure-mdl: μP MLP, parameter-matched LeNet, timm ConvNeXtV2 and SwinV2.

Each architecture module registers its Spec in `registry.ARCHS` when imported; the list below is every one of them
(a new architecture adds its line here). timm is imported only when a ConvNeXt or Swin model is built.
"""

from models import convnext, lenet, mlp, swin  # the architecture modules, each registering itself in ARCHS
from models.build import build_model, build_with_facts, depth_lr_multiplier, make_adamw, make_optimizer, make_spec
from models.mup_utils import param_count

__all__ = [
    "build_model",
    "build_with_facts",
    "convnext",
    "depth_lr_multiplier",
    "lenet",
    "make_adamw",
    "make_optimizer",
    "make_spec",
    "mlp",
    "param_count",
    "swin",
]
