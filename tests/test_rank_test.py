"""The rank-regularity test of a fitted linear eraser (erasure/rank_test.py): on generator data at 256 rows per
class it flags the equal-means fits (population LEACE is the identity: every removed direction is noise) and not the
regular ones; a job's result records it for every fitted LEACE (not for the population or oracle fit, nor for
erasers it does not describe); result.json and the aggregate read it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from erasure.rank_test import rank_test
from tests.helpers import job_config
from training.app.tasks import load_job
from training.data.generators import GaussianOptions, draw
from training.inputs.pipeline import prepare_inputs
from training.inputs.store import Store
from training.tasks.mdl.result import ErasureRecord

FITS = 60  # independent data laws per cell


def _flag_rate(cov_gap: float, mean_gap: float) -> float:
    flags = []
    for law in range(FITS):
        o = GaussianOptions(dim=32, num_classes=4, rows_per_dim=8, mean_gap=mean_gap, cov_gap=cov_gap, sigma=1.0,
                            data_seed=law)
        x, y = draw(o, 256, 7)
        flags.append(rank_test(x, y, seed=law)["rank_irregular"])
    return sum(flags) / len(flags)


def test_equal_means_fits_are_flagged_and_regular_fits_are_not() -> None:
    """The calibration's two Gaussian laws (d = 32, K = 4) at 256 rows per class: equal means (cov gap 1, mean gap
    0) flagged in ≥ 90% of fits, regular ones (cov gap 4, mean gap 1) in ≤ 5%."""
    assert _flag_rate(1.0, 0.0) >= 0.90
    assert _flag_rate(4.0, 1.0) <= 0.05


def test_the_test_is_a_permutation_test_of_the_weakest_removed_direction() -> None:
    """Labels aligned with two of three directions only (K = 4, one class mean equal to another's): the weakest
    removed direction is noise, so flagged although the strongest is far from it; p in (0, 1], seeded."""
    g = torch.Generator().manual_seed(0)
    y = torch.arange(4 * 400) % 4
    x = torch.randn(len(y), 16, generator=g, dtype=torch.float64)
    x[:, 0] += 2.0 * (y == 1)  # classes 2 and 3 share class 0's mean: the means span 2 of the 3 directions
    x[:, 1] += 2.0 * (y >= 2)
    out = rank_test(x, y)
    assert out["rank_irregular"] and 0 < out["p"] <= 1 and out["rank_tested"] == 3
    assert out["alignment"][0] > 10 * out["null_weakest"] and out["alignment"][2] < 3 * out["null_weakest"]
    x[:, 2] += 2.0 * (y == 3)  # now every removed direction carries the label
    full = rank_test(x, y)
    assert not full["rank_irregular"] and full["p"] == pytest.approx(1 / 100)
    assert rank_test(x, y) == full  # seeded: the same permutations
    # rows no more than the support: every labelling gives the same singular values, irregular by construction
    assert rank_test(x[:12], y[:12])["p"] == 1.0


GAUSS = ["experiment=smoke", "mdl.full_run=false", "dataset=gaussian", "dataset.dim=8", "dataset.rows_per_dim=8",
         "dataset.mean_gap=1", "dataset.cov_gap=1", "eraser.fit_fraction=0.5", "seed=2", "certificate=false"]


@pytest.mark.parametrize(("eraser", "fit_on", "tested"), [
    ("leace", "self", True), ("leace", "holdout", True), ("leace", "all", True), ("leace", "population", False),
    ("leace", "oracle", False), ("control", "all", False), ("qleace", "self", False), ("random", "all", False)])
def test_every_fitted_leace_records_its_rank_test(eraser: str, fit_on: str, tested: bool, tmp_path: Path) -> None:
    cfg = load_job(job_config(tmp_path, [*GAUSS, f"eraser={eraser}", f"eraser.fit_on={fit_on}"]))
    inputs = prepare_inputs(cfg, Store.of(cfg.paths))
    coded, info = inputs.data, inputs.erasure
    assert ("rank_test" in info) == tested
    record = ErasureRecord.of(info)
    assert record.rank_irregular == (info["rank_test"]["rank_irregular"] if tested else None)
    if tested and fit_on == "self":  # the test of the rows the eraser was fitted on: here the coded rows
        assert info["rank_test"] == rank_test(coded.x, coded.y)


def test_the_shuffled_fit_is_tested_on_the_labels_it_was_fitted_on(tmp_path: Path) -> None:
    """The non-specific-removal control: fitted on shuffled labels, its removed directions are noise."""
    cfg = load_job(job_config(tmp_path, [*GAUSS, "eraser=leace", "eraser.fit_on=self", "eraser.fit_labels=shuffled",
                                         "dataset.rows_per_dim=32"]))
    true = load_job(job_config(tmp_path, [*GAUSS, "eraser=leace", "eraser.fit_on=self", "dataset.rows_per_dim=32"]))
    assert prepare_inputs(cfg, Store.of(cfg.paths)).erasure["rank_test"]["rank_irregular"]
    assert not prepare_inputs(true, Store.of(true.paths)).erasure["rank_test"]["rank_irregular"]
