"""Checkpoints inside a block: a job stopped in the middle of its block models saves them and the
next attempt goes on from there, with exactly the numbers of an uninterrupted run, for every engine.

The stop request is injected where a signal handler would make it (training/common/interrupt.py): `requested()`
turns true at the N-th step of an attempt, deterministically.
"""

from __future__ import annotations

import io
import logging
import os
import re
import signal
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import job_config, result_of
from training.app.lifecycle import PROGRESS_FILE
from training.cli.preemption import Preempted, stop_on_sigterm
from training.common import interrupt
from training.engine.checkpoint import PATTERN, CheckpointStore, _read
from training.tasks.mdl.job import run_job

JOB = ["experiment=smoke", "eraser=control", "seed=0", "mdl.max_epochs=12", "mdl.patience=12"]


def _numbers(result: dict[str, Any]) -> dict[str, Any]:
    mdl = result["mdl"]
    return {"hash": result["config_hash"], "bits": mdl["bits_per_sample"], "ce": mdl["block_ce_bits"],
            "legacy": mdl["legacy"], "blocks": [(b["epochs"], b["best_epoch"], b["steps"], b["best_val_loss"])
                                                for b in mdl["blocks"]],
            "final": None if result["final"] is None else (result["final"]["val_loss_curve"],
                                                           result["final"]["best_epoch"])}


def _stop_at(monkeypatch: pytest.MonkeyPatch, step: int) -> None:
    """The step-th check of the attempt answers "stop" (as after a SIGTERM)."""
    calls = {"n": 0}

    def requested() -> bool:
        calls["n"] += 1
        return calls["n"] >= step

    monkeypatch.setattr(interrupt, "requested", requested)
    monkeypatch.setattr(interrupt, "signum", lambda: int(signal.SIGTERM))


def _load(path: Path) -> dict[str, Any]:
    """A checkpoint file's content, whatever its configuration."""
    saved = torch.load(io.BytesIO(path.read_bytes().partition(b"\n")[2]), weights_only=True)
    why, checked = _read(path, saved["key"])
    assert checked is not None, why
    return checked


def _saved_steps(job_dir: Path) -> list[int]:
    return sorted(int(_load(p)["state"]["step"]) for p in job_dir.glob(PATTERN))


def _resumed_steps(text: str) -> list[int]:
    return [int(s) for s in re.findall(r"resuming .* at step (\d+)", text)]


def _interrupted_run(cfg: dict[str, Any], monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
                     stops: list[int]) -> dict[str, Any]:
    """Attempts stopped at the given steps, then one to the end; checks each stopped attempt left a checkpoint
    further on than the one before."""
    job_dir = Path(cfg["paths"]["job_dir"])
    last: list[int] = []
    for step in stops:
        caplog.clear()
        with monkeypatch.context() as m, caplog.at_level(logging.INFO):
            _stop_at(m, step)
            with pytest.raises(interrupt.Interrupted) as stopped:
                run_job(cfg)
        assert stopped.value.code == 128 + signal.SIGTERM
        assert not (job_dir / "result.json").exists()
        if last:  # this attempt went on from the previous one's checkpoint
            assert set(last) & set(_resumed_steps(caplog.text)), (last, caplog.text[-2000:])
        steps = _saved_steps(job_dir)
        assert steps and max(steps) > max(last, default=-1), (steps, last)  # and made progress
        last = steps
    caplog.clear()
    with caplog.at_level(logging.INFO):
        result = result_of(run_job(cfg))
    assert set(last) & set(_resumed_steps(caplog.text)), (last, caplog.text[-2000:])
    assert not list(job_dir.glob(PATTERN)) and not (job_dir / PROGRESS_FILE).exists()
    return result


STOPS = [7, 25, 60]
REFILL_STOPS = [60, 75, 30]  # steps 59, 133 and 162 of 216 (each attempt counts from its resumed step)


@pytest.mark.parametrize(("overrides", "stops"), [
    ([], STOPS),  # the loop engine, all block models and the full-data model in one lockstep group
    (["training.engine=stacked"], STOPS),
    (["training.parallel_models=1"], STOPS),  # `fit`, one model after another (a checkpoint mid-epoch)
    (["training.workers=2"], STOPS),  # two worker threads, each a lockstep group with its own checkpoint
    (["training.fused_optimizer=eager"], STOPS),  # the loop engine's flat optimizer buffers
    (["dataset.augment=true"], STOPS),  # crops and flips drawn per epoch: saved with the batch order
    (["dataset.augment=true", "training.parallel_models=1"], STOPS),
    # Blocks 2-5 are finished at step 79: the next attempt has one model left, which goes on in its group (not
    # alone, as a resumed job's last model would otherwise train)
    (["mdl.full_run=false"], [80]),
    (["mdl.full_run=false", "training.engine=stacked"], [80]),
    # Two rows for six models: stops before and after rows were refilled (the first at step 108)
    (["training.parallel_models=2"], REFILL_STOPS),
    (["training.parallel_models=2", "training.engine=stacked"], REFILL_STOPS),
    # the done vector read every 50 steps: checkpoints hold stopped rows not yet polled and unread validations
    (["training.parallel_models=2", "training.poll_every=50"], REFILL_STOPS),
    (["training.parallel_models=2", "training.fused_optimizer=eager"], REFILL_STOPS),  # chunks of two, no refill
], ids=["loop", "stacked", "fit", "workers", "flat-optim", "augment", "augment-fit", "last-model",
        "last-model-stacked", "refill", "refill-stacked", "refill-polled", "chunks-flat-optim"])
def test_a_job_stopped_inside_its_blocks_resumes_to_the_uninterrupted_numbers(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture,
        overrides: list[str], stops: list[int]) -> None:
    reference = result_of(run_job(job_config(tmp_path / "ref", [*JOB, *overrides])))
    cfg = job_config(tmp_path / "cut", [*JOB, *overrides])
    result = _interrupted_run(cfg, monkeypatch, caplog, stops=stops)
    assert _numbers(result) == _numbers(reference)


@pytest.mark.parametrize("damage", ["truncate", "garbage", "other-config", "other-code", "other-code-fit",
                                    "garbage-fit"])
def test_a_corrupt_or_stale_checkpoint_is_ignored_with_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                caplog: pytest.LogCaptureFixture,
                                                                damage: str) -> None:
    job = [*JOB, "training.parallel_models=1"] if damage.endswith("fit") else JOB
    reference = result_of(run_job(job_config(tmp_path / "ref", job)))
    cfg = job_config(tmp_path / "cut", job)
    job_dir = Path(cfg["paths"]["job_dir"])
    with monkeypatch.context() as m:
        _stop_at(m, 30)
        with pytest.raises(interrupt.Interrupted):
            run_job(cfg)
    (path,) = job_dir.glob(PATTERN)
    saved = _load(path)
    if job is JOB:  # the checkpoint holds the whole group mid-block
        state = saved["state"]
        assert state["step"] == 29 and len(saved["names"]) == 6  # five block models and the full-data model
        assert len(state["live"]) >= 1 and state["plan"]["cursor"].tolist()  # models in training, mid-epoch positions
        assert path.stat().st_size < 2_000_000
    if damage == "truncate":
        path.write_bytes(path.read_bytes()[:-100])
    elif damage.startswith("garbage"):
        path.write_bytes(b"not a checkpoint")
    elif damage == "other-config":
        CheckpointStore(job_dir, "another-config-hash").save(saved["names"], saved["state"])
    else:  # the same configuration, written by code whose model has other shapes (or an older format)
        state = saved["state"]
        if "shapes" in state:
            state["shapes"] = {n: [*shape, 1] for n, shape in state["shapes"].items()}
        else:
            state["model"] = {n: v[None] for n, v in state["model"].items()}
        CheckpointStore(job_dir, saved["key"]).save(saved["names"], state)
    with caplog.at_level(logging.WARNING):
        result = result_of(run_job(cfg))
    lines = [r.getMessage() for r in caplog.records if "ignoring checkpoint" in r.getMessage()]
    assert len(lines) == 1 and str(path) in lines[0], lines
    why = {"other-config": "another configuration", "other-code": "does not fit these models",
           "other-code-fit": "does not fit these models"}.get(damage, "hash does not match")
    assert why in lines[0], lines
    assert "resuming" not in caplog.text
    assert _numbers(result) == _numbers(reference)
    assert not list(job_dir.glob(PATTERN))


def _signal_at(monkeypatch: pytest.MonkeyPatch, signum: int, step: int) -> None:
    """The real signal, sent to this process at the step-th check of the attempt (the loop's own check follows)."""
    real, calls = interrupt.requested, {"n": 0}

    def requested() -> bool:
        calls["n"] += 1
        if calls["n"] == step:
            os.kill(os.getpid(), signum)  # the handler runs in the main thread before the next bytecode
        return real()

    monkeypatch.setattr(interrupt, "requested", requested)


def test_sigterm_while_models_train_saves_them_then_stops_with_143(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """(A request outside a training loop is refused: the handler stops the job itself; no request, no checkpoint.)"""
    assert interrupt.request(signal.SIGTERM) is False and not interrupt.requested()
    ref = job_config(tmp_path / "ref", JOB)
    reference = result_of(run_job(ref))
    assert not list(Path(ref["paths"]["job_dir"]).glob(PATTERN))
    cfg = job_config(tmp_path / "cut", JOB)
    job_dir = Path(cfg["paths"]["job_dir"])
    with monkeypatch.context() as m:
        _signal_at(m, signal.SIGTERM, 40)
        with pytest.raises(Preempted) as stopped, stop_on_sigterm():
            run_job(cfg)
    assert stopped.value.code == 143
    assert _saved_steps(job_dir) == [39]  # the request came at the 40th step's check: 39 steps taken
    assert not interrupt.requested()  # cleared for the next job of the process
    assert _numbers(result_of(run_job(cfg))) == _numbers(reference)


def test_the_time_limit_signal_requeues_only_after_the_checkpoint(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Under submitit, USR2 runs submitit's handler (requeue, exit) once the models have saved, not at once."""
    cfg = job_config(tmp_path, JOB)
    job_dir = Path(cfg["paths"]["job_dir"])
    seen: list[list[int]] = []

    def submitit_handler(signum: int, frame: object) -> None:
        seen.append(_saved_steps(job_dir))
        raise SystemExit(-1)

    monkeypatch.setenv("SUBMITIT_EXECUTOR", "slurm")
    previous = signal.signal(signal.SIGUSR2, submitit_handler)
    try:
        with monkeypatch.context() as m:
            _signal_at(m, signal.SIGUSR2, 25)
            with pytest.raises(SystemExit) as stopped, stop_on_sigterm():
                run_job(cfg)
    finally:
        signal.signal(signal.SIGUSR2, previous)
    assert stopped.value.code == -1 and seen == [[24]]
