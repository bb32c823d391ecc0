"""SwinV2 from timm (no pretrained weights) for small images, with a μP readout.

Three stages with depths [D, D, 3D] (paper App. B) and dims (w, 2w, 4w); patch size 2. At 32×32 that is a
16×16 → 8×8 → 4×4 token grid. (timm also builds a 4th stage on a 2×2 grid, but it would hold most of the
parameters while seeing 4 tokens; the paper's [D, D, 3D] names three stages.)
Heads: `num_heads` in the first stage, doubling per stage, the same at every width, so μP scales the head
dimension (SwinV2's cosine attention needs no 1/d correction). Windows: per stage, the whole grid if it is
at most 7 tokens wide, else the largest of 7…4 dividing it (4 at 16×16).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from mup import MuReadout
from torch import nn

from models.convnext import _named, stage_depths
from models.mup_utils import normal_init
from models.registry import ARCHS

# Named sizes: (stage depths, embed dim); D = 2 as in Swin-T's first three stages.
NAMED_SIZES: dict[str, tuple[tuple[int, ...], int]] = {
    "atto": ((2, 2, 6), 40),
    "femto": ((2, 2, 6), 48),
    "pico": ((2, 2, 6), 64),
    "nano": ((2, 2, 6), 80),
    "tiny": ((2, 2, 6), 96),
}


def stage_grids(image_size: int, patch_size: int, stages: int) -> list[int]:
    grids = [image_size // patch_size]
    for _ in range(stages - 1):
        grids.append((grids[-1] + 1) // 2)  # PatchMerging pads odd grids
    return grids


def auto_window(grid: int) -> int:
    if grid <= 7:
        return grid
    return next((w for w in (7, 6, 5, 4) if grid % w == 0), 7)


@dataclass(frozen=True)
@ARCHS.register("swin", vectorises=False, base_width=40, depth_exponent=0.5, init=normal_init(0.02))
class SwinSpec:
    input_shape: tuple[int, int, int]
    num_classes: int
    width: int
    depths: tuple[int, ...]
    size: str | None
    num_heads: int
    patch_size: int
    window_size: int | None  # None: auto per stage
    mlp_ratio: float
    drop_path_rate: float
    fixed_modules: tuple[str, ...] = ("cpb_mlp",)  # SwinV2's relative-position MLP: fixed 2 → 512 → heads

    @staticmethod
    def stage_depths(arch: Mapping[str, Any], depth: int | None = None) -> tuple[int, ...]:
        """Blocks per stage: the named size's, or [D, D, 3D] for D = `depth` (default `arch.depth`)."""
        return stage_depths(arch, NAMED_SIZES, (1, 1, 3), depth)

    @classmethod
    def from_arch(cls, arch: Mapping[str, Any], input_shape: tuple[int, int, int], num_classes: int) -> SwinSpec:
        size = _named(arch, NAMED_SIZES)
        window = arch.get("window_size")
        return cls(
            input_shape=tuple(input_shape),  # type: ignore[arg-type]
            num_classes=num_classes,
            width=NAMED_SIZES[size][1] if size else int(arch["width"]),
            depths=cls.stage_depths(arch),
            size=size,
            num_heads=int(arch.get("num_heads") or 2),
            patch_size=int(arch.get("patch_size") or 2),
            window_size=None if window is None else int(window),
            mlp_ratio=float(arch.get("mlp_ratio") or 4.0),
            drop_path_rate=float(0.2 if arch.get("drop_path_rate") is None else arch["drop_path_rate"]),
        )

    def with_width(self, width: int) -> SwinSpec:
        return replace(self, width=width)

    @property
    def windows(self) -> list[int]:
        _, h, w = self.input_shape
        grids = stage_grids(min(h, w), self.patch_size, len(self.depths))
        return [self.window_size or auto_window(g) for g in grids]

    @property
    def heads(self) -> tuple[int, ...]:
        return tuple(self.num_heads * 2**i for i in range(len(self.depths)))

    def build(self) -> nn.Module:
        _, h, w = self.input_shape
        if self.width % self.num_heads:
            raise ValueError(f"swin width {self.width} is not divisible by num_heads {self.num_heads}")
        if h % self.patch_size or w % self.patch_size:
            raise ValueError(f"swin patch size {self.patch_size} does not divide the image {h}×{w}")
        from timm.models.swin_transformer_v2 import SwinTransformerV2  # slow import: only when building

        model = SwinTransformerV2(
            img_size=(h, w),
            patch_size=self.patch_size,
            in_chans=self.input_shape[0],
            num_classes=self.num_classes,
            embed_dim=self.width,
            depths=self.depths,
            num_heads=self.heads,
            window_size=tuple((win, win) for win in self.windows),
            mlp_ratio=self.mlp_ratio,
            drop_path_rate=self.drop_path_rate,
        )
        model.head.fc = MuReadout(model.num_features, self.num_classes, readout_zero_init=True)
        return model

    def info(self) -> dict[str, Any]:
        return {
            "size": self.size,
            "depths": list(self.depths),
            "dims": [self.width * 2**i for i in range(len(self.depths))],
            "num_heads": list(self.heads),
            "window_sizes": self.windows,
            "patch_size": self.patch_size,
            "drop_path_rate": self.drop_path_rate,
        }
