"""μP coordinate check of every registered architecture (models.registry.ARCHS, each with the settings it declares:
`CoordSettings`): activation size is flat in width under μP and grows under SP (the control)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from sklearn.datasets import load_digits

from models.coord import LOGITS, coord_check, slope
from models.registry import ARCHS, arch_traits
from training.app.schema import group_config


@pytest.fixture(scope="module")
def batch() -> tuple[torch.Tensor, torch.Tensor]:
    d = load_digits()
    x = torch.tensor(d.data[:64], dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
    return x, torch.tensor(d.target[:64])


def test_slope_fit() -> None:
    assert slope([1, 2, 4, 8], [3, 6, 12, 24]) == pytest.approx(1.0)
    assert slope([1, 2, 4], [5, 5, 5]) == pytest.approx(0.0)


@pytest.mark.parametrize("name", ARCHS.names())
def test_coord_check(name: str, batch: tuple[torch.Tensor, torch.Tensor]) -> None:
    settings = arch_traits(name).coord
    arch = group_config("arch", name, **settings.arch)
    mup = coord_check(arch, settings, batch, parametrization="mup", seeds=(0, 1), num_classes=10)
    sp = coord_check(arch, settings, batch, parametrization="sp", seeds=(0, 1), num_classes=10)
    assert len(mup.slopes) > 3 and LOGITS in mup.slopes
    assert max(mup.widths) / min(mup.widths) >= 8
    assert mup.max_abs_slope < 0.2, sorted(mup.slopes.items(), key=lambda kv: -abs(kv[1]))[:3]
    assert sp.max_slope > 0.5, sorted(sp.slopes.items(), key=lambda kv: -kv[1])[:3]  # the check can fail


@pytest.mark.slow
def test_coord_check_script_writes_plots(tmp_path: Path) -> None:
    from scripts.coord_check import main

    assert main(["--arch", "mlp", "--seeds", "1", "--out", str(tmp_path)]) == 0
    assert (tmp_path / "mlp_mup_digits.png").stat().st_size > 0 and (tmp_path / "mlp_sp_digits.png").exists()
    assert (tmp_path / "slopes_digits.json").exists()
