"""Every key a job hashes is read, for every dataset (issue 39, req 2): the generic walk of tests/test_task_keys.py
over the datasets instead of the tasks, at the data level (no training).

For every registered dataset (training/data/registry.py DATASETS) that loads here (the generators, and the bundled or
offline ones; one that needs files this machine lacks is skipped, saying why), every `dataset.*` leaf of the
job's semantic config (what the job hash covers) is set to another value. Where that changes the hash, the job must
either refuse it in one line (load_config, or the precheck's look at the samples: `check_input`) or read it: the data
loaded differ, or the key is one of those applied after loading (AFTER_LOADING, whose effect the task walk checks on
real jobs). A key that changes the hash and nothing else fails the test (mixture's cov_gap did).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.helpers import job_config
from tests.test_task_keys import _other
from training.app.schema import ConfigError, flatten
from training.app.tasks import job_hash, job_semantic, load_job
from training.data.registry import DATASETS as REGISTERED
from training.errors import UserError

# Every registered dataset (CIFAR, SVHN, Fashion-MNIST need files: skipped where absent); those that read files take
# longer (seconds a load, a dozen keys): slow.
SLOW = {"digits", "mnist5k", "colored_mnist", "cifar10", "cifarnet", "fashion_mnist", "svhn"}
DATASETS = [pytest.param(d, marks=pytest.mark.slow) if d in SLOW else d for d in REGISTERED.names()]
# applied to the loaded data by the job (their effect on the numbers: tests/test_task_keys.py, on real jobs)
AFTER_LOADING = {"dataset.augment", "dataset.zscore", "dataset.zscore_order", "dataset.permute_labels"}
SKIP = {"dataset.name": "another dataset altogether"}


def _loaded(overrides: list[str], tmp_path: Path) -> tuple[Any, Any]:
    from training.data import load_dataset
    from training.tasks.mdl.refusals import check_input

    cfg = load_job(job_config(tmp_path, overrides))
    data = load_dataset(cfg.dataset, cfg.paths.data_dir)
    check_input(cfg.dataset, cfg.eraser.name, cfg.arch, data)
    return cfg, data


@pytest.mark.parametrize("dataset", DATASETS)
def test_every_hashed_dataset_key_is_read_or_refused(dataset: str, tmp_path: Path) -> None:
    base = [f"dataset={dataset}"]
    try:
        base_cfg = job_config(tmp_path, base)
        _, data = _loaded(base, tmp_path)
    except (UserError, OSError) as err:  # a dataset that needs files this machine lacks (DatasetMissingError)
        pytest.skip(f"{dataset} does not load here: {type(err).__name__}: {str(err)[:80]}")
    content, tried, dead = data.content_hash(), 0, []
    for key, value in sorted(flatten(job_semantic(base_cfg)).items()):
        if not key.startswith("dataset.") or key in SKIP:
            continue
        override = f"++{key}={len(data.y) // 2}" if key == "dataset.limit" else _other("mdl", key, value)
        if override is None:
            continue
        cfg = job_config(tmp_path, [*base, override])
        if job_hash(cfg) == job_hash(base_cfg):
            continue
        tried += 1
        try:
            _, other = _loaded([*base, override], tmp_path)
        except ConfigError as err:
            assert "\n" not in str(err) and "is not allowed" in str(err), str(err)
            continue
        if other.content_hash() == content and key not in AFTER_LOADING:  # the hash covers the samples and labels
            dead.append(f"{key}={value!r} -> {override}")
    assert tried > 0
    assert not dead, f"dataset {dataset}: keys that change the hash but not the data: {dead}"
