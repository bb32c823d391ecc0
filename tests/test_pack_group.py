"""`training.pack_group`: inside a pack (hydra/launcher=packed) the later seeds' block models train in the first job's
lockstep group (members = jobs x blocks) and every job's result equals the job run alone, for both engines; nothing
is trained ahead where the seeds' data differ, for a later job that is done, or beyond what fits in memory; a model
trained ahead that does not fit its job is trained again; a failed group leaves each job to train alone.

The jobs run in process through the job lifecycle (`run_job`), as the packed launcher runs them (tests/test_packed.py
runs the launcher itself, killed part-way included)."""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import job_config, result_of
from training.app.tasks import load_job
from training.data import shared
from training.tasks.mdl import pack_group
from training.tasks.mdl.job import run_job

SMOKE = ["experiment=smoke", "eraser=leace", "mdl.max_epochs=12", "training.pack_group=true"]
SEEDS = (0, 1, 2)
NUMBERS = ("mdl", "final", "eraser", "model", "optim", "dataset")  # every result section but timings and provenance


def _config(out: Path, seed: int, *extra: str) -> dict[str, Any]:
    return job_config(out, [*SMOKE, f"seed={seed}", *extra])


def _numbers(result: dict[str, Any]) -> dict[str, Any]:
    def strip(v: Any) -> Any:  # wall times differ from run to run
        if isinstance(v, dict):
            return {k: strip(x) for k, x in v.items() if "seconds" not in k and k != "cache_hit"}
        if isinstance(v, list):
            return [strip(x) for x in v]
        return v

    return strip({k: result[k] for k in NUMBERS})


def _alone(out: Path, *extra: str, seeds: tuple[int, ...] = SEEDS) -> dict[int, dict[str, Any]]:
    return {s: _numbers(result_of(run_job(_config(out, s, *extra)))) for s in seeds}


def _packed(out: Path, *extra: str, seeds: tuple[int, ...] = SEEDS) -> tuple[dict[int, dict[str, Any]], shared.Pack]:
    with shared.packed(seeds) as pack:
        results = {s: _numbers(result_of(run_job(_config(out, s, *extra), pack))) for s in seeds}
    return results, pack


@pytest.mark.parametrize("engine", ["loop", "stacked"])
def test_a_pack_group_gives_each_job_its_lone_numbers(tmp_path: Path, engine: str,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    alone = _alone(tmp_path / "alone", f"training.engine={engine}")
    with caplog.at_level(logging.INFO):
        packed, pack = _packed(tmp_path / "packed", f"training.engine={engine}")
    assert "pack group: this job's 6 models and 12 of seed(s) 1, 2 train in one lockstep group" in caplog.text
    assert caplog.text.count("6 of this job's 6 models were trained in an earlier seed's pack group") == 2
    assert not pack.ahead  # every model trained ahead was used
    for s in SEEDS:
        assert packed[s] == alone[s], s


def test_no_pack_group_where_the_seeds_data_differ_or_on_cpu_by_default(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.INFO):
        _packed(tmp_path / "permuted", "dataset.permute_labels=true", seeds=(0, 1))
        _packed(tmp_path / "auto", "training.pack_group=auto", seeds=(0, 1))  # the loop engine: CPU's default
    assert "pack group" not in caplog.text
    assert "trained in an earlier seed's" not in caplog.text


def test_a_later_job_that_is_done_or_does_not_fit_in_memory_is_not_trained_ahead(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    out = tmp_path / "runs"
    run_job(_config(out, 1))  # seed 1 is done before the pack runs
    with caplog.at_level(logging.INFO):
        _packed(out)
    assert "this job's 6 models and 6 of seed(s) 2 train" in caplog.text
    assert caplog.text.count("were trained in an earlier seed's pack group") == 1  # seed 2 only; seed 1 skipped

    # room for this job and one more: seeds 1 and 2 join seed 0's group of 12 rows, seed 2's models wait for a row
    import training.tasks.mdl.job as job_module

    monkeypatch.setattr(job_module, "jobs_that_fit", lambda *a: 2)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        packed, pack = _packed(tmp_path / "room")
    assert "this job's 6 models and 12 of seed(s) 1, 2 train in one lockstep group of 12 rows" in caplog.text
    assert caplog.text.count("6 of this job's 6 models were trained in an earlier seed's pack group") == 2
    assert packed == _alone(tmp_path / "alone")


def test_the_memory_estimate_covers_the_pack(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from training.data import load_dataset
    from training.tasks.mdl import refusals as precheck

    cfg = load_job(_config(tmp_path, 0))
    data = load_dataset(cfg.dataset)
    est = precheck.estimate_memory(cfg, data, len(data.y))
    per_job = est.models + est.batches
    for free, fit in [(est.total, 1), (est.total + per_job - 1, 1), (est.total + 2 * per_job, 3)]:
        monkeypatch.setattr(precheck, "available_memory", lambda device, free=free: free)
        assert precheck.jobs_that_fit(cfg, data, torch.device("cpu")) == fit, free


def test_a_model_trained_ahead_on_other_data_is_trained_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    real = pack_group.keep_for_later

    def on_other_labels(companion: pack_group.Companion, *args: Any) -> None:
        real(companion, *args)
        pack = companion.trainer.pack
        assert pack is not None
        for key, found in pack.ahead.items():  # as if the later seed's group had trained on other labels
            pack.ahead[key] = dataclasses.replace(found, y=torch.roll(found.y, 1))

    monkeypatch.setattr(pack_group, "keep_for_later", on_other_labels)
    with caplog.at_level(logging.INFO):
        packed, pack = _packed(tmp_path / "packed", seeds=(0, 1))
    assert caplog.text.count("trained ahead in this pack does not fit this job") == 6
    assert "trained in an earlier seed's pack group" not in caplog.text
    assert packed == _alone(tmp_path / "alone", seeds=(0, 1))


def test_a_failed_pack_group_leaves_each_job_to_train_alone(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    def fail(*args: Any) -> None:
        raise RuntimeError("a later seed's model failed")

    monkeypatch.setattr(pack_group, "keep_for_later", fail)
    with caplog.at_level(logging.INFO):
        packed, pack = _packed(tmp_path / "packed", seeds=(0, 1))
    assert "the pack group failed (RuntimeError: a later seed's model failed)" in caplog.text
    assert not pack.ahead
    assert packed == _alone(tmp_path / "alone", seeds=(0, 1))


@pytest.mark.parametrize(("eraser", "engine"), [("leace", "loop"), ("qleace_paper", "loop"),
                                                ("qleace_paper", "stacked")])
def test_a_pack_group_erases_each_batch_as_lone_jobs_do(tmp_path: Path, eraser: str, engine: str,
                                                        caplog: pytest.LogCaptureFixture) -> None:
    """`eraser.after_augment` (every paper preset): the seeds share the eraser fitted on all rows, so the group forms;
    its members draw batches from the unerased images, erase each one (QLEACE: by class, from the host's labels) and
    validate on their own seed's rows of the erased images: each job's numbers are its lone numbers (on CPU; the
    stacked engine erases all rows of a step in one call, which here too gives the lone bits)."""
    extra = (f"eraser={eraser}", "eraser.after_augment=true", f"training.engine={engine}")
    alone = _alone(tmp_path / "alone", *extra, seeds=(0, 1))
    with caplog.at_level(logging.INFO):
        packed, pack = _packed(tmp_path / "packed", *extra, seeds=(0, 1))
    assert "pack group: this job's 6 models and 6 of seed(s) 1 train in one lockstep group" in caplog.text
    assert "6 of this job's 6 models were trained in an earlier seed's pack group" in caplog.text
    assert not pack.ahead
    assert packed[1]["eraser"]["after_augment"] is True and packed[1]["eraser"]["batch_eraser"]["applied"]
    assert packed == alone


def test_a_model_trained_ahead_with_another_batch_eraser_is_trained_again(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    real = pack_group.keep_for_later

    def other_map(companion: pack_group.Companion, *args: Any) -> None:
        real(companion, *args)
        pack = companion.trainer.pack
        assert pack is not None
        for key, found in pack.ahead.items():  # as if the later seed's batches had been erased by another map
            kind, first, *rest = found.batch_map
            pack.ahead[key] = dataclasses.replace(found, batch_map=(kind, first + 1e-12, *rest))

    monkeypatch.setattr(pack_group, "keep_for_later", other_map)
    extra = ("eraser.after_augment=true", "training.engine=loop")
    with caplog.at_level(logging.INFO):
        packed, _ = _packed(tmp_path / "packed", *extra, seeds=(0, 1))
    assert "pack group: this job's 6 models and 6 of seed(s) 1 train" in caplog.text
    assert caplog.text.count("trained ahead in this pack does not fit this job") == 6
    assert packed == _alone(tmp_path / "alone", *extra, seeds=(0, 1))
