"""Library API: erase() for all six names, save/load, reports, configs, random baseline, gradient erasure (the
paper's squared loss, §2.4, and optional 8-bit quantisation)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from torch import Tensor

import erasure
from erasure.base import FORMAT
from erasure.gradient import DEFAULTS, _loss, erase_dataset

from .test_erasure_common import ALL_FITTED, F64, gaussian_classes, max_cov_gap, max_mean_gap

CONF = Path(__file__).resolve().parents[1] / "conf" / "eraser"


@pytest.fixture(scope="module")
def images() -> tuple[Tensor, Tensor]:
    """Tiny float32 'images' in [0, 1], (n, 1, 4, 4), with class-dependent means and covariances."""
    x, y = gaussian_classes(400, 16, 3, seed=3, cov_scale=0.6)
    return torch.sigmoid(x).float().reshape(400, 1, 4, 4), y


@pytest.mark.parametrize("name", erasure.NAMES)
def test_erase_every_name(images: tuple[Tensor, Tensor], name: str) -> None:
    cfg = yaml.safe_load((CONF / f"{name}.yaml").read_text())  # its config lists every option with its default
    assert cfg["name"] == name and cfg["options"] == erasure.default_options(name)
    x, y = images
    opts = {"iterations": 5, "progress": False} if name == "gradient" else {}
    out, rep = erasure.erase(name, x, y, opts)
    assert out.shape == x.shape and out.dtype == x.dtype and out.device == x.device
    assert torch.isfinite(out).all()
    json.dumps(rep)  # JSON-serialisable
    assert rep["name"] == name and "warnings" in rep and rep["seconds"] >= 0
    if name == "control":
        assert torch.equal(out, x)
    if name in ("leace", "qleace", "alf_qleace"):
        assert max_mean_gap(out, y) < 1e-5  # float32 output rounding only
    if name == "qleace":
        assert max_cov_gap(out, y) < 1e-5
    assert torch.equal(erasure.erase(name, x.numpy(), y.numpy(), opts)[0], out)  # numpy in: the same tensor out


@pytest.mark.parametrize("name", ALL_FITTED)
def test_save_load_roundtrip(images: tuple[Tensor, Tensor], tmp_path: Path, name: str) -> None:
    x, y = images
    e = erasure.fit(name, x, y)
    e.report()["warnings"].append("tampered")  # the report is a copy
    assert "tampered" not in e.report()["warnings"]
    path = tmp_path / "sub" / f"{name}.pt"
    e.save(path)
    back = erasure.load(path)
    assert type(back) is type(e) and back.report() == e.report()
    args = (x, y) if e.needs_labels else (x,)
    out = e(*args)
    assert out.shape == x.shape and out.dtype == torch.float32
    assert torch.equal(back(*args), out) and torch.equal(e(*(a.numpy() for a in args)), out)  # numpy in, same out
    assert not list(path.parent.glob("*.tmp"))
    torch.save({"hello": 1}, tmp_path / "x.pt")  # foreign files are refused
    with pytest.raises(ValueError, match="not an eraser file"):
        erasure.load(tmp_path / "x.pt")
    torch.save({"format": FORMAT, "info": {}}, tmp_path / "half.pt")  # the format, not the rest: no KeyError
    with pytest.raises(ValueError, match="not an eraser file"):
        erasure.load(tmp_path / "half.pt")


def test_random_rank_sources(images: tuple[Tensor, Tensor]) -> None:
    x, y = images
    _, rep = erasure.erase("random", x, y, {})
    assert rep["rank_removed"] == 2 and rep["rank_source"].startswith("num_classes") and rep["warnings"]
    _, rep = erasure.erase("random", x, y, {}, rank_hint=5)
    assert rep["rank_removed"] == 5 and rep["rank_source"] == "rank_hint"
    out, rep = erasure.erase("random", x, y, {"rank": 7, "seed": 1}, rank_hint=5)
    assert rep["rank_removed"] == 7 and rep["rank_source"] == "option"
    flat = out.reshape(len(out), -1).double()
    assert int(torch.linalg.matrix_rank(flat - flat.mean(0), atol=1e-5)) == 16 - 7
    e = erasure.fit("random", x, y, rank=7, seed=1)
    v = e.state["directions"]
    assert torch.allclose(v.T @ v, torch.eye(7, dtype=v.dtype), atol=1e-12)
    assert not torch.equal(v, erasure.fit("random", x, y, rank=7, seed=2).state["directions"])


def test_gradient_erasure_reduces_moment_gaps() -> None:
    x, y = gaussian_classes(600, 12, 3, seed=6, cov_scale=0.6)
    x = torch.sigmoid(x).float()
    out, rep = erase_dataset(x, y, return_report=True, w_mean=1.0, w_cov=1.0, w_mse=1.0, iterations=30,
                             progress=False, device="cpu")
    assert out.shape == x.shape and out.dtype == x.dtype
    assert float(out.min()) > 0 and float(out.max()) < 1  # sigmoid keeps pixels in range
    assert rep["max_mean_gap_after"] < 0.3 * rep["max_mean_gap_before"]
    assert rep["max_cov_gap_after"] < 0.5 * rep["max_cov_gap_before"]
    x64, o64 = x.double(), out.double()
    gaps = [float((o64[y == c].mean(0) - x64.mean(0)).norm()) for c in range(3)]  # vs the original moments
    assert rep["max_mean_gap_after"] == pytest.approx(max(gaps) / float(torch.cov(x64.T).trace().sqrt()), rel=1e-4)
    assert 0 < rep["mean_squared_edit"] == pytest.approx(float(((out - x) ** 2).mean()), rel=1e-3)
    assert all(0 < p["iterations"] <= 30 for p in rep["per_class"])
    # a large edit penalty keeps the images almost unchanged
    kept = erase_dataset(x, y, w_mean=1e-6, w_cov=1e-6, w_mse=1.0, iterations=10, progress=False, device="cpu")
    assert float((kept - x).abs().max()) < 2e-3


def test_loss_is_the_squared_distances_and_so_are_its_gradients() -> None:
    """∂/∂X w‖m − μ‖² = 2w(m − μ)/n per row and ∂/∂X w‖Σ_k − Σ‖_F² = 4w/(n−1)·X_c(Σ_k − Σ): linear in the gap
    (an unsquared norm would give a unit-length direction instead)."""
    x, y = gaussian_classes(300, 6, 2, seed=2, cov_scale=0.7)
    x = torch.sigmoid(x)
    mu, sigma = x.mean(0), torch.cov(x.T)
    xk0 = x[y == 0]
    xk = xk0 + 0.01 * torch.randn(xk0.shape, generator=torch.Generator().manual_seed(1), dtype=F64)
    o = {**DEFAULTS, "w_mean": 0.3, "w_cov": 0.7, "w_mse": 2.0}
    with torch.no_grad():
        loss, stats = _loss(xk, xk0, mu, sigma, o)
    mean_sq = float((xk.mean(0) - mu).pow(2).sum())
    cov_sq = float((torch.cov(xk.T) - sigma).pow(2).sum())
    mse = float((xk - xk0).pow(2).mean())
    assert float(loss) == pytest.approx(0.3 * mean_sq + 0.7 * cov_sq + 2.0 * mse, rel=1e-12)
    # the reported gaps stay relative norms (not squared)
    assert stats["mean_gap"] == pytest.approx(mean_sq**0.5 / float(torch.trace(sigma)) ** 0.5, rel=1e-12)
    assert stats["cov_gap"] == pytest.approx(cov_sq**0.5 / float(torch.linalg.matrix_norm(sigma)), rel=1e-12)
    n = len(xk)
    for w_mean, w_cov in ((1.0, 0.0), (0.0, 1.0)):
        xg = xk.clone().requires_grad_(True)
        o = {**DEFAULTS, "w_mean": w_mean, "w_cov": w_cov, "w_mse": 0.0}
        (grad,) = torch.autograd.grad(_loss(xg, xk0, mu, sigma, o)[0], xg)
        xc = xk - xk.mean(0)
        expected = (2 * (xk.mean(0) - mu) / n).expand_as(xk) if w_mean else 4 / (n - 1) * xc @ (torch.cov(xk.T) - sigma)
        assert torch.allclose(grad, expected, rtol=1e-10, atol=1e-14)


def test_quantize_rounds_to_8_bits_and_reports_gaps_after_rounding() -> None:
    x, y = gaussian_classes(400, 10, 2, seed=5, cov_scale=0.6)
    x = (torch.sigmoid(x) * 255).round() / 255
    out, rep = erasure.erase("gradient", x, y, {"iterations": 20, "quantize": True, "progress": False,
                                                  "device": "cpu", "w_mean": 1.0, "w_cov": 1.0})
    assert rep["quantized"] and rep["loss"] == "squared"
    assert torch.equal(out, (out * 255).round() / 255)
    assert float(out.min()) >= 0 and float(out.max()) <= 1
    gaps = [float((out[y == c].mean(0) - x.mean(0)).norm()) for c in range(2)]
    assert rep["max_mean_gap_after"] == pytest.approx(max(gaps) / float(torch.cov(x.T).trace().sqrt()), rel=1e-9)
    assert rep["max_mean_gap_after"] < rep["max_mean_gap_before"]
    plain, rep_plain = erasure.erase("gradient", x, y, {"iterations": 20, "progress": False, "device": "cpu",
                                                          "w_mean": 1.0, "w_cov": 1.0})
    assert not rep_plain["quantized"] and not torch.equal(plain, (plain * 255).round() / 255)
    assert float((plain - out).abs().max()) <= 0.5 / 255 + 1e-12  # the same optimisation, rounded


def test_resolve_options_is_canonical() -> None:
    assert erasure.resolve_options("alf_qleace", {}) == erasure.resolve_options(
        "alf_qleace", erasure.default_options("alf_qleace"))
    assert erasure.resolve_options("qleace", {"tol": 1e-6})["tol"] == 1e-6
    with pytest.raises(TypeError, match="unknown options"):
        erasure.resolve_options("leace", {"bogus": 1})
