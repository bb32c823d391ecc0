"""eraser.fit_on=holdout and the permuted-label control through a real job (issue 21): what is fitted, what is
coded, what the null codes at."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from tests.helpers import job_config, prepare_data, result_of
from training.app.schema import ConfigError
from training.app.tasks import load_job
from training.data import load_dataset
from training.tasks.mdl.job import run_job

SMOKE = ["experiment=smoke", "mdl.full_run=false"]


def _entropy_bits(y: torch.Tensor) -> float:
    p = torch.bincount(y).double() / len(y)
    return float(-(p[p > 0] * p[p > 0].log2()).sum())


@pytest.mark.parametrize("eraser", [["eraser=control"], ["eraser=leace", "eraser.fit_on=holdout"]])
def test_permuted_labels_code_at_the_label_entropy(eraser: list[str], tmp_path: Path) -> None:
    """Random labels cannot be compressed: the null job codes at >= H(label prior) - 0.01 bits/sample."""
    cfg = job_config(tmp_path, [*SMOKE, *eraser, "dataset.permute_labels=true"])
    result = result_of(run_job(cfg))
    prior = _entropy_bits(load_dataset(load_job(cfg).dataset).y)
    assert result["mdl"]["bits_per_sample"] >= prior - 0.01
    assert result["dataset"]["permuted_labels"] is True


def test_permutation_keeps_the_prior_and_depends_on_the_seed(tmp_path: Path) -> None:
    plain = prepare_data(load_job(job_config(tmp_path, SMOKE)))[0]
    a, b, c = (prepare_data(load_job(job_config(tmp_path, [*SMOKE, "dataset.permute_labels=true", f"seed={s}"]))
                            )[0] for s in (0, 0, 1))
    assert torch.equal(a.y, b.y) and not torch.equal(a.y, c.y) and not torch.equal(a.y, plain.y)
    assert torch.equal(torch.bincount(a.y), torch.bincount(plain.y)) and torch.equal(a.x, plain.x)


def test_holdout_fits_on_a_part_it_never_codes_and_repeats_draw_other_parts(tmp_path: Path) -> None:
    n = len(prepare_data(load_job(job_config(tmp_path, SMOKE)))[0].y)
    coded_sets = []
    for repeat in range(3):
        overrides = [*SMOKE, "eraser=leace", "eraser.fit_on=holdout", f"eraser.repeat={repeat}"]
        cfg = load_job(job_config(tmp_path, overrides))
        coded, x, info = prepare_data(cfg)
        assert info["fit"]["n_fit"] + info["fit"]["n_coded"] == n and len(coded.y) == len(x) == info["fit"]["n_coded"]
        assert info["fit"]["n_fit"] == pytest.approx(0.2 * n, abs=10)  # 20% of every class (rounded per class)
        assert info["options"]["rtol"] == 1e-6  # LEACE out of sample: near-null directions are null
        coded_sets.append(coded.content_hash())
    assert len(set(coded_sets)) == 3  # each repeat is its own random draw
    result = result_of(run_job(job_config(tmp_path, [*SMOKE, "eraser=leace", "eraser.fit_on=holdout",
                                                     "eraser.repeat=2"])))
    assert result["eraser"]["fit"] == {"fit_on": "holdout", "fit_source": "split", "n_fit": n - len(coded.y),
                                       "n_coded": len(coded.y), "fit_fraction": 0.2, "repeat": 2}
    assert result["mdl"]["n_coded"] + result["mdl"]["n_val"] == len(coded.y)


def test_holdout_and_in_sample_erase_differently(tmp_path: Path) -> None:
    all_x = prepare_data(load_job(job_config(tmp_path, [*SMOKE, "eraser=leace"])))[1]
    cfg = load_job(job_config(tmp_path, [*SMOKE, "eraser=leace", "eraser.fit_on=holdout"]))
    coded, x, _ = prepare_data(cfg)
    assert x.shape[1:] == all_x.shape[1:] and len(x) < len(all_x)
    class_means = torch.stack([x[coded.y == k].double().reshape(-1, 64).mean(0) for k in range(10)])
    assert float((class_means - class_means.mean(0)).abs().max()) > 1e-3  # out of sample: not exactly equalised


@pytest.mark.parametrize("override, message", [
    (["eraser=gradient", "eraser.fit_on=holdout"], "eraser.fit_on=holdout is not allowed: eraser gradient edits"),
    (["eraser=gradient", "eraser.fit_on=self"], "eraser.fit_on=self is not allowed: eraser gradient edits"),
    (["eraser.fit_fraction=1.0"], "eraser.fit_fraction=1.0 is not allowed"),
    (["eraser.fit_fraction=0"], "eraser.fit_fraction=0 is not allowed"),
    (["eraser=leace", "eraser.fit_on=oracle"], "eraser.fit_on=oracle is not allowed: dataset digits is not a "
                                                 "generator"),
    (["eraser=random", "eraser.fit_on=oracle", "dataset=gaussian"], "eraser.fit_on=oracle is not allowed: eraser "
                                                                      "random cannot be fitted from streamed moments"),
    (["eraser=leace", "eraser.fit_on=self", "eraser.fit_source=pool"], "eraser.fit_source=pool is not allowed with "
                                                                         "eraser.fit_on=self"),
    (["eraser=leace", "eraser.fit_on=holdout", "eraser.fit_source=pool"], "eraser.fit_source=pool is not allowed: "
                                                                            "the pool is the rows beyond"),
    (["eraser=leace", "eraser.repeat=-1"], "eraser.repeat=-1 is not allowed"),
])
def test_fitting_options_that_cannot_work_are_one_line(override: list[str], message: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        load_job(job_config(tmp_path, [*SMOKE, *override]))
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_qleace_out_of_sample_on_small_classes_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = load_job(job_config(tmp_path, [*SMOKE, "eraser=qleace", "eraser.fit_on=holdout"]))
    with caplog.at_level(logging.WARNING):
        prepare_data(cfg)
    lines = [r.message for r in caplog.records if "label injection" in r.message]
    assert len(lines) == 1 and "dataset.permute_labels=true" in lines[0]
