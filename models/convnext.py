"""ConvNeXtV2 from timm (no pretrained weights) for small images, with a μP readout.

Stage depths [D, D, 3D, D] and dims (w, 2w, 4w, 8w) (paper App. B); a named size overrides width/depth.
Stem patch size: `max(1, min(H, W) // 32)` (1 for 32×32, 2 for 64×64; 28×28 and 8×8 get 1).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

from mup import MuReadout
from torch import Tensor, nn

from models.mup_utils import normal_init
from models.registry import ARCHS, Arch, CoordSettings

Size = Literal["atto", "femto", "pico", "nano", "tiny"]
POSITIVE = {"check": lambda v: v >= 1, "allowed": "an integer ≥ 1"}
RATE = {"check": lambda v: 0 <= v < 1, "allowed": "a number in [0, 1)"}

# ConvNeXtV2 sizes: (stage depths, first-stage width). Dims double per stage.
NAMED_SIZES: dict[str, tuple[tuple[int, ...], int]] = {
    "atto": ((2, 2, 6, 2), 40),
    "femto": ((2, 2, 6, 2), 48),
    "pico": ((2, 2, 6, 2), 64),
    "nano": ((2, 2, 8, 2), 80),
    "tiny": ((3, 3, 9, 3), 96),
}


@dataclass(frozen=True, kw_only=True)
class ConvNeXtOptions:
    """`arch=convnext`'s own keys (conf/arch/convnext.yaml)."""

    size: Size | None  # a named size overrides width and depth
    patch_size: int | None = field(metadata=POSITIVE)  # null: max(1, min(H, W) // 32)
    kernel_size: int = field(metadata=POSITIVE)
    drop_path_rate: float = field(metadata=RATE)


def stage_depths(arch: Arch, table: Mapping[str, tuple[tuple[int, ...], int]],
                 pattern: tuple[int, ...], depth: int | None = None) -> tuple[int, ...]:
    """Blocks per stage: the named size's, or `pattern` (multiples of D) for D = `depth` (default `arch.depth`)."""
    size = arch.options.size
    if depth is None and size is not None:
        return table[size][0]
    d = arch.depth if depth is None else depth
    if d < 1:
        raise ValueError(f"{arch.name} depth must be >= 1, got {d}")
    return tuple(m * d for m in pattern)


class SpatialMean(nn.Module):
    """Global average pooling as a mean over (H, W): what `adaptive_avg_pool2d(x, 1)` computes (torch takes the same
    mean there, so the same bits), without its channels-last `as_strided_`, which vmap has no batching rule for (the
    stacked engine would fall back to a loop over models)."""

    def forward(self, x: Tensor) -> Tensor:
        return x.mean((-2, -1), keepdim=True)


@dataclass(frozen=True)
@ARCHS.register("convnext", vectorises=False, base_width=40, depth_exponent=0.5, init=normal_init(0.02),
                options=ConvNeXtOptions, coord=CoordSettings({"depth": 1, "drop_path_rate": 0.0}, (8, 16, 32, 64),
                                                             lr=1e-3, nsteps=4))
class ConvNeXtSpec:
    input_shape: tuple[int, int, int]
    num_classes: int
    width: int
    depths: tuple[int, ...]
    size: str | None
    patch_size: int
    drop_path_rate: float
    kernel_size: int = 7

    @staticmethod
    def stage_depths(arch: Arch, depth: int | None = None) -> tuple[int, ...]:
        """Blocks per stage: the named size's, or [D, D, 3D, D] for D = `depth` (default `arch.depth`)."""
        return stage_depths(arch, NAMED_SIZES, (1, 1, 3, 1), depth)

    @classmethod
    def from_arch(cls, arch: Arch, input_shape: tuple[int, int, int], num_classes: int) -> ConvNeXtSpec:
        opts: ConvNeXtOptions = arch.options
        return cls(tuple(input_shape), num_classes,  # type: ignore[arg-type]
                   NAMED_SIZES[opts.size][1] if opts.size else arch.width, cls.stage_depths(arch), opts.size,
                   opts.patch_size or max(1, min(input_shape[1:]) // 32), opts.drop_path_rate, opts.kernel_size)

    @property
    def dims(self) -> tuple[int, ...]:
        return tuple(self.width * 2**i for i in range(len(self.depths)))

    def build(self) -> nn.Module:
        from timm.models.convnext import ConvNeXt  # timm is slow to import: only when building

        # ConvNeXtV2 = GRN in the MLP, no layer scale, 1x1-conv MLP (timm's convnextv2_* arguments)
        model = ConvNeXt(in_chans=self.input_shape[0], num_classes=self.num_classes, depths=self.depths, dims=self.dims,
                         kernel_sizes=self.kernel_size, patch_size=self.patch_size, use_grn=True, ls_init_value=None,
                         conv_mlp=True, drop_path_rate=self.drop_path_rate)
        model.head.fc = MuReadout(self.dims[-1], self.num_classes, readout_zero_init=True)
        model.head.global_pool.pool = SpatialMean()
        return model

    def info(self) -> dict[str, Any]:
        return {"size": self.size, "depths": list(self.depths), "dims": list(self.dims), "patch_size": self.patch_size,
                "drop_path_rate": self.drop_path_rate}
