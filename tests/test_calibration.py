"""Calibration against a known answer through the real pipeline (issue 29): erased class-conditional Gaussians
code at H(Y) when the eraser is fitted on the population (fit_on=oracle), in sample (all) reads at or above it,
out of sample (holdout) at or below it; a two-mode mixture keeps information QLEACE cannot remove.

The learner must be able to learn this data, or every test below would pass trivially: the unerased control codes
well below H(Y) on it (checked)."""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pytest

from tests.helpers import job_config
from training.mdl.job import run_job

CAL = ["experiment=calibrate", "dataset.dim=16", "dataset.rows_per_dim=16", "mdl.val_size=256", "mdl.min_block=64"]
H = math.log2(4)
TOL = 0.02


def _bits(tmp: Path, *overrides: str) -> float:
    return float(run_job(job_config(tmp, [*CAL, *overrides])).result["mdl"]["bits_per_sample"])


@pytest.mark.parametrize("eraser, cov_gap", [("qleace", 1.0), ("leace", 0.0)], ids=["qleace", "leace-equal-cov"])
def test_population_erasure_codes_at_the_label_entropy(eraser: str, cov_gap: float, tmp_path: Path) -> None:
    data = [f"dataset.cov_gap={cov_gap}"]
    assert _bits(tmp_path, *data, "eraser=control") < H - 0.2  # the data is learnable: erasure has work to do
    oracle = _bits(tmp_path, *data, f"eraser={eraser}", "eraser.fit_on=oracle")
    assert abs(oracle - H) <= TOL
    assert _bits(tmp_path, *data, f"eraser={eraser}", "eraser.fit_on=all") >= H - TOL  # in sample: not below
    assert _bits(tmp_path, *data, f"eraser={eraser}", "eraser.fit_on=holdout") <= H + TOL  # out of sample: not above


def test_leace_on_unequal_covariances_leaves_information_the_oracle_cannot_remove(tmp_path: Path) -> None:
    """A case where the truth is NOT H(Y): LEACE removes means only, so with a covariance gap the oracle codes
    below H (the check above must not pass for any eraser on any data)."""
    assert _bits(tmp_path, "dataset.cov_gap=4", "eraser=leace", "eraser.fit_on=oracle") < H - 0.1


def test_mixture_keeps_information_through_population_qleace(tmp_path: Path) -> None:
    """Two modes per class: QLEACE fitted on the population codes below H(Y) = 1 bit by more than the seed noise
    (3 seeds, each with its own data)."""
    mix = ["dataset=mixture", "dataset.dim=4", "dataset.num_classes=2", "dataset.mean_gap=0", "dataset.rows_per_dim=64",
           "eraser=qleace", "eraser.fit_on=oracle"]
    bits = [_bits(tmp_path, *mix, f"seed={s}") for s in range(3)]
    gap = 1.0 - statistics.fmean(bits)
    assert gap > 0.05 and gap > 3 * statistics.stdev(bits), bits
    # the table (scripts/calibrate.py): the truth is H(Y|X') under population QLEACE, below H and below the MDL
    from scripts.calibrate import collect, table, truth

    cells, options = collect(tmp_path / "runs", "calibrate")
    [(key, by_fit)] = cells.items()
    assert key == ("mixture", 0.0, 64.0, "qleace", 2) and sorted(by_fit["oracle"]) == sorted(bits)
    bound, _ = truth(*key[:1], "qleace", 0.0, 2, options[key])
    assert bound is not None and bound < 1.0 - 0.3 and min(bits) > bound  # a finite-data code reads above it
    row = table(cells, options).splitlines()[2]
    assert f"{bound:.3f} = H(Y|X')" in row and f"{statistics.fmean(bits) - bound:+.3f}" in row


def test_mixture_truth_tends_to_h_as_its_modes_merge(tmp_path: Path) -> None:
    """H(Y|X') after population QLEACE: 1 bit when each class is (nearly) one Gaussian, well below with two modes."""
    from training.app.schema import load_config
    from training.data.generators import mixture_truth_bits

    def bound(separation: float) -> float:
        cfg = load_config(job_config(tmp_path, ["dataset=mixture", f"dataset.separation={separation}"]))
        return mixture_truth_bits(cfg.dataset.options, 5000)

    assert abs(bound(0.01) - 1.0) < 1e-6
    assert bound(6.0) < 0.6 < bound(3.0) < 0.9
