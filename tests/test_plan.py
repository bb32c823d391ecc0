"""`make plan`: the fast sweep expansion equals Hydra's on every preset; done/remaining and cost are read right."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from omegaconf import OmegaConf

from scripts import plan
from training.app.tasks import job_hash, load_job
from training.common.cells import cell_seeds
from training.common.sweep_jobs import expand_overrides, fast_expand
from training.common.sweeps import CONF_DIR, presets, sweep_overrides

SPREAD = 5  # jobs per preset spread over the sweep (first and last included), plus one for each swept value not in them


def _hydra(combos: list[list[str]]) -> list[dict]:
    """Each combo's cell composed by Hydra, then resolved once per seed as the job does (training/common/cells.py)."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        out = []
        for c in combos:
            cfg = compose("config", overrides=c)
            for seed in cell_seeds(cfg):
                cfg.seed = seed
                out.append(OmegaConf.to_container(cfg, resolve=True))
    assert all(isinstance(o, dict) for o in out)
    return out  # type: ignore[return-value]


def _hash(cfg: dict) -> str | None:
    return plan.job_hash(cfg)[0]


def _sample(combos: list[list[str]]) -> list[int]:
    """Indices of `SPREAD` jobs spread over the sweep, then of the first job with each override (key=value) none of
    those has: every swept value of every key is composed at least once."""
    n = len(combos)
    chosen = sorted({round(i * (n - 1) / (SPREAD - 1)) for i in range(SPREAD)}) if n > 1 else [0]
    covered = {line for i in chosen for line in combos[i]}
    for i, combo in enumerate(combos):
        if set(combo) - covered:
            chosen.append(i)
            covered |= set(combo)
    return chosen


# One test per preset (~170 Hydra compositions in all): under `make test` they spread over the workers.
@pytest.mark.parametrize("name", presets())
def test_every_preset_expands_as_hydra_composes_it(name: str, tmp_path: Path) -> None:
    """Every preset: job configs, config hashes and job dirs of jobs spread over the sweep (first and last
    included, every swept value at least once) == those of a full Hydra composition of the same jobs. A whole
    sweep goes through the fast path in the next test; here a sample keeps 3000 Hydra compositions out of it."""
    extra = [f"paths.out_dir={tmp_path}"]
    checked = 0
    combos = sweep_overrides(name, extra)
    idx = _sample(combos)
    sample = [combos[i] for i in idx]
    for got, want in zip(expand_overrides(sample), _hydra(sample), strict=True):
        assert got == want, f"{name} job {got['paths']['job_dir']}"
        assert _hash(got) == _hash(want) and got["paths"]["job_dir"] == want["paths"]["job_dir"]
        checked += 1
    assert checked >= 4 and checked >= len(idx)  # every seed of each sampled cell


def test_a_whole_sweep_with_extra_group_and_value_sweeps_expands_as_hydra_does(tmp_path: Path) -> None:
    """Every job, with ARGS that sweep a group (arch), a value that an interpolation reads (arch.width: the tag
    and the cell hash) and an eraser option, on top of the preset's own sweep."""
    extra = [f"paths.out_dir={tmp_path}", "arch=mlp,lenet", "arch.width=16,32", "eraser.fit_on=all,holdout"]
    fast = fast_expand("smoke", extra)
    combos = sweep_overrides("smoke", extra)
    assert len(fast) == 2 * 2 * 2 * 4
    ref = _hydra(combos)
    assert fast == ref
    assert [_hash(j) for j in fast] == [_hash(j) for j in ref]
    assert len({_hash(j) for j in fast}) == len(fast)


def test_a_bad_override_fails_as_in_hydra(tmp_path: Path) -> None:
    assert len(presets()) >= 10  # the test above is parametrized by presets(): an empty list would test nothing
    bad = [f"paths.out_dir={tmp_path}", "arch.no_such_key=1"]
    with pytest.raises(ConfigCompositionException):
        _hydra(sweep_overrides("smoke", bad)[:1])
    with pytest.raises(ConfigCompositionException):
        fast_expand("smoke", bad)


@pytest.mark.parametrize(("override", "line"), [
    ("eraser=glob(zz*)", "eraser=glob(zz*) sweeps over no value, so the sweep has no job: give eraser at least one "
                         "value (a glob must match one of its options: alf_qleace, "),
    ("seed=range(0,0)", "seed=range(0,0) sweeps over no value, so the sweep has no job: give seed at least one value"),
    ("optim.lr=interval(0.1,1)", "optim.lr=interval(0.1,1) cannot be swept (BasicSweeper does not support sweep type "
                                 ": INTERVAL_SWEEP): write optim.lr=a,b,c (a list), range(start,stop,step) "),
    ("hydra/launcher=packed", "hydra/launcher=packed is gone: a job is a cell now"),
    ("arch.no_such_key=1", "Could not override 'arch.no_such_key'"),
])
def test_plan_refuses_what_a_multirun_refuses_in_its_words(capsys: pytest.CaptureFixture[str], override: str,
                                                            line: str) -> None:
    """A sweep that has no job, that the basic sweeper cannot expand, a launcher that is gone or a bad override: one
    line, exit 2, the words of `python -m training.run -m` (training/cli/ledger.py) after `plan: `."""
    assert plan.main(["smoke", override]) == 2
    captured = capsys.readouterr()
    assert captured.err.startswith(f"plan: {line}") and captured.err.count("\n") == 1 and captured.out == ""


# --------------------------------------------------------------------------------------- done / remaining
def _write_result(job: plan.Job, cfg_hash: str) -> None:
    job.job_dir.mkdir(parents=True, exist_ok=True)
    (job.job_dir / "result.json").write_text(json.dumps({"config_hash": cfg_hash, "config": job.cfg,
                                                         "device": "cpu", "timings": {"total_s": 360.0}}))


def test_plan_counts_done_other_config_resume_and_new(tmp_path: Path) -> None:
    extra = [f"paths.out_dir={tmp_path}", "seed=0,1,2"]
    jobs = plan.plan_jobs("smoke", extra)
    assert len(jobs) == 6 and {j.status for j in jobs} == {"to run"}
    _write_result(jobs[0], job_hash(load_job(jobs[0].cfg)))
    _write_result(jobs[1], "0123456789abcdef")  # another configuration's result
    jobs[2].job_dir.mkdir(parents=True)
    (jobs[2].job_dir / "progress.json").write_text("{}")
    jobs[3].job_dir.mkdir(parents=True)
    (jobs[3].job_dir / "result.json").write_text("[]")  # malformed: recomputed, not done
    statuses = [j.status for j in plan.plan_jobs("smoke", extra)]
    assert statuses == ["done", "other config", "in progress", "to run", "to run", "to run"]
    text = plan.report("smoke", extra, 40, tmp_path / "none.json", tmp_path / "none.json")
    assert "6 seed results in 2 cells, 6 launched job(s)" in text
    assert "done 1 " in text and "to run 5: 3 new, 1 resume" in text and "1 hold another config" in text
    assert "seeds 0-2  done 1/3" in text and "seeds 0-2  done 0/3" in text


@pytest.mark.parametrize("newer", [False, True], ids=["another config", "newer code"])
def test_a_result_a_multirun_would_not_replace_refuses_the_plan_in_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture, newer: bool) -> None:
    """A job directory holding another configuration's result, or newer code's: the plan is printed, counts it as
    held, and exits 2 with the line `python -m training.run -m` refuses the sweep with (no warning besides it)."""
    extra = [f"paths.out_dir={tmp_path}", "--bench", str(tmp_path / "b.json"), "--gpu-report", str(tmp_path / "g")]
    job = plan.plan_jobs("smoke", extra[:1])[0]
    _write_result(job, "0123456789abcdef")
    if newer:
        (job.job_dir / "result.json").write_text(json.dumps({"schema_version": 3, "config_hash": "x"}))
    assert plan.main(["smoke", *extra]) == 2
    captured = capsys.readouterr()
    why = ("was written by newer code (schema_version 3 is newer than this code's (2)): run this job with that code, "
           "or pass force=true to replace it" if newer else "already holds a result of another configuration (hash "
           f"0123456789abcdef, this job {job.cfg_hash}): pass force=true to replace it, or choose another "
           "paths.out_dir")
    where = job.job_dir / "result.json" if newer else job.job_dir
    assert captured.err == f"plan: the sweep would be refused (nothing would run): {where} {why}\n"
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert "3 new, 0 resume (progress.json), 1 hold another config's result" in captured.out


def test_cell_list_shows_swept_values_not_in_the_path_and_seed_spans() -> None:
    assert plan.spans([0, 1, 2, 3, 5, 7, 8]) == "0-3,5,7-8" and plan.spans([4]) == "4"
    jobs = plan.plan_jobs("leakage", [])
    cells = plan.cells(jobs)
    assert len(cells) == 24 and all(len(c.seeds) == 3 for c in cells)
    assert any("eraser.fit_on=holdout" in c.label and "dataset.permute_labels=True" in c.label for c in cells)
    assert not any("seed=" in c.label or "eraser=" in c.label for c in cells)


# --------------------------------------------------------------------------------------------------- cost
def test_no_measurement_says_which_make_target_to_run(tmp_path: Path) -> None:
    text = plan.report("smoke", [f"paths.out_dir={tmp_path}"], 40, tmp_path / "a.json", tmp_path / "b.json")
    assert f"CPU: no measurement: {tmp_path / 'a.json'} not found; run make bench" in text
    assert f"GPU: no measurement: {tmp_path / 'b.json'} not found; run make gpu-report" in text
    assert " h for " not in text


def test_cost_from_bench_and_gpu_report_with_their_source_and_toy_reports_ignored(tmp_path: Path) -> None:
    bench = tmp_path / "bench_mdl.json"
    bench.write_text(json.dumps({"device": "cpu", "n": 8000, "d": 768, "epochs": 20, "seeds": 2, "threads": 2,
                                 "median_s": {"naive": 100.0, "ours": 72.0}}))
    gpu = tmp_path / "gpu_report.json"
    toy: dict[str, Any] = {"updated": "2026-11-01T00:00:00+00:00", "env": {"device": {"name": "CPU: x"}},
           "steps": {"job_mlp": {"status": "ok", "figures": {"wall_s": 9.0, "device": "cpu",
                                                             "epochs_per_block": [1]}}}}
    gpu.write_text(json.dumps(toy))
    extra = [f"paths.out_dir={tmp_path / 'runs'}", "seed=0,1,2,3,4"]  # 10 MLP jobs
    text = plan.report("smoke", extra, 40, bench, gpu)
    assert "CPU: 0.10 h for 10 job(s) (mlp: 10 x 36.0 s)" in text  # 72 s for 2 seeds = 36 s per job
    assert str(bench) in text and "8000 x 768" in text
    assert "GPU: no measurement" in text and "no GPU job step" in text  # a CPU toy run is not a GPU figure
    toy["steps"]["job_mlp"]["figures"]["device"] = "cuda:0"
    toy["env"]["device"]["name"] = "NVIDIA H100"
    gpu.write_text(json.dumps(toy))
    text = plan.report("smoke", extra, 40, bench, gpu)
    # priced per epoch at the protocol's epochs (smoke: patience 5, so at least 6), not the report's capped 1
    assert "GPU: 0.15 h for 10 job(s) (mlp: 10 x 54.0 s)" in text and "2026-11-01" in text and "H100" in text
    assert "LOWER BOUND: 6 epochs per block model" in text
    # finished jobs of the sweep are the better figure for the rest of it
    jobs = plan.plan_jobs("smoke", extra)
    _write_result(jobs[0], job_hash(load_job(jobs[0].cfg)))
    text = plan.report("smoke", extra, 40, bench, gpu)
    assert "CPU: 0.90 h for 9 job(s) (mlp: 9 x 360.0 s)" in text and "median of 1 finished job(s)" in text


def _capped_report(path: Path, arch: str = "convnext") -> None:
    """The H100 report's job_convnext (shared/gpu/h100-2026-11-27): 2 epochs per block model (capped), 108.6 s
    wall, 91.8 s training."""
    path.write_text(json.dumps({"updated": "2026-11-27T12:07:58+00:00", "env": {"device": {"name": "NVIDIA H100"}},
                                "steps": {f"job_{arch}": {"status": "ok", "figures": {
                                    "wall_s": 108.6, "train_s": 91.8, "job_s_per_epoch": 45.9, "device": "cuda",
                                    "epochs_per_block": [2.0] * 9}}}}))


def test_a_capped_gpu_report_does_not_price_the_presets_at_its_capped_budget(tmp_path: Path) -> None:
    """Fed a GPU report's 2-epoch jobs, plan once priced paper_table_c at their wall time (1.00 GPU-hour). The
    presets stop on patience (100): at least 101 epochs per block model, a stated lower bound."""
    gpu = tmp_path / "gpu_report.json"
    _capped_report(gpu)
    jobs = [j for j in plan.plan_jobs("paper_table_c", [f"paths.out_dir={tmp_path}"]) if j.arch == "convnext"]
    assert jobs and {j.cfg["mdl"]["patience"] for j in jobs} == {100}
    costs, missing = plan.gpu_report_cost(gpu)
    assert missing is None
    (price,) = plan.gpu_prices(costs, jobs, []).values()
    assert price.seconds == pytest.approx(108.6 - 91.8 + 45.9 * 101)  # not 108.6 (the capped job)
    assert "LOWER BOUND: 101 epochs" in price.source and "measured over 2 capped epoch(s)" in price.source
    text = plan.report("paper_table_c", [f"paths.out_dir={tmp_path}"], 0, tmp_path / "none.json", gpu)
    gpu_line = next(ln for ln in text.splitlines() if ln.strip().startswith("GPU: "))
    hours = float(gpu_line.split()[1])
    assert hours == pytest.approx(len(jobs) * price.seconds / 3600, abs=0.01)
    assert hours > 40 * len(jobs) * 108.6 / 3600 and "LOWER BOUND" in text  # 43x the capped price, at least


def test_gpu_price_uses_the_epochs_finished_jobs_of_the_family_ran(tmp_path: Path) -> None:
    gpu = tmp_path / "gpu_report.json"
    _capped_report(gpu, "mlp")
    extra = [f"paths.out_dir={tmp_path / 'runs'}", "seed=0,1,2"]
    jobs = plan.plan_jobs("smoke", extra)
    done = jobs[0]
    done.job_dir.mkdir(parents=True)
    (done.job_dir / "result.json").write_text(json.dumps({
        "config_hash": job_hash(load_job(done.cfg)), "config": done.cfg, "task": "mdl", "device": "cpu",
        "timings": {"total_s": 10.0}, "mdl": {"protocol": "prequential", "bits_per_sample": 1.0,
                                              "blocks": [{"epochs": 12}, {"epochs": 20}]}}))
    jobs = plan.plan_jobs("smoke", extra)
    epochs, how = plan.protocol_epochs("mlp", [j for j in jobs if j.status != "done"],
                                       [j for j in jobs if j.status == "done"])
    assert epochs == 20 and how.startswith("measured: median of 1 finished job")
    assert plan.protocol_epochs("mlp", jobs, [])[0] == 6  # none finished: smoke's patience 5 + 1, a lower bound


def test_plan_counts_a_value_given_twice_once(tmp_path: Path) -> None:
    """`seed=0,0`: the second is the first job again (it would SKIP), so the plan counts the sweep's jobs once."""
    once = plan.plan_jobs("smoke", [f"paths.out_dir={tmp_path}", "seed=0"])
    twice = plan.plan_jobs("smoke", [f"paths.out_dir={tmp_path}", "seed=0,0"])
    assert len(twice) == len(once) == 2 and [j.job_dir for j in twice] == [j.job_dir for j in once]
    text = plan.report("smoke", [f"paths.out_dir={tmp_path}", "seed=0,0"], 40, tmp_path / "none.json",
                       tmp_path / "none.json")
    assert "2 seed results in 2 cells, 2 launched job(s)" in text
