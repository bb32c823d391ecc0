"""`eraser.fit_labels=shuffled`: the non-specific-removal control. The eraser is fitted on
a fixed permutation of its fit rows' labels and applied to the true-label data the model codes; the key enters the
job hash only away from its default; the modes and erasers without fit rows or a map refuse it in one line."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from erasure import fit as fit_eraser
from tests.helpers import job_config, prepare_data
from training.app.schema import ConfigError, JobConfig, config_hash
from training.app.tasks import load_job
from training.data import load_dataset
from training.engine.seeding import generator
from training.inputs.pipeline import prepare_inputs
from training.inputs.plan import fit_plan
from training.inputs.store import Store

GAUSS = ["experiment=smoke", "mdl.full_run=false", "dataset=gaussian", "dataset.dim=8", "dataset.rows_per_dim=8",
         "dataset.mean_gap=1", "dataset.cov_gap=1", "eraser=leace", "eraser.fit_fraction=0.5"]


def _cfg(tmp: Path, *overrides: str) -> JobConfig:
    return load_job(job_config(tmp, [*GAUSS, *overrides]))


def _mean_gap(x: torch.Tensor, y: torch.Tensor) -> float:
    flat = x.double().reshape(len(x), -1)
    means = torch.stack([flat[y == k].mean(0) for k in range(int(y.max()) + 1)])
    return float((means - flat.mean(0)).abs().max())


@pytest.mark.parametrize("fit_on", ["self", "holdout", "all"])
def test_the_shuffled_fit_is_fitted_on_permuted_labels_and_applied_to_the_true_labels(fit_on: str,
                                                                                     tmp_path: Path) -> None:
    true_cfg = _cfg(tmp_path, f"eraser.fit_on={fit_on}", "seed=3")
    cfg = _cfg(tmp_path, f"eraser.fit_on={fit_on}", "seed=3", "eraser.fit_labels=shuffled")
    coded_t, x_t, _ = prepare_data(true_cfg)
    coded, x, info = prepare_data(cfg)
    # the model codes the same rows with the same (true) labels; only the erased images differ
    assert torch.equal(coded.x, coded_t.x) and torch.equal(coded.y, coded_t.y)
    assert not torch.allclose(x, x_t, atol=1e-3)
    # ... and they are the eraser fitted on the fit rows with their labels permuted (seed, repeat), applied to them
    data = load_dataset(cfg.dataset, cfg.paths.data_dir)
    plan = fit_plan(cfg.eraser, cfg.dataset, cfg.seed, data, Store.of(cfg.paths))
    if fit_on == "self":
        fit = coded
    elif fit_on == "all":
        fit = data
    else:
        assert plan is not None and plan.fit_idx is not None  # a holdout fit has its rows
        fit = data.subset(plan.fit_idx)
    perm = torch.randperm(len(fit.y), generator=generator(3, 0, "fit_labels"))
    shuffled = fit.y[perm]
    assert not torch.equal(shuffled, fit.y)
    assert torch.equal(torch.bincount(shuffled), torch.bincount(fit.y))  # a permutation: the same class counts
    eraser = fit_eraser("leace", fit.x.reshape(len(fit.y), -1), shuffled, **info["options"])
    assert torch.allclose(x.reshape(len(coded.y), -1), eraser(coded.x.reshape(len(coded.y), -1)).float(), atol=1e-5)
    # the true-label fit erases the coded rows' class means (exactly in sample); the shuffled fit leaves them
    if fit_on != "holdout":
        assert _mean_gap(x_t, coded.y) < 1e-4
    assert _mean_gap(x, coded.y) > 0.3


def test_the_key_is_hashed_only_away_from_its_default(tmp_path: Path) -> None:
    for mode in ("self", "holdout", "all"):
        base = config_hash(_cfg(tmp_path, f"eraser.fit_on={mode}"))
        assert config_hash(_cfg(tmp_path, f"eraser.fit_on={mode}", "eraser.fit_labels=coded")) == base
        assert config_hash(_cfg(tmp_path, f"eraser.fit_on={mode}", "eraser.fit_labels=shuffled")) != base


@pytest.mark.parametrize("extra, names", [
    (["eraser.fit_on=population"], "eraser.fit_on=population"),
    (["eraser.fit_on=oracle"], "eraser.fit_on=oracle"),
    (["eraser=control"], "eraser=control"),
    (["eraser=gradient"], "eraser=gradient"),
])
def test_modes_and_erasers_without_a_fitted_map_refuse_it_in_one_line(extra: list[str], names: str,
                                                                       tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="^eraser.fit_labels=shuffled is not allowed") as err:
        _cfg(tmp_path, *extra, "eraser.fit_labels=shuffled")
    assert names in str(err.value) and "\n" not in str(err.value) and "use " in str(err.value)


def test_after_augment_erases_batches_with_the_shuffled_fit(tmp_path: Path) -> None:
    """eraser.after_augment=true: the per-batch eraser is the shuffled fit (the fitted-eraser cache keeps it apart
    from the true-label fit of the same rows, fitted first here), and it gives the erased images of the coded rows."""
    over = ("eraser.fit_on=self", "eraser.after_augment=true")
    first = _cfg(tmp_path, *over)
    prepare_inputs(first, Store.of(first.paths))  # the true-label fit of the same rows, cached first
    shuffled = _cfg(tmp_path, *over, "eraser.fit_labels=shuffled")
    inputs = prepare_inputs(shuffled, Store.of(shuffled.paths))
    coded, x, batches = inputs.data, inputs.x, inputs.batches
    _, x_once, _ = prepare_data(_cfg(tmp_path, "eraser.fit_on=self", "eraser.fit_labels=shuffled"))
    assert batches is not None and torch.equal(x, x_once)
    assert torch.allclose(batches.transform(coded.x, coded.y), x, atol=1e-5)
    assert _mean_gap(x, coded.y) > 0.3
