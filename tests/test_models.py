"""models/: every architecture builds for every input size, μP wiring, LeNet parameter matching, defaults."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from mup import MuReadout
from omegaconf import OmegaConf

from models import build_model, build_with_facts, depth_lr_multiplier, param_count
from models.convnext import NAMED_SIZES as CONVNEXT_SIZES
from models.lenet import LeNet, LeNetSpec, lenet_param_count, match_lenet
from models.mlp import MLP, mlp_param_count
from models.mup_utils import on_meta
from models.registry import ARCHS, arch_traits
from models.swin import NAMED_SIZES as SWIN_SIZES
from tests.helpers import job_config, optimizer
from training.app.schema import ArchConfig, group_config

ROOT = Path(__file__).resolve().parents[1]
INPUTS = [(1, 28, 28), (3, 32, 32), (3, 64, 64), (1, 8, 8)]
PAPER_WIDTHS = [64, 128, 256, 512, 1024, 2048]  # at depth 2
PAPER_DEPTHS = [1, 2, 3, 4, 5, 6, 7, 8]  # at width 128


def _infshape(p: torch.Tensor) -> Any:
    """The μP shape (mup.InfShape) that mup's set_base_shapes hangs on each parameter (untyped: set at runtime)."""
    return p.infshape  # type: ignore[attr-defined]


def arch_cfg(name: str, **overrides: object) -> ArchConfig:
    """The arch group exactly as Hydra composes it, with overrides, typed."""
    return group_config("arch", name, **overrides)


def one_step(model: torch.nn.Module, shape: tuple[int, int, int], k: int = 10, batch: int = 2) -> float:
    """Forward (checks (B, K) logits), backward, one optimiser step; returns the loss."""
    x, y = torch.rand(batch, *shape), torch.arange(batch) % k
    opt = optimizer(model, lr=1e-3, beta1=0.9)
    model.train()
    opt.train()
    logits = model(x)
    assert logits.shape == (batch, k)
    loss = F.cross_entropy(logits, y)
    loss.backward()
    opt.step()
    assert math.isfinite(loss.item())
    return loss.item()


# ---------------------------------------------------------------- configs


@pytest.mark.parametrize("name", ARCHS.names())
def test_arch_yaml_has_every_field(name: str) -> None:
    raw = OmegaConf.load(ROOT / "conf" / "arch" / f"{name}.yaml")
    for key in ("name", "tag", "width", "depth", "base_width", "base_depth", "parametrization"):
        assert key in raw, key
    cfg = arch_cfg(name)
    assert cfg.name == name
    assert cfg.tag == name or cfg.tag.startswith(f"{name}_"), cfg.tag  # the tag names it (job dirs, table labels)
    if name in ("convnext", "swin"):
        assert cfg.options.size is None and "drop_path_rate" in raw and cfg.tag == name
    if name == "swin":
        assert cfg.options.drop_path_rate == 0.2
    if name == "mlp":
        assert (cfg.width, cfg.depth, cfg.options.activation, cfg.base_width) == (128, 2, "relu", 128)
        assert arch_cfg("mlp", activation="gelu").tag == "mlp_gelu"


# ---------------------------------------------------------------- builds and shapes


@pytest.mark.parametrize("activation", ["relu", "gelu", "swiglu"])
def test_mlp_activations_parameter_counts(activation: str) -> None:
    for width in PAPER_WIDTHS:
        model, info = build_with_facts(arch_cfg("mlp", activation=activation, width=width), (3, 32, 32), 10)
        relu = mlp_param_count(3072, width, 2, 10)
        assert info["relu_mlp_params"] == relu
        if activation == "swiglu":  # hidden size matched to the ReLU MLP's parameter count
            assert abs(info["params"] / relu - 1) < 0.02
            assert info["hidden"] < width
        else:
            assert info["params"] == relu
            assert isinstance(model, MLP) and len(model.layers) == 2  # depth = number of hidden layers
    if activation == "swiglu":  # an explicit ratio
        info = build_with_facts(arch_cfg("mlp", activation="swiglu", swiglu_ratio=2 / 3), (1, 8, 8), 10)[1]
        assert info["hidden"] == round(2 * 128 / 3)


@pytest.mark.parametrize("shape", [pytest.param(s, marks=() if s == (3, 32, 32) else pytest.mark.slow) for s in INPUTS],
                         ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("size", list(CONVNEXT_SIZES))
@pytest.mark.parametrize("name", ["convnext", "swin"])
def test_named_sizes_build_and_train_one_step(name: str, size: str, shape: tuple[int, int, int]) -> None:
    """On CIFAR's inputs; on every input (slow)."""
    torch.manual_seed(0)
    model, info = build_with_facts(arch_cfg(name, size=size), shape, 10)
    depths, width = (CONVNEXT_SIZES if name == "convnext" else SWIN_SIZES)[size]
    assert info["size"] == size
    assert info["depths"] == list(depths)
    assert info["dims"][0] == width
    before = [p.detach().clone() for p in model.parameters()]
    one_step(model, shape)
    assert any(not torch.equal(a, b) for a, b in zip(before, model.parameters(), strict=True))


@pytest.mark.parametrize("shape", INPUTS, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("name, depth", [(n, 1) for n in ARCHS.names()] + [(n, d) for n in ("mlp", "lenet")
                                                                            for d in (2, 8)])
def test_every_architecture_builds_on_every_input(name: str, depth: int, shape: tuple[int, int, int]) -> None:
    """Every registered architecture (models/registry.py): its model and its facts, on every input shape, built
    deterministically from the global RNG."""
    def build(seed: int) -> tuple[torch.nn.Module, dict[str, Any]]:
        torch.manual_seed(seed)
        return build_with_facts(arch_cfg(name, depth=depth), shape, 7)

    model, info = build(0)
    state, again, other = model.state_dict(), build(0)[0].state_dict(), build(1)[0].state_dict()
    assert all(torch.equal(state[k], again[k]) for k in state)
    assert any(not torch.equal(state[k], other[k]) for k in state)
    model.eval()
    assert model(torch.rand(2, *shape)).shape == (2, 7)
    assert info["arch"] == name and info["params"] == param_count(model) and info["num_classes"] == 7
    json.dumps(info)
    if name == "convnext":  # the patch size rule
        assert info["patch_size"] == (2 if shape == (3, 64, 64) else 1)


def test_convnext_is_v2_and_scales() -> None:
    model, info = build_with_facts(arch_cfg("convnext", width=48, depth=3), (3, 32, 32), 10)
    assert info["depths"] == [3, 3, 9, 3] and info["dims"] == [48, 96, 192, 384]
    names = [n for n, _ in model.named_modules()]
    assert any(n.endswith("mlp.grn") for n in names)  # GlobalResponseNorm: ConvNeXt V2
    stem = model.get_submodule("stem.0")
    assert isinstance(stem, torch.nn.Conv2d) and stem.kernel_size == (1, 1)


GRIDS = {"mlp": [(w, 2) for w in PAPER_WIDTHS] + [(128, d) for d in PAPER_DEPTHS],
         "convnext": [(w, 2) for w in (40, 48, 64, 80, 96, 128)] + [(40, d) for d in (1, 2, 3, 4)]}


@pytest.mark.slow
@pytest.mark.parametrize("name, grid", [("mlp", "mlp"), ("lenet", "mlp"), ("convnext", "convnext"),
                                        ("swin", "convnext")])
def test_width_depth_grid_trains_one_step(name: str, grid: str) -> None:
    """The paper's grid (MLP, LeNet) and timm's (ConvNeXt, Swin)."""
    for width, depth in GRIDS[grid]:
        one_step(build_model(arch_cfg(name, width=width, depth=depth), (3, 32, 32), 10), (3, 32, 32))


# ---------------------------------------------------------------- LeNet parameter matching


@pytest.mark.parametrize("shape", [(1, 28, 28), (3, 32, 32), (3, 64, 64), (1, 8, 8)])
def test_lenet_matches_mlp_within_one_percent(shape: tuple[int, int, int]) -> None:
    for width, depth in GRIDS["mlp"]:
        c1, c2, fc = match_lenet(shape, width, depth, 10)
        lenet = lenet_param_count(shape, c1, c2, fc, depth, 10)
        mlp = mlp_param_count(math.prod(shape), width, depth, 10)
        assert abs(lenet / mlp - 1) <= 0.01, (shape, width, depth, lenet, mlp)
        assert param_count(on_meta(LeNetSpec(shape, width, depth, 10).build)) == lenet  # counts the real module


def test_lenet_info_and_width_scaling() -> None:
    small = build_with_facts(arch_cfg("lenet", width=64), (3, 32, 32), 10)[1]
    large = build_with_facts(arch_cfg("lenet", width=1024), (3, 32, 32), 10)[1]
    assert small["lenet_params"] == small["params"]
    assert abs(small["param_match_rel_err"]) <= 0.01
    assert small["matched_mlp_params"] == mlp_param_count(3072, 64, 2, 10)
    # every hidden size grows with width (all are μP width dimensions)
    assert all(a < b for a, b in zip(small["conv_channels"] + [small["fc_width"]],
                                     large["conv_channels"] + [large["fc_width"]], strict=True))  # fmt: skip
    deep = build_model(arch_cfg("lenet", depth=5), (1, 8, 8), 10)
    assert isinstance(deep, LeNet) and len(deep.fcs) == 5


# ---------------------------------------------------------------- μP wiring


@pytest.mark.parametrize("name", ARCHS.names())
def test_mup_infshapes_readout_and_groups(name: str) -> None:
    base = arch_cfg(name).base_width or arch_traits(name).base_width
    torch.manual_seed(0)
    model = build_model(arch_cfg(name, width=2 * base, depth=2), (1, 8, 8), 10)
    heads = [m for m in model.modules() if isinstance(m, MuReadout)]
    assert len(heads) == 1 and torch.count_nonzero(heads[0].weight) == 0  # zero-initialised μP readout
    assert torch.count_nonzero(model(torch.rand(2, 1, 8, 8))) == 0
    for n, m in model.named_modules():
        if isinstance(m, (torch.nn.Linear, torch.nn.Conv2d)) and "cpb_mlp" not in n:  # SwinV2's fixed pos-MLP
            assert _infshape(m.weight).ninf() >= 1, n  # base/delta differ in every hidden size
    mults = {round(_infshape(p).width_mult(), 6) for p in model.parameters() if _infshape(p).ninf() == 2}
    assert mults and all(1.3 < w <= 2.0 for w in mults)
    opt = optimizer(model, lr=1e-3, beta1=0.9, warmup_steps=5)
    lrs = sorted({g["lr"] for g in opt.param_groups})
    assert lrs[-1] == pytest.approx(1e-3) and lrs[0] < 1e-3  # hidden matrices get lr / width_mult
    assert all(g["warmup_steps"] == 5 and g["betas"] == (0.9, 0.999) for g in opt.param_groups)


def test_mup_hidden_init_scales_with_fan_in_and_the_sp_control_is_standard() -> None:
    torch.manual_seed(0)
    narrow = build_model(arch_cfg("mlp", width=128), (3, 32, 32), 10)
    wide = build_model(arch_cfg("mlp", width=2048), (3, 32, 32), 10)
    ratio = (narrow.get_parameter("layers.1.weight").std() / wide.get_parameter("layers.1.weight").std()).item()
    assert ratio == pytest.approx(4.0, rel=0.05)  # std ∝ fan_in^{-1/2}
    conv = [build_model(arch_cfg("convnext", width=w, depth=1), (3, 32, 32), 10) for w in (40, 160)]
    stds = [m.get_parameter("stages.1.blocks.0.mlp.fc1.weight").std().item() for m in conv]
    assert stds[0] == pytest.approx(0.02, rel=0.05)  # timm's init at base width ...
    assert stds[1] == pytest.approx(0.01, rel=0.05)  # ... μP-scaled at 4x width
    swin = build_model(arch_cfg("swin", depth=1), (3, 32, 32), 10)
    assert torch.allclose(swin.get_parameter("layers.0.blocks.0.attn.logit_scale"), torch.tensor(math.log(10)))
    # the SP control is standard
    model = build_model(arch_cfg("mlp"), (1, 8, 8), 10, parametrization="sp")
    assert torch.count_nonzero(model.get_parameter("readout.weight")) > 0
    assert all(_infshape(p).ninf() == 0 for p in model.parameters())
    opt = optimizer(model, lr=1e-3, beta1=0.9)
    assert {g["lr"] for g in opt.param_groups} == {1e-3}


# ---------------------------------------------------------------- defaults and the depth rule


def _paper_optim(arch: str, eraser: str, dataset: str = "cifar10") -> dict[str, float]:
    """The optimiser settings a job gets from conf/ (arch.paper_optim, dataset.paper_lr) with no optim override."""
    o = job_config(ROOT / "unused", [f"arch={arch}", f"eraser={eraser}", f"dataset={dataset}"])["optim"]
    return {"lr": o["lr"], "beta1": o["beta1"], "warmup_steps": o["warmup_steps"]}


def test_paper_defaults() -> None:
    assert _paper_optim("mlp", "control") == {"lr": 5e-4, "beta1": 0.95, "warmup_steps": 1000}
    assert _paper_optim("mlp", "leace", "svhn")["lr"] == 1e-4
    assert _paper_optim("lenet", "qleace") == {"lr": 5e-4, "beta1": 0.95, "warmup_steps": 0}
    convnext = {e: _paper_optim("convnext", e)["lr"] for e in
                ("control", "leace", "qleace", "alf_qleace", "gradient", "random")}  # fmt: skip
    assert convnext == {"control": 5e-5, "leace": 1e-4, "qleace": 1e-3, "alf_qleace": 1e-3,
                        "gradient": 1e-3, "random": 1e-4}  # fmt: skip
    assert _paper_optim("convnext", "alf_qleace")["beta1"] == 0.9
    assert _paper_optim("swin", "leace") == {"lr": 1e-3, "beta1": 0.9, "warmup_steps": 0}
    assert _paper_optim("lenet", "leace", "svhn")["lr"] == 5e-4  # the SVHN exception is the MLP's only


def test_depth_lr_multiplier() -> None:
    assert depth_lr_multiplier(arch_cfg("mlp", depth=2)) == 1.0
    assert depth_lr_multiplier(arch_cfg("mlp", depth=8)) == pytest.approx((2 / 8) ** 1.5)
    assert depth_lr_multiplier(arch_cfg("mlp", depth=1)) == pytest.approx(2**1.5)
    assert depth_lr_multiplier(arch_cfg("lenet", depth=8)) == pytest.approx(0.5)
    assert depth_lr_multiplier(arch_cfg("convnext", depth=3)) == pytest.approx((2 / 3) ** 0.5)
    assert depth_lr_multiplier(arch_cfg("swin", depth=4)) == pytest.approx(0.5**0.5)
    assert depth_lr_multiplier(arch_cfg("convnext", size="nano")) == pytest.approx((12 / 14) ** 0.5)
    assert depth_lr_multiplier(arch_cfg("convnext", size="tiny")) == pytest.approx((2 / 3) ** 0.5)


# ---------------------------------------------------------------- GPU


@pytest.mark.gpu
@pytest.mark.parametrize("name", ARCHS.names())
def test_forward_backward_cuda(name: str) -> None:
    torch.manual_seed(0)
    model = build_model(arch_cfg(name), (3, 32, 32), 10).cuda()
    opt = optimizer(model, lr=1e-3, beta1=0.9)
    model.train()
    opt.train()
    x, y = torch.rand(8, 3, 32, 32, device="cuda"), torch.arange(8, device="cuda") % 10
    for _ in range(2):
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert torch.isfinite(loss)
    assert all(p.grad is not None and p.grad.is_cuda for p in model.parameters() if p.requires_grad)


def test_swin_has_the_paper_codes_shape_by_default() -> None:
    """4 stages [2, 2, 6, 2], heads [2, 4, 8, 16], window 7 (timm pads the 16×16 grid to 21×21 and uses the
    whole grid where it is at most 7 wide), drop path 0.2; the 3-stage shape stays available."""
    model, info = build_with_facts(arch_cfg("swin"), (3, 32, 32), 10)
    assert info["depths"] == [2, 2, 6, 2] and info["num_heads"] == [2, 4, 8, 16]
    assert info["dims"] == [40, 80, 160, 320] and info["drop_path_rate"] == 0.2 and info["patch_size"] == 2
    assert info["window_sizes"] == [7, 7, 4, 2]
    stages: Any = model.layers  # timm's SwinV2 stages: nn.Module types a submodule reached by name Tensor | Module
    assert [blk.window_size for stage in stages for blk in stage.blocks][:2] == [(7, 7), (7, 7)]
    one_step(model, (3, 32, 32))
    small = build_with_facts(arch_cfg("swin", stages=3, window_size=None), (3, 32, 32), 10)[1]
    assert small["depths"] == [2, 2, 6] and small["num_heads"] == [2, 4, 8] and small["window_sizes"] == [4, 4, 4]
    assert build_with_facts(arch_cfg("swin", size="tiny", stages=3), (3, 32, 32), 10)[1]["depths"] == [2, 2, 6]
    with pytest.raises(ValueError, match="stages"):
        build_model(arch_cfg("swin", stages=5), (3, 32, 32), 10)
    # automatic windows divide every stage of the 3-stage shape (arch.stages=3 arch.window_size=null)
    for shape, windows in [((3, 32, 32), [4, 4, 4]), ((1, 28, 28), [7, 7, 4]), ((1, 8, 8), [4, 2, 1])]:
        info = build_with_facts(arch_cfg("swin", width=48, depth=3, stages=3, window_size=None), shape, 10)[1]
        assert info["window_sizes"] == windows
        assert info["depths"] == [3, 3, 9] and info["num_heads"] == [2, 4, 8]
    with pytest.raises(ValueError, match="divisible"):
        build_model(arch_cfg("swin", width=41), (3, 32, 32), 10)


@pytest.mark.parametrize("name", ["mlp", "lenet"])
def test_depth_counts_linear_layers_as_the_paper_code(name: str) -> None:
    """`depth_counts: linear`: depth = Linear layers incl. the readout (EleutherAI/mdl num_layers), so depth d
    builds the model with d - 1 hidden layers; `hidden` (default) counts hidden layers."""
    for d in (2, 3, 5):
        paper, info = build_with_facts(arch_cfg(name, depth=d, depth_counts="linear"), (1, 8, 8), 10)
        ours = build_model(arch_cfg(name, depth=d - 1), (1, 8, 8), 10)
        assert info["depth"] == d - 1
        assert sum(p.numel() for p in paper.parameters()) == sum(p.numel() for p in ours.parameters())
        linears = [m for m in paper.modules() if isinstance(m, torch.nn.Linear)]
        if name == "mlp":
            assert len(linears) == d  # d - 1 hidden layers + the μP readout
    with pytest.raises(ValueError, match="linear probe"):
        build_model(arch_cfg(name, depth=1, depth_counts="linear"), (1, 8, 8), 10)
    with pytest.raises(ValueError, match="depth_counts"):
        build_model(arch_cfg(name, depth_counts="blocks"), (1, 8, 8), 10)
