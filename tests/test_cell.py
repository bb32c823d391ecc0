"""A job is a cell (training/common/cells.py, training/tasks/mdl/cell.py): one configuration and its seeds, every
seed's block models in one lockstep group, the data loaded and each eraser fitted once per fit key. With the loop
engine on CPU every seed's result equals its one-seed cell's (its job alone); a seed that fails fails alone; a
finished seed is skipped; a cell stopped inside a block resumes every seed to the uninterrupted numbers.

The cells run in process (`run_cell`), as the command line runs them (tests/test_launchers.py runs the command)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest
from hydra import compose, initialize_config_dir

import training.tasks.mdl.cell as cell_module
import training.tasks.mdl.job as job_module
from tests.helpers import CONF, job_config, result_of
from tests.test_checkpoint import _load, _stop_at
from training.app.lifecycle import Outcome
from training.app.tasks import load_job
from training.common import interrupt
from training.common.cells import seed_configs, seed_list
from training.engine.checkpoint import PATTERN
from training.errors import ConfigError, NonFiniteError
from training.inputs.store import Store
from training.tasks.mdl.job import run_cell, run_job

SMOKE = ["experiment=smoke", "eraser=leace", "mdl.max_epochs=12"]
NUMBERS = ("mdl", "final", "eraser", "model", "optim", "dataset")  # every result section but timings and provenance
TINY_CONV = ("arch=convnext", "arch.width=8", "arch.depth=1", "dataset.limit=200", "mdl.max_epochs=2",
             "mdl.patience=1", "optim.warmup_steps=0", "eraser.after_augment=true", "dataset.augment=true")


def _numbers(result: dict[str, Any]) -> dict[str, Any]:
    def strip(v: Any) -> Any:  # wall times differ from run to run
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if "seconds" not in k and k != "cache_hit"}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    return strip({k: result[k] for k in NUMBERS})


def _composed(out: Path, overrides: list[str]) -> list[dict[str, Any]]:
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        cfg = compose("config", overrides=[f"paths.out_dir={out}", "logger=none", "progress=false", *overrides])
    return seed_configs(cfg)


def _cell(out: Path, *extra: str, seeds: int = 3) -> list[Outcome]:
    cfgs = [load_job(c) for c in _composed(out, [*SMOKE, f"seeds={seeds}", *extra])]
    return run_cell(cfgs, Store.of(cfgs[0].paths, memos=True))


def _alone(out: Path, *extra: str, seeds: int = 3) -> dict[int, dict[str, Any]]:
    return {s: _numbers(result_of(run_job(job_config(out, [*SMOKE, f"seed={s}", *extra])))) for s in range(seeds)}


def _seed_numbers(outcomes: list[Outcome]) -> dict[int, dict[str, Any]]:
    return {int(o.job_dir.name.removeprefix("seed")): _numbers(result_of(o)) for o in outcomes}


@pytest.mark.parametrize("engine", ["loop", "stacked"])
def test_a_cell_gives_each_seed_its_one_seed_numbers(tmp_path: Path, engine: str,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    alone = _alone(tmp_path / "alone", f"training.engine={engine}")
    with caplog.at_level(logging.INFO):
        outcomes = _cell(tmp_path / "cell", f"training.engine={engine}")
    assert [o.status for o in outcomes] == ["done"] * 3
    assert "cell: 3 seeds' 18 models in one lockstep group" in caplog.text
    assert caplog.text.count("fitting eraser leace") == 1  # a fit on all rows: one fit for every seed
    assert _seed_numbers(outcomes) == alone
    sigs = {o.result["provenance"]["numerics"]["models_together"] for o in outcomes if o.result}
    assert sigs == {18}  # the signature records the group


def test_seeds_with_their_own_data_train_together_on_their_own_rows(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    """Permuted labels and a holdout fit: each seed's data and labels are its own (concatenated in the group)."""
    extra = ("dataset.permute_labels=true", "eraser.fit_on=holdout")
    alone = _alone(tmp_path / "alone", *extra, seeds=2)
    with caplog.at_level(logging.INFO):
        outcomes = _cell(tmp_path / "cell", *extra, seeds=2)
    assert "cell: 2 seeds' 12 models in one lockstep group" in caplog.text
    assert caplog.text.count("fitting eraser leace") == 2  # one fit per seed: the fit rows are the seed's
    assert _seed_numbers(outcomes) == alone


def test_a_convnext_cell_erasing_each_batch_equals_each_seed_one_model_at_a_time(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Per-batch erasure (every paper preset): the seeds share one batch eraser (fitted on all rows) in one group on
    the loop engine; each seed's numbers == its models trained one at a time."""
    one_at_a_time = _alone(tmp_path / "one", *TINY_CONV, "training.parallel_models=1", seeds=2)
    with caplog.at_level(logging.INFO):
        outcomes = _cell(tmp_path / "cell", *TINY_CONV, seeds=2)
    assert "cell: 2 seeds' 12 models in one lockstep group" in caplog.text
    cell = _seed_numbers(outcomes)
    assert cell[1]["eraser"]["batch_eraser"]["applied"]
    assert cell == one_at_a_time


def test_one_seeds_failure_is_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Seed 1's code length goes non-finite: seed 1 fails with that line, seeds 0 and 2 finish with their numbers."""
    real = job_module.Blocks.on_finish

    def on_finish(self: Any, k: int, model: Any, res: Any) -> None:
        if self.trainer.seed == 1:
            raise NonFiniteError("non-finite code length of block 2")
        real(self, k, model, res)

    monkeypatch.setattr(job_module.Blocks, "on_finish", on_finish)
    outcomes = _cell(tmp_path / "cell")
    assert [o.status for o in outcomes] == ["done", "failed", "done"]
    assert "non-finite code length" in str(outcomes[1].error)
    assert not (outcomes[1].job_dir / "result.json").exists()
    monkeypatch.undo()
    alone = _alone(tmp_path / "alone")
    numbers = _seed_numbers([outcomes[0], outcomes[2]])
    assert numbers == {0: alone[0], 2: alone[2]}


def test_a_failed_group_leaves_each_seed_to_train_in_its_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    def broken(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("the group broke")

    monkeypatch.setattr(cell_module, "fit_group", broken)
    with caplog.at_level(logging.INFO):
        outcomes = _cell(tmp_path / "cell", seeds=2)
    assert "the cell's group failed (RuntimeError: the group broke)" in caplog.text
    assert _seed_numbers(outcomes) == _alone(tmp_path / "alone", seeds=2)


def test_a_finished_seed_is_skipped_and_the_others_train(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    run_job(job_config(tmp_path, [*SMOKE, "seed=1"]))
    with caplog.at_level(logging.INFO):
        outcomes = _cell(tmp_path)
    assert [o.status for o in outcomes] == ["done", "skipped", "done"]
    assert "cell: 2 seeds' 12 models in one lockstep group" in caplog.text


def test_a_cell_stopped_inside_a_block_resumes_every_seed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """Rows refilled across the seeds (training.parallel_models=12: 12 rows for 18 models), stopped as by a SIGTERM: the
    group's checkpoint is in the first seed's directory; the rerun resumes in the group and every seed's result
    equals its job alone."""
    rows = "training.parallel_models=12"
    out = tmp_path / "cell"
    with monkeypatch.context() as m:
        _stop_at(m, 40)
        with pytest.raises(interrupt.Interrupted):
            _cell(out, rows)
    (path,) = out.rglob(PATTERN)
    assert path.parent.name == "seed0"
    state = _load(path)["state"]
    assert state["schedule"]["rows"] == 12 and len(_load(path)["names"]) == 18
    assert not list(out.rglob("result.json"))
    with caplog.at_level(logging.INFO):
        outcomes = _cell(out, rows)
    assert f"at step {state['step']} from" in caplog.text
    assert not list(out.rglob(PATTERN))
    assert _seed_numbers(outcomes) == _alone(tmp_path / "alone")


# --- the cell's seeds in the config -----------------------------------------------------------------------------
def test_seeds_is_a_count_or_a_list_seed_makes_a_one_seed_cell_and_a_key_following_the_seed_its_own_cell(
        tmp_path: Path) -> None:
    assert seed_list(3) == [0, 1, 2] and seed_list([4, 1]) == [4, 1]
    for bad in (0, -1, [], [1, 1], [-2], "3", True, [1.5]):
        with pytest.raises(ConfigError, match="seeds=.* is not allowed: seeds must be"):
            seed_list(bad)
    dirs = [Path(c["paths"]["job_dir"]) for c in _composed(tmp_path, ["experiment=demo", "eraser=leace"])]
    assert [d.name for d in dirs] == ["seed0", "seed1", "seed2"] and len({d.parent for d in dirs}) == 1
    listed = _composed(tmp_path, ["experiment=demo", "eraser=leace", "seeds=[2,7]"])
    assert [c["seed"] for c in listed] == [2, 7] and [Path(c["paths"]["job_dir"]).parent for c in listed] == \
        [dirs[0].parent] * 2
    (one,) = _composed(tmp_path, ["experiment=demo", "eraser=leace", "seed=3"])  # the preset's seeds: 3
    assert one["seed"] == 3 and Path(one["paths"]["job_dir"]) == dirs[0].parent / "seed3"
    assert load_job(one).seed == 3 and "seeds" not in load_job(one).to_dict()
    # dataset.data_seed=${seed}: each seed is its own configuration (its own c<hash>); calibrate's seeds share one
    own = _composed(tmp_path, ["experiment=calibrate", "dataset.data_seed=${seed}", "seeds=2"])
    shared = _composed(tmp_path, ["experiment=calibrate", "seeds=2"])
    assert len({Path(c["paths"]["job_dir"]).parent for c in own}) == 2
    assert len({Path(c["paths"]["job_dir"]).parent for c in shared}) == 1
