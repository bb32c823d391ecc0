"""The memory estimate (training/tasks/mdl/refusals.py `estimate_memory`) bounds what a job holds, measured: the
tensors alive (every CPU storage the job made, counted once) each time a block model finishes, for each engine and
`training.parallel_models` setting, and one model at a time holds one model (the finished ones are let go)."""

from __future__ import annotations

import gc
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers import TINY, job_config
from training.tasks.mdl.job import run_job

MIN_BYTES = 1 << 14  # storages this big or bigger: weights, optimizer state, snapshots, batches


def _storages() -> dict[int, int]:
    gc.collect()
    out: dict[int, int] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance on deprecated module attributes gc finds warns
        objects = [obj for obj in gc.get_objects() if isinstance(obj, torch.Tensor)]
    for obj in objects:
        try:
            if isinstance(obj, torch.Tensor) and obj.device.type == "cpu" and not obj.is_meta:
                storage = obj.untyped_storage()
                if storage.nbytes() >= MIN_BYTES:
                    out[storage.data_ptr()] = storage.nbytes()
        except (RuntimeError, ReferenceError):
            continue
    return out


def _held_peak(tmp_path: Path, overrides: list[str]) -> tuple[int, Any]:
    """(the most bytes the job's models held as a block model finished, beyond what was alive before they
    trained; the job's memory estimate)."""
    from training.app.tasks import load_job
    from training.data import load_dataset
    from training.tasks.mdl import trainer as trainer_module
    from training.tasks.mdl.refusals import estimate_memory

    cfg = job_config(tmp_path, overrides)
    job = load_job(cfg)
    data = load_dataset(job.dataset, job.paths.data_dir)
    est = estimate_memory(job, data, len(data.y))
    peaks: list[int] = []
    original = trainer_module.Trainer.train_many

    def train_many(self: Any, jobs: list[Any], on_finish: Callable[..., None]) -> None:
        before = _storages()

        def measured(*args: Any) -> None:
            peaks.append(sum(n for p, n in _storages().items() if p not in before))
            on_finish(*args)

        original(self, jobs, measured)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(trainer_module.Trainer, "train_many", train_many)
        run_job(cfg)
    return max(peaks), est


WIDE = [*TINY, "arch.width=256", "arch.depth=4", "mdl.max_epochs=1", "progress=false"]


@pytest.mark.parametrize("extra", [["training.engine=loop", "training.parallel_models=1"],
                                   ["training.engine=loop", "training.parallel_models=auto"],
                                   ["training.engine=loop", "training.parallel_models=2"],
                                   ["training.engine=stacked", "training.parallel_models=1"],
                                   ["training.engine=stacked", "training.parallel_models=auto"]])
def test_the_estimate_bounds_what_the_models_hold(tmp_path: Path, extra: list[str]) -> None:
    held, est = _held_peak(tmp_path, [*WIDE, *extra])
    assert 0 < held <= est.models + est.batches, (held, est)


def test_one_model_at_a_time_holds_one_model_whatever_the_blocks(tmp_path: Path) -> None:
    """The MLP's weights, its optimizer's state and its snapshot: MODEL_COPIES at most (less its gradients, freed
    by then), for 3 blocks as for 6; a finished model is not kept while the next one trains."""
    from training.tasks.mdl.refusals import MODEL_COPIES

    one = ["training.engine=loop", "training.parallel_models=1"]
    held = {blocks: _held_peak(tmp_path / str(blocks), [*WIDE, *one, f"mdl.num_blocks={blocks}"])
            for blocks in (3, 6)}
    per_model = held[3][1].models // (MODEL_COPIES + 1)  # 2 models: one training, one more counted
    assert held[3][0] == held[6][0] <= MODEL_COPIES * per_model, (held, per_model)
