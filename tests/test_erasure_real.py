"""Real rank-deficient data (constant MNIST borders, n_k < d): sklearn digits and MNIST-5k."""

from __future__ import annotations

import warnings

import pytest
import torch
from torch import Tensor

import erasure

from .test_erasure_common import digits, mnist5k

# One worker under `-n`, so each dataset's erasers are fitted once (module fixtures are per worker).
pytestmark = pytest.mark.xdist_group("expensive_module_fixtures")


@pytest.fixture(scope="module", params=["digits", "mnist5k"])
def data(request: pytest.FixtureRequest) -> tuple[str, Tensor, Tensor]:
    x, y = digits() if request.param == "digits" else mnist5k()
    return request.param, x, y


@pytest.fixture(scope="module")
def fitted(data: tuple[str, Tensor, Tensor]) -> dict[str, tuple[Tensor, dict, list[str], dict]]:
    """name -> (erased x, report, warning messages, certificate), each computed once per dataset."""
    _, x, y = data
    out: dict[str, tuple[Tensor, dict, list[str], dict]] = {"control": (x, {}, [], erasure.certificate(x, y))}
    for name in ("leace", "qleace", "alf_qleace"):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            xe, rep = erasure.erase(name, x, y, {})
        msgs = [str(w.message) for w in caught if issubclass(w.category, UserWarning)]
        out[name] = (xe, rep, msgs, erasure.certificate(xe, y))
    return out


def test_qleace_rank_deficient_real_data(data: tuple[str, Tensor, Tensor], fitted: dict) -> None:
    name, x, y = data
    xe, rep, caught, cert = fitted["qleace"]
    assert torch.isfinite(xe).all()
    assert len(caught) == 1 and "rank-deficient" in caught[0]  # warned once
    # default coupling: keeps min(support, n_k − 1) directions, exact moments, a little noise on class null spaces
    assert rep["rank_handling"] == "coupling" and rep["support_rank"] < x.shape[1]
    n_min = min(rep["class_counts"])
    assert rep["working_rank"] == min(rep["support_rank"], n_min - 1)
    assert rep["barycenter_stopped_by"] in ("residual", "objective")
    assert max(rep["noise_rank"]) > 0 and 0 < rep["max_noise_share"] < 0.1
    assert rep["variance_dropped_fraction"] < 0.01
    assert cert["max_mean_gap"] <= 1e-10
    assert cert["max_cov_gap"] <= 1e-10
    before = fitted["control"][3]
    assert before["max_cov_gap"] > 1.0 and before["quadratic_probe_acc"] > 0.8
    # equal class moments leave held-out probes no better than chance (see certificate() on below-chance)
    assert cert["linear_probe_acc"] <= cert["chance"] + 0.02
    assert cert["quadratic_probe_acc"] <= cert["chance"] + 0.02


def test_alf_and_leace_real_data(data: tuple[str, Tensor, Tensor], fitted: dict) -> None:
    _, x, y = data
    for name in ("leace", "alf_qleace"):
        xe, rep, caught, cert = fitted[name]
        assert torch.isfinite(xe).all() and not caught
        assert cert["max_mean_gap"] <= 1e-10
        assert cert["linear_probe_acc"] <= cert["chance"] + 0.05
    rep = fitted["alf_qleace"][1]
    assert rep["stopped_by"] == "target" and rep["deviation_ratio"] <= 0.1 + 1e-9
    assert rep["leace_rank"] == 9 and rep["alf_directions"] > 0
    assert fitted["alf_qleace"][3]["max_cov_gap"] < fitted["leace"][3]["max_cov_gap"]
    # LEACE leaves covariance information: the quadratic probe stays well above chance
    assert fitted["leace"][3]["quadratic_probe_acc"] > 0.5
