"""Models for erasure-mdl: μP MLP, parameter-matched LeNet, timm ConvNeXtV2 and SwinV2."""

from models.build import build_model, depth_lr_multiplier, make_optimizer, make_spec
from models.mup_utils import param_count

__all__ = [
    "build_model",
    "depth_lr_multiplier",
    "make_optimizer",
    "make_spec",
    "param_count",
]
