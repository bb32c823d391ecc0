"""Certificate: moment gaps and held-out probes separate linear from quadratic information."""

from __future__ import annotations

import json

import pytest
from torch import Tensor

import erasure

from .test_erasure_common import gaussian_classes, max_cov_gap, max_mean_gap


@pytest.fixture(scope="module")
def data() -> tuple[Tensor, Tensor]:
    # means differ a little, covariances a lot: a linear probe is weak-ish, QDA strong
    return gaussian_classes(3000, 10, 3, seed=12, mean_scale=0.5, cov_scale=1.2)


def test_control_probes_see_the_classes(data: tuple[Tensor, Tensor]) -> None:
    x, y = data
    cert = erasure.certificate(x, y)
    json.dumps(cert)
    assert cert["max_mean_gap"] == pytest.approx(max_mean_gap(x, y), rel=1e-9)
    assert cert["max_cov_gap"] == pytest.approx(max_cov_gap(x, y), rel=1e-9)
    assert cert["linear_probe_acc"] > cert["chance"] + 0.1
    assert cert["quadratic_probe_acc"] > cert["linear_probe_acc"] + 0.1
    assert cert["n_train"] + cert["n_test"] == len(x) and abs(cert["n_train"] - cert["n_test"]) <= 3
    assert cert["chance"] == pytest.approx(0.33, abs=0.05)
    again = erasure.certificate(x, y)
    again.pop("seconds"), cert.pop("seconds")
    assert again == cert  # deterministic split and probes
    image32 = erasure.certificate(x.float().reshape(len(x), 1, 2, 5), y)
    flat32 = erasure.certificate(x.float(), y)
    image32.pop("seconds"), flat32.pop("seconds")
    assert image32 == flat32  # images and float32: the same certificate as flat rows


def test_leace_removes_linear_but_not_quadratic_information_and_qleace_both(data: tuple[Tensor, Tensor]) -> None:
    x, y = data
    cert = erasure.certificate(erasure.fit("leace", x, y)(x), y)
    assert cert["max_mean_gap"] < 1e-10 and cert["max_cov_gap"] > 0.3
    assert abs(cert["linear_probe_acc"] - cert["chance"]) < 0.05
    assert cert["quadratic_probe_acc"] > cert["chance"] + 0.2
    cert = erasure.certificate(erasure.erase("qleace", x, y, {})[0], y)
    assert cert["max_mean_gap"] < 1e-10 and cert["max_cov_gap"] < 1e-8
    assert cert["linear_probe_acc"] < cert["chance"] + 0.05
    assert cert["quadratic_probe_acc"] < cert["chance"] + 0.05


def test_mlp_probe_finds_what_linear_and_quadratic_probes_cannot_and_nothing_in_random_labels() -> None:
    """y = [x1·x2·x3 > 0] on Gaussian x: equal class means and covariances, so the linear and quadratic probes see
    nothing; the MLP probe does. With the labels permuted it must not fire. It leaves the global RNG alone (the
    MDL training after it draws the same numbers)."""
    import torch

    g = torch.Generator().manual_seed(3)
    x = torch.randn(4000, 6, generator=g, dtype=torch.float64)
    y = (x[:, 0] * x[:, 1] * x[:, 2] > 0).long()
    state = torch.get_rng_state()
    cert = erasure.certificate(x, y)
    assert torch.equal(torch.get_rng_state(), state)
    assert cert["linear_probe_verdict"] == cert["quadratic_probe_verdict"] == "no information detected"
    assert cert["mlp_probe_verdict"] == "information" and cert["mlp_probe_acc"] > 0.75
    assert cert["verdict"] == "information" and cert["probe_settings"]["mlp"][0]["temperature"] > 0
    shuffled = erasure.certificate(x, y[torch.randperm(len(y), generator=g)])
    assert shuffled["mlp_probe_verdict"] == "no information detected"
    assert abs(shuffled["mlp_probe_loss_z"]) < 3.0
    again = erasure.certificate(x, y)
    assert again["mlp_probe_loss_bits"] == cert["mlp_probe_loss_bits"]  # seeded: the same probe every time
