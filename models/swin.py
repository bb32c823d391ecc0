"""SwinV2 from timm (no pretrained weights) for small images, with a μP readout.

`arch.stages` = 4 (default, the paper's code: torchvision's SwinV2 recipe): depths [D, D, 3D, D] = [2, 2, 6, 2],
dims (w, 2w, 4w, 8w), heads [2, 4, 8, 16], window 7, stochastic depth 0.2; patch size 2, so at 32×32 the token
grids are 16×16 → 8×8 → 4×4 → 2×2. `arch.stages` = 3: depths [D, D, 3D] as the paper's appendix text says
(this harness's earlier shape; its 4th stage holds most parameters while seeing 4 tokens).
Heads: `num_heads` in the first stage, doubling per stage, the same at every width, so μP scales the head
dimension (SwinV2's cosine attention needs no 1/d correction).
Windows: `arch.window_size` = 7 (paper): timm (>= 1.0.31, pyproject's floor; 1.0.29 cannot build this) pads a grid
that 7 does not divide to a multiple of 7 (16×16 → 21×21, 3×3 windows; 8×8 → 14×14), as torchvision's SwinV2
does, and uses the whole grid as the window when the grid is at most 7 wide (4×4, 2×2: one window, no shift;
torchvision pads those to 7×7 instead, with the same single window per image but zero tokens in it).
`window_size` = null: per stage, the whole grid if it is at most 7 wide, else the largest of 7…4 dividing it (4 at
16×16; no padding).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from mup import MuReadout
from torch import nn

from models.convnext import POSITIVE, RATE, Size, stage_depths
from models.mup_utils import normal_init
from models.registry import ARCHS, Arch, CoordSettings

# Named sizes: (stage depths, embed dim); D = 2 as in Swin-T. With `arch.stages` = 3 the first three stages.
NAMED_SIZES: dict[str, tuple[tuple[int, ...], int]] = {
    "atto": ((2, 2, 6, 2), 40),
    "femto": ((2, 2, 6, 2), 48),
    "pico": ((2, 2, 6, 2), 64),
    "nano": ((2, 2, 6, 2), 80),
    "tiny": ((2, 2, 6, 2), 96),
}
STAGE_PATTERN = (1, 1, 3, 1)  # blocks per stage in multiples of D


@dataclass(frozen=True, kw_only=True)
class SwinOptions:
    """`arch=swin`'s own keys (conf/arch/swin.yaml)."""

    size: Size | None  # a named size overrides width and depth
    stages: Literal[3, 4]  # 4: the paper's code; 3: its appendix text
    num_heads: int = field(metadata=POSITIVE)  # in the first stage, doubling per stage
    patch_size: int = field(metadata=POSITIVE)
    window_size: int | None = field(metadata=POSITIVE)  # null: per stage, automatic
    mlp_ratio: float = field(metadata={"check": lambda v: v > 0, "allowed": "a number > 0"})
    drop_path_rate: float = field(metadata=RATE)


def stage_grids(image_size: int, patch_size: int, stages: int) -> list[int]:
    grids = [image_size // patch_size]
    for _ in range(stages - 1):
        grids.append((grids[-1] + 1) // 2)  # PatchMerging pads odd grids
    return grids


@dataclass(frozen=True)
@ARCHS.register("swin", vectorises=False, base_width=40, depth_exponent=0.5, init=normal_init(0.02),
                options=SwinOptions, coord=CoordSettings({"depth": 1, "drop_path_rate": 0.0}, (16, 32, 64, 128),
                                                         lr=1e-3, nsteps=4))
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
    def stage_depths(arch: Arch, depth: int | None = None) -> tuple[int, ...]:
        """Blocks per stage: the named size's, or [D, D, 3D, D] for D = `depth` (default `arch.depth`); the first
        `arch.stages` of them."""
        n = arch.options.stages
        table = {k: (d[:n], w) for k, (d, w) in NAMED_SIZES.items()}
        return stage_depths(arch, table, STAGE_PATTERN[:n], depth)

    @classmethod
    def from_arch(cls, arch: Arch, input_shape: tuple[int, int, int], num_classes: int) -> SwinSpec:
        opts: SwinOptions = arch.options
        return cls(tuple(input_shape), num_classes,  # type: ignore[arg-type]
                   NAMED_SIZES[opts.size][1] if opts.size else arch.width, cls.stage_depths(arch), opts.size,
                   opts.num_heads, opts.patch_size, opts.window_size, opts.mlp_ratio, opts.drop_path_rate)

    @property
    def windows(self) -> list[int]:
        """The window per stage as timm uses it: a fixed window clamped to grids no wider than it (larger grids
        are padded to a multiple of it), or the automatic choice."""
        _, h, w = self.input_shape
        grids = stage_grids(min(h, w), self.patch_size, len(self.depths))
        if self.window_size is None:
            return [g if g <= 7 else next((w for w in (7, 6, 5, 4) if g % w == 0), 7) for g in grids]
        return [min(g, self.window_size) for g in grids]

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

        model = SwinTransformerV2(img_size=(h, w), patch_size=self.patch_size, in_chans=self.input_shape[0],
                                  num_classes=self.num_classes, embed_dim=self.width, depths=self.depths,
                                  num_heads=self.heads, window_size=tuple((win, win) for win in self.windows),
                                  mlp_ratio=self.mlp_ratio, drop_path_rate=self.drop_path_rate)
        model.head.fc = MuReadout(model.num_features, self.num_classes, readout_zero_init=True)
        return model

    def info(self) -> dict[str, Any]:
        return {"size": self.size, "depths": list(self.depths),
                "dims": [self.width * 2**i for i in range(len(self.depths))], "num_heads": list(self.heads),
                "window_sizes": self.windows, "patch_size": self.patch_size, "drop_path_rate": self.drop_path_rate}
