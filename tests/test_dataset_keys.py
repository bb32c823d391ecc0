"""Every key a job hashes is read, for every dataset: the generic walk of tests/test_task_keys.py
over the datasets instead of the tasks, at the data level (no training).

For every registered dataset (training/data/registry.py DATASETS) that loads here (the generators, and the bundled or
offline ones; one that needs files this machine lacks is skipped, saying why), every `dataset.*` leaf of the
job's semantic config (what the job hash covers) is set to another value. Where that changes the hash, the job must
either refuse it in one line (load_config, or the precheck's look at the samples: `check_input`) or read it: the data
loaded differ, or the key is one of those applied after loading (AFTER_LOADING, whose effect the task walk checks on
real jobs). A key that changes the hash and nothing else fails the test (mixture's cov_gap did, and colored_mnist's
test_color_flip, which only task=gs_colored_mnist reads). Each key a dataset declares unread by a task
(UNREAD_BY_DATASET) is refused there; without that refusal the walk finds it dead.
"""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import job_config
from tests.test_task_keys import _other
from training.app import loading
from training.app.schema import ConfigError, flatten
from training.app.tasks import job_hash, job_semantic, load_job
from training.data import load_dataset
from training.data.registry import DATASETS as REGISTERED
from training.data.registry import dataset_traits
from training.errors import UserError
from training.tasks.mdl.refusals import check_input

# Every registered dataset; those that read their images from files (CIFAR, SVHN, Fashion-MNIST: skipped where absent)
# load tens of thousands of images for each key: slow.
DATASETS = [pytest.param(d, marks=pytest.mark.slow) if dataset_traits(d).files else d for d in REGISTERED.names()]
# applied to the loaded data by the job (their effect on the numbers: tests/test_task_keys.py, on real jobs)
AFTER_LOADING = {"dataset.augment", "dataset.zscore", "dataset.zscore_order", "dataset.permute_labels"}
SKIP = {"dataset.name": "another dataset altogether"}


def _loaded(overrides: list[str], tmp_path: Path) -> tuple[Any, Any]:
    cfg = load_job(job_config(tmp_path, overrides))
    data = load_dataset(cfg.dataset, cfg.paths.data_dir)
    check_input(cfg.dataset, cfg.eraser.name, cfg.arch, data)
    return cfg, data


def _dead_keys(dataset: str, tmp_path: Path, keys: Collection[str] | None = None) -> tuple[int, list[str]]:
    """(how many hashed `dataset.*` keys of an MDL job on `dataset` (all, or `keys`) change its hash, those of them
    that change nothing else: neither refused nor read)."""
    base = [f"dataset={dataset}"]
    try:
        base_cfg = job_config(tmp_path, base)
        _, data = _loaded(base, tmp_path)
    except (UserError, OSError) as err:  # a dataset that needs files this machine lacks (DatasetMissingError)
        pytest.skip(f"{dataset} does not load here: {type(err).__name__}: {str(err)[:80]}")
    content, tried, dead = data.content_hash(), 0, []
    for key, value in sorted(flatten(job_semantic(base_cfg)).items()):
        if not key.startswith("dataset.") or key in SKIP or (keys is not None and key not in keys):
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
    return tried, dead


@pytest.mark.parametrize("dataset", DATASETS)
def test_every_hashed_dataset_key_is_read_or_refused(dataset: str, tmp_path: Path) -> None:
    tried, dead = _dead_keys(dataset, tmp_path)
    assert tried > 0
    assert not dead, f"dataset {dataset}: keys that change the hash but not the data: {dead}"


MDL_UNREAD = [pytest.param(e, id=f"{e[1]}-{e[0]}", marks=[pytest.mark.slow] if dataset_traits(e[1]).files else [])
              for e in loading.UNREAD_BY_DATASET if e[3] is None or "mdl" in e[3]]


@pytest.mark.parametrize("entry", MDL_UNREAD)
def test_a_key_declared_unread_is_dead_without_its_refusal(entry: tuple[str, str, Any, Any], tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Each key a dataset declares unread by MDL jobs (UNREAD_BY_DATASET) is what the walk above catches when the
    refusal is taken away: the declaration is needed, and the walk finds such a key."""
    key, dataset = entry[0], entry[1]
    monkeypatch.setattr(loading, "UNREAD_BY_DATASET", tuple(e for e in loading.UNREAD_BY_DATASET if e != entry))
    tried, dead = _dead_keys(dataset, tmp_path, keys={key})
    assert tried == 1 and [d.split("=")[0] for d in dead] == [key], dead
