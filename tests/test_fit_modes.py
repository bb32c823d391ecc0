"""How an eraser is fitted (docs/known-answers.md): eraser.fit_on all | self | holdout | oracle | population,
fit_source split | pool, the real fit_fraction, repeat, n_fit; which keys enter the job hash; one-line refusals of a
holdout that cannot be fitted; the generator datasets and their fresh draws; holdout and the permuted-label control
through a real job: what is fitted, what is coded, what the null codes at."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch

import erasure
from erasure.qleace import QleaceEraser
from erasure.streaming import fit_moments
from tests.helpers import TINY, job_config, prepare_data, result_of
from tests.test_refusals import _cli, _refused
from training.app.schema import ConfigError
from training.app.tasks import job_hash, load_job
from training.data import load_dataset
from training.data.generators import draw, oracle_chunks, population_moments
from training.inputs.erase import holdout_options
from training.inputs.plan import fit_plan
from training.inputs.store import Store
from training.tasks.mdl.job import run_job

SMOKE = ["experiment=smoke", "mdl.full_run=false"]
GAUSS = ["dataset=gaussian", "dataset.dim=8", "dataset.rows_per_dim=8"]


def _smoke(tmp: Path, *overrides: str) -> Any:
    return load_job(job_config(tmp, [*SMOKE, *overrides]))


def _hash(tmp: Path, *overrides: str) -> str:
    return job_hash(_smoke(tmp, "eraser=leace", *overrides))


# ---------------------------------------------------------------- the job hash


@pytest.mark.parametrize("mode, unused, used", [
    (["eraser.fit_on=all"], ["eraser.fit_fraction=0.4", "eraser.repeat=3", "eraser.fit_source=pool",
                             "eraser.n_fit=100"], []),
    (["eraser.fit_on=holdout"], ["eraser.n_fit=100"], ["eraser.fit_fraction=0.4", "eraser.repeat=3"]),
    (["eraser.fit_on=self"], ["eraser.n_fit=100"], ["eraser.fit_fraction=0.4", "eraser.repeat=3"]),
    (["eraser.fit_on=holdout", "eraser.fit_source=pool", "dataset.limit=1000"], ["eraser.fit_fraction=0.4"],
     ["eraser.n_fit=100", "eraser.repeat=3"]),
    ([*GAUSS, "eraser.fit_on=oracle"], ["eraser.fit_fraction=0.4", "eraser.repeat=3", "eraser.fit_source=pool"],
     ["eraser.n_fit=100"]),
    ([*GAUSS, "eraser.fit_on=population"], ["eraser.n_fit=100"], ["eraser.fit_fraction=0.4", "eraser.repeat=3"]),
], ids=["all", "holdout", "self", "pool", "oracle", "population"])
def test_keys_a_mode_does_not_read_do_not_change_the_hash(mode: list[str], unused: list[str], used: list[str],
                                                           tmp_path: Path) -> None:
    base = _hash(tmp_path, *mode)
    for key in unused:
        assert _hash(tmp_path, *mode, key) == base, key
    for key in used:
        assert _hash(tmp_path, *mode, key) != base, key
    assert len({_hash(tmp_path, "eraser.fit_on=all"), _hash(tmp_path, "eraser.fit_on=self"),
                _hash(tmp_path, "eraser.fit_on=holdout")}) == 3


# ---------------------------------------------------------------- split: the real fraction, repeats, self


@pytest.mark.parametrize("fraction", [0.4, 0.45, 0.5, 0.8])
def test_fit_fraction_is_the_fraction_fitted_on_per_class(fraction: float, tmp_path: Path) -> None:
    cfg = _smoke(tmp_path, "eraser=leace", "eraser.fit_on=holdout", f"eraser.fit_fraction={fraction}")
    data = load_dataset(cfg.dataset)
    plan = fit_plan(cfg.eraser, cfg.dataset, cfg.seed, data, Store.of(cfg.paths))
    assert plan is not None and plan.fit_idx is not None and plan.coded_idx is not None
    counts = torch.bincount(data.y)
    fit = torch.bincount(data.y[plan.fit_idx], minlength=len(counts))
    assert torch.equal(fit, torch.round(counts.double() * fraction).long())  # stratified, rounded per class
    assert not set(plan.fit_idx.tolist()) & set(plan.coded_idx.tolist())
    assert len(plan.fit_idx) + len(plan.coded_idx) == len(data.y)


def test_self_codes_the_holdouts_rows_and_fits_on_them(tmp_path: Path) -> None:
    def run(fit_on: str) -> tuple:
        return prepare_data(_smoke(tmp_path, "eraser=leace", f"eraser.fit_on={fit_on}", "eraser.fit_fraction=0.5"))

    coded_s, x_s, info_s = run("self")
    coded_h, x_h, info_h = run("holdout")
    assert torch.equal(coded_s.x, coded_h.x) and torch.equal(coded_s.y, coded_h.y)  # the same coded rows
    assert x_s.shape == x_h.shape == coded_h.x.shape
    assert info_s["fit"] == {"fit_on": "self", "fit_source": "split", "n_fit": len(coded_s.y),
                             "n_coded": len(coded_s.y), "fit_fraction": 0.5, "repeat": 0}
    assert info_s["options"]["rtol"] is None and info_h["options"]["rtol"] == 1e-6  # in sample / out of sample

    def mean_gap(x: torch.Tensor, y: torch.Tensor) -> float:
        flat = x.double().reshape(len(x), -1)
        means = torch.stack([flat[y == k].mean(0) for k in range(10)])
        return float((means - flat.mean(0)).abs().max())

    assert mean_gap(x_s, coded_s.y) < 1e-5 < 1e-3 < mean_gap(x_h, coded_h.y)  # self erases its rows exactly


# ---------------------------------------------------------------- pool


def test_pool_fits_outside_the_coded_set_and_does_not_shrink_it(tmp_path: Path) -> None:
    over = ["eraser=leace", "dataset.limit=1000", "eraser.fit_on=holdout", "eraser.fit_source=pool"]
    cfg = _smoke(tmp_path, *over, "eraser.n_fit=300")
    coded, x, info = prepare_data(cfg)
    assert len(coded.y) == len(x) == 1000
    assert info["fit"] == {"fit_on": "holdout", "fit_source": "pool", "n_fit": 300, "n_coded": 1000,
                           "fit_fraction": None, "repeat": 0}
    plan = fit_plan(cfg.eraser, cfg.dataset, cfg.seed, coded, Store.of(cfg.paths))
    assert plan is not None and plan.pool is not None
    full = load_dataset(_smoke(tmp_path).dataset)
    full_rows = {tuple(r) for r in full.x[1000:].reshape(len(full.y) - 1000, -1).tolist()}
    assert all(tuple(r) in full_rows for r in plan.pool.x.reshape(300, -1).tolist())  # beyond dataset.limit
    whole = prepare_data(_smoke(tmp_path, *over))[2]["fit"]
    assert whole["n_fit"] == len(full.y) - 1000  # n_fit null: the whole pool


# ---------------------------------------------------------------- one-line refusals before any directory


@pytest.mark.parametrize("overrides, smallest", [
    (["eraser.fit_fraction=0.001"], "the smallest class of digits has 174 rows"),
    (["eraser.fit_fraction=0.999"], "the smallest class of digits has 174 rows"),
    (["dataset.limit=40"], "the smallest class of digits has 1 rows"),
])
def test_a_holdout_that_cannot_be_fitted_is_one_line_before_any_directory(overrides: list[str], smallest: str,
                                                                           tmp_path: Path) -> None:
    proc = _cli(tmp_path, *TINY, "eraser=leace", "eraser.fit_on=holdout", *overrides)
    line = _refused(proc, tmp_path, "eraser.fit_fraction")
    assert smallest in line and ("use eraser.fit_fraction between" in line or "no fit_fraction can" in line)


def test_a_feasible_fraction_named_by_the_refusal_works(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as err:
        prepare_data(_smoke(tmp_path, "eraser=leace", "eraser.fit_on=holdout", "eraser.fit_fraction=0.001"))
    lo = float(str(err.value).split("between ")[1].split(" and ")[0])
    ok = _smoke(tmp_path, "eraser=leace", "eraser.fit_on=holdout", f"eraser.fit_fraction={lo}")
    assert prepare_data(ok)[2]["fit"]["n_fit"] >= 20  # at least 2 rows of each of the 10 classes


@pytest.mark.parametrize("fit_on", ["oracle", "population"])
def test_oracle_or_population_on_a_dataset_without_fresh_draws_is_one_line(fit_on: str, tmp_path: Path) -> None:
    proc = _cli(tmp_path, *TINY, "eraser=leace", f"eraser.fit_on={fit_on}")
    assert "dataset digits is not a generator" in _refused(proc, tmp_path, "eraser.fit_on")


# ---------------------------------------------------------------- generators and the oracle


def test_gaussian_generator_rows_per_dim_and_equal_covariances(tmp_path: Path) -> None:
    cfg = load_job(job_config(tmp_path, ["dataset=gaussian", "dataset.dim=6", "dataset.rows_per_dim=0.5",
                                            "dataset.cov_gap=0"]))
    data = load_dataset(cfg.dataset)
    assert torch.equal(torch.bincount(data.y), torch.full((4,), 3)) and data.x.shape[1:] == (1, 1, 6)
    gapped = load_job(job_config(tmp_path, ["dataset=gaussian", "dataset.dim=6", "dataset.cov_gap=2"]))
    spread = []
    for options in (cfg.dataset.options, gapped.dataset.options):
        x, y = next(oracle_chunks(options, 4000))
        covs = torch.stack([torch.cov(x[y == k].reshape(-1, 6).double().T) for k in range(4)])
        spread.append(float((covs - covs.mean(0)).abs().max()))
    assert spread[0] < 0.15 < 1.0 < spread[1]  # cov_gap=0: one covariance (sampling error only); cov_gap=2: not


def test_oracle_draws_are_fresh_seeded_apart_and_counted(tmp_path: Path) -> None:
    cfg = load_job(job_config(tmp_path, [*GAUSS, "eraser=qleace", "eraser.fit_on=oracle"]))
    o = cfg.dataset.options
    coded = draw(o, o.rows_per_class)[0]
    fresh = next(oracle_chunks(o, o.rows_per_class))[0]
    assert coded.shape == fresh.shape and not torch.allclose(coded, fresh)
    assert torch.equal(next(oracle_chunks(o, 10))[0], next(oracle_chunks(o, 10))[0])  # deterministic
    info = prepare_data(cfg)[2]
    assert info["fit"] == {"fit_on": "oracle", "fit_source": None, "n_fit": 200 * 8 * 4, "n_coded": 64 * 4,
                           "fit_fraction": None, "repeat": None}
    few = load_job(job_config(tmp_path, [*GAUSS, "eraser=qleace", "eraser.fit_on=oracle", "eraser.n_fit=5000"]))
    assert prepare_data(few)[2]["fit"]["n_fit"] == 5000 * 4  # several chunks (CHUNK_ROWS 4096)


# ---------------------------------------------------------------- population: the paired truth


def test_population_moments_are_the_generators_law(tmp_path: Path) -> None:
    """The exact class moments `population_moments` gives match 40 000 fresh draws per class (gaussian with its own
    direction per class, and the two-mode mixture) to sampling error."""
    for over in (["dataset=gaussian", "dataset.cov_gap=2", "dataset.mean_gap=1.5"],
                 ["dataset=mixture", "dataset.separation=2"]):
        o = load_job(job_config(tmp_path, [*over, "dataset.dim=6"])).dataset.options
        mom = population_moments(o)
        assert mom.cov is not None and mom.class_covs is not None
        x, y = draw(o, 40_000, 7)
        flat = x.reshape(len(y), -1).double()
        for k in range(o.num_classes):
            assert torch.allclose(flat[y == k].mean(0), mom.means[k], atol=0.05), over
            assert torch.allclose(torch.cov(flat[y == k].T), mom.class_covs[k], atol=0.15 * o.sigma**2 * 4), over
        assert torch.allclose(torch.cov(flat.T), mom.cov, atol=0.2), over


def test_population_codes_the_rows_self_and_holdout_code_with_the_exact_eraser(tmp_path: Path) -> None:
    def run(fit_on: str) -> tuple:
        return prepare_data(load_job(job_config(tmp_path, [*GAUSS, "dataset.cov_gap=1", "eraser=qleace",
                                                              f"eraser.fit_on={fit_on}", "eraser.fit_fraction=0.5"])))

    (coded_p, x_p, info_p), (coded_s, _, _), (coded_h, _, _) = run("population"), run("self"), run("holdout")
    for coded in (coded_s, coded_h):
        assert torch.equal(coded.x, coded_p.x) and torch.equal(coded.y, coded_p.y)  # the same coded rows
    assert info_p["fit"] == {"fit_on": "population", "fit_source": "split", "n_fit": None,
                             "n_coded": len(coded_p.y), "fit_fraction": 0.5, "repeat": 0}
    cfg = load_job(job_config(tmp_path, [*GAUSS, "dataset.cov_gap=1"]))
    exact = fit_moments("qleace", population_moments(cfg.dataset.options), **info_p["options"])
    flat = coded_p.x.reshape(len(coded_p.y), -1)
    assert torch.allclose(x_p.reshape(len(flat), -1), exact(flat, coded_p.y), atol=1e-5)
    # the population map erases the law, not the sample: fresh rows through it have equal class moments
    fresh, fy = draw(cfg.dataset.options, 20_000, 9)
    erased = exact(fresh.reshape(len(fy), -1), fy).double()
    means = torch.stack([erased[fy == k].mean(0) for k in range(4)])
    assert float((means - means.mean(0)).abs().max()) < 0.05


@pytest.mark.parametrize("fit_on, extra, key", [
    ("oracle", "dataset.permute_labels=true", "dataset.permute_labels=true"),
    ("oracle", "eraser.after_augment=true", "eraser.after_augment=true"),
    ("population", "dataset.permute_labels=true", "dataset.permute_labels=true"),
    ("population", "eraser.after_augment=true", "eraser.after_augment=true"),
    ("population", "eraser.fit_source=pool", "eraser.fit_source=pool"),
    ("population", "eraser=gradient", "eraser.fit_on=population"),
])
def test_oracle_and_population_refusals_are_one_line(fit_on: str, extra: str, key: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=f"^{key} is not allowed") as err:
        load_job(job_config(tmp_path, [*GAUSS, "eraser=leace", f"eraser.fit_on={fit_on}", extra]))
    assert "\n" not in str(err.value)


# ----------------------------------------------------------- holdout QLEACE: i.i.d. coupling noise (numerics version 3)


def test_holdout_qleace_noise_on_the_coded_rows_is_not_zero_sum_per_class(tmp_path: Path) -> None:
    """Digits fitted on 80%: every class is singular (constant pixels) and gets coupling noise. Applied to the coded
    rows (not fitted on) the noise is an i.i.d. N(0, R_k) draw: its per-class sum is not zero (the exact in-sample
    draw's is, to round-off), and it is what the job's erased rows carry on top of the class maps."""
    cfg = _smoke(tmp_path, "eraser=qleace", "eraser.fit_on=holdout", "eraser.fit_fraction=0.8")
    coded, x, info = prepare_data(cfg)
    assert min(info["report"]["noise_rank"]) > 0
    plan = fit_plan(cfg.eraser, cfg.dataset, cfg.seed, load_dataset(cfg.dataset), Store.of(cfg.paths))
    assert plan is not None
    fit = plan.fit_rows(load_dataset(cfg.dataset))
    assert fit is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        e = erasure.fit("qleace", fit.x.reshape(len(fit.y), -1), fit.y, **holdout_options("qleace", {}))
    assert isinstance(e, QleaceEraser)
    flat = coded.x.reshape(len(coded.y), -1).double()
    noise = x.reshape(len(coded.y), -1).double() - e._apply(flat, coded.y)
    scale = float(e.barycenter_full().abs().max()) ** 0.5
    for c in range(10):
        sums = noise[coded.y == c].sum(0)
        assert float(sums.abs().max()) > 1e-3 * scale  # out of sample: not zero-sum
    in_sample = e.apply_in_sample(fit.x.reshape(len(fit.y), -1).double(), fit.y)
    own = in_sample - e._apply(fit.x.reshape(len(fit.y), -1).double(), fit.y)
    assert float(own[fit.y == 0].sum(0).abs().max()) < 1e-9 * scale  # in sample: zero-sum


# ---------------------------------------------------------------- holdout and permuted labels through a real job


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
    plain = prepare_data(_smoke(tmp_path))[0]
    a, b, c = (prepare_data(_smoke(tmp_path, "dataset.permute_labels=true", f"seed={s}"))[0] for s in (0, 0, 1))
    assert torch.equal(a.y, b.y) and not torch.equal(a.y, c.y) and not torch.equal(a.y, plain.y)
    assert torch.equal(torch.bincount(a.y), torch.bincount(plain.y)) and torch.equal(a.x, plain.x)


def test_holdout_fits_on_a_part_it_never_codes_and_repeats_draw_other_parts(tmp_path: Path) -> None:
    n = len(prepare_data(_smoke(tmp_path))[0].y)
    coded_sets = []
    for repeat in range(3):
        coded, x, info = prepare_data(_smoke(tmp_path, "eraser=leace", "eraser.fit_on=holdout",
                                             f"eraser.repeat={repeat}"))
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
        _smoke(tmp_path, *override)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_qleace_out_of_sample_on_small_classes_warns_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        prepare_data(_smoke(tmp_path, "eraser=qleace", "eraser.fit_on=holdout"))
    lines = [r.message for r in caplog.records if "label injection" in r.message]
    assert len(lines) == 1 and "dataset.permute_labels=true" in lines[0]
