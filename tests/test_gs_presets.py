"""Gradient Starvation presets, the erased-data evaluation task and their tables (training/tasks/gs/gs_*.py `rows`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from scripts.aggregate import main as aggregate
from tests.helpers import job_config, result_of
from training.app.tasks import Collected, decode_result, get_task
from training.common.sweep_jobs import fast_expand
from training.common.sweeps import expand
from training.engine.fit import FitConfig, FitResult, Member, fit
from training.tasks.gs import erased_eval

ROOT = Path(__file__).resolve().parents[1]

PRESETS = {"gs_two_moons": "gs_two_moons", "gs_colored_mnist": "gs_colored_mnist", "gs_sd_erasure": None}


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_preset_expands_to_distinct_job_dirs(name: str, tmp_path: Path) -> None:
    jobs = fast_expand(name, [f"paths.out_dir={tmp_path}"])  # == Hydra's: tests/test_plan.py
    dirs = [j["paths"]["job_dir"] for j in jobs]
    assert len(set(dirs)) == len(dirs) > 1
    assert all(j["experiment_name"] == name and d.startswith(f"{tmp_path}/runs/{name}/") for j, d in zip(jobs, dirs,
                                                                                                       strict=True))
    if PRESETS[name]:
        assert {j["task"] for j in jobs} == {PRESETS[name]}


def test_colored_mnist_preset_is_the_2x2_design_and_sd_erasure_separates_tasks_and_regularizers(tmp_path: Path) -> None:
    jobs = expand("gs_colored_mnist", [f"paths.out_dir={tmp_path}"])
    cells = {(j["regularizer"]["lam"], j["regularizer"]["loss_scale"]) for j in jobs}
    assert cells == {(0, None), (0, 2e-5), (1, None), (1, 2e-5)}
    j = jobs[0]
    assert (j["gs"]["hidden"], j["gs"]["depth"], j["gs"]["lr"], j["regularizer"]["start_step"]) == (300, 2, 1e-4, 450)
    jobs = expand("gs_sd_erasure", [f"paths.out_dir={tmp_path}"])
    sd_cells = {(j["task"], j["eraser"]["name"], j["regularizer"]["name"]) for j in jobs}
    assert len(sd_cells) == 8 and all(j["mdl"]["calibrate_temperature"] for j in jobs)


QUICK_EVAL = ["experiment=gs_sd_erasure", "task=gs_erased_eval", "dataset=digits", "arch.width=32",
              "mdl.max_epochs=10", "optim.warmup_steps=10", "seed=0"]


def test_erased_eval_control_is_a_noop_and_leace_reports_gaps_erasing_through_the_mdl_cache(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gs_erased_eval erases as MDL does (training/inputs/pipeline.py erase_maybe_zscored): through the erased-data
    cache (a rerun fits nothing), out of sample on the test rows with MDL's holdout options (it used to call erasure.fit
    itself, with no cache). It hashes mdl.* and so stops by mdl's step-aware rule (it used to ignore
    stop_after_warmup, min_steps and patience_min_steps)."""
    seen: list[FitConfig] = []
    real_fit = fit

    def spy(member: Member, *args: Any, **kwargs: Any) -> FitResult:  # records the member's FitConfig
        seen.append(member.cfg)
        return real_fit(member, *args, **kwargs)

    monkeypatch.setattr(erased_eval, "fit", spy)
    task = get_task("gs_erased_eval")
    control = job_config(tmp_path, [*QUICK_EVAL, "eraser=control"])
    nothing = task(control)
    assert (nothing.status, nothing.result) == ("skipped", {}) and not Path(control["paths"]["job_dir"]).exists()
    leace = [*QUICK_EVAL, "eraser=leace", "regularizer=sd", "mdl.min_steps=40", "mdl.patience_min_steps=30",
             "mdl.stop_after_warmup=true"]
    cfg = job_config(tmp_path, leace)
    first = task(cfg)
    r = result_of(first)
    (fc,) = seen
    assert (fc.min_steps, fc.patience_min_steps, fc.warmup_steps) == (40, 30, 10)
    assert first.status == "done"
    assert r["method"] == "SD λ=0.1" and r["split_sizes"]["test"] == round(0.2 * 1797)
    ev = r["eval"]
    assert ev["test"]["acc"] > 0.3  # learned the original task (chance 0.1)
    assert r["gap_erased_minus_original"]["acc"] == pytest.approx(ev["test_erased"]["acc"] - ev["test"]["acc"])
    assert r["temperature"] > 0 and r["eraser"]["name"] == "leace"
    assert r["eraser"]["cache_hit"] == {"train": False, "test": False}
    assert r["eraser"]["test_options"]["rtol"] is not None  # MDL's holdout rtol for LEACE out of sample
    assert any(Path(cfg["paths"]["cache_dir"]).rglob("*"))
    outcome = task(cfg)  # finished: skipped
    again = result_of(outcome)
    assert outcome.status == "skipped"
    assert again["config_hash"] == r["config_hash"] and again["eval"] == ev
    forced = result_of(task(job_config(tmp_path, [*leace, "force=true"])))
    assert forced["eraser"]["cache_hit"] == {"train": True, "test": True}
    assert forced["eval"] == ev


def _fake_mdl(eraser: str, reg: str, seed: int, bits: float) -> dict:
    cfg = {"task": "mdl", "experiment_name": "gs_sd_erasure", "seed": seed,
           "dataset": {"name": "mnist5k", "tag": "mnist5k"}, "eraser": {"name": eraser},
           "arch": {"name": "mlp", "tag": "mlp_relu", "width": 128, "depth": 2},
           "mdl": {"calibrate_temperature": True}, "regularizer": {"name": reg, "lam": 0.1}}
    return {"config": cfg, "mdl": {"bits_per_sample": bits}}


def test_aggregate_tables_from_each_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each task makes the tables of its results (`Task.rows`); scripts/aggregate.py asks every task."""
    results = [result_of(get_task("gs_two_moons")(job_config(tmp_path, ["experiment=gs_two_moons", f"seed={s}",
                                                                          f"regularizer.lam={lam}", "gs.steps=20",
                                                                          "gs.grid.n=101"])))
               for s in (0, 1) for lam in (0, 0.003)]
    results += [_fake_mdl(e, reg, s, b + (0.5 if e == "leace" else 0) + (0.1 if reg == "sd" else 0) + 0.01 * s)
                for e in ("control", "leace") for reg in ("none", "sd") for s, b in ((0, 1.0), (1, 1.0))]

    def rows(task: str, mine: list[dict]) -> dict[str, str]:
        return get_task(task).rows(Collected([decode_result(r) for r in mine], pd.DataFrame(), tmp_path, "t", "title"))

    moons, mdl = rows("gs_two_moons", results[:4]), rows("mdl", results[4:])
    assert set(moons) == {"gs_two_moons"} and set(mdl) == {"gs_mdl_regularizer"}
    assert "| +0.1 | ERM | 2 |" in moons["gs_two_moons"] and "SD λ=0.003" in moons["gs_two_moons"]
    assert (tmp_path / "gs_two_moons_boundaries.png").exists()
    mdl_rows = [line for line in mdl["gs_mdl_regularizer"].splitlines() if "leace" in line]
    assert len(mdl_rows) == 2 and all(row.rstrip(" |").endswith("0.5000 ± 0.0000") for row in mdl_rows)  # paired gap
    assert rows("gs_colored_mnist", []) == {} and rows("gs_erased_eval", []) == {}  # no results, no table
    assert aggregate([str(tmp_path / "runs"), "--out", str(tmp_path / "tables"), "--name", "gs"]) == 0
    for name in ("gs_gs_two_moons.md", "gs_two_moons_boundaries.png"):
        assert (tmp_path / "tables" / name).exists()
    assert "| +0.1 | ERM | 2 |" in capsys.readouterr().out

