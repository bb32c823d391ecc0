"""Shared test setup: single-threaded torch, wandb disabled, GPU/SLURM tests skipped when unavailable."""

from __future__ import annotations

import os
import shutil

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["WANDB_MODE"] = "disabled"

import torch  # noqa: E402

import training  # noqa: E402,F401  (registers the OmegaConf resolvers conf/ uses)

torch.set_num_threads(1)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs CUDA")
    no_slurm = pytest.mark.skip(reason="needs SLURM (sbatch)")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if "slurm" in item.keywords and shutil.which("sbatch") is None:
            item.add_marker(no_slurm)
