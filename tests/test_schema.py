"""Typed configs: one-line errors for bad values, what the job hash and the eraser cache key cover, old results."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest
import torch

from models.mlp import MlpOptions
from training.app.results import legacy_differences
from training.app.schema import ConfigError, JobConfig, flatten, numerics_of
from training.app.tasks import job_cell_hash, job_hash, load_job, spec_of
from training.common.files import atomic_write_json
from training.data import LoadedData
from training.inputs.erase import cache_key

from .helpers import job_config, result_of

SMOKE = ["experiment=smoke", "mdl.max_epochs=3", "mdl.full_run=false", "certificate=false"]


@pytest.mark.parametrize("override, message", [
    ("arch.width=0", "arch.width=0 is not allowed: arch.width must be an integer ≥ 1"),
    ("arch.width=-5", "arch.width=-5 is not allowed: arch.width must be an integer ≥ 1"),
    ("arch.depth=0", "arch.depth=0 is not allowed: arch.depth must be an integer ≥ 1"),
    ("mdl.max_epochs=0", "mdl.max_epochs=0 is not allowed: mdl.max_epochs must be an integer ≥ 1"),
    ("seed=abc", "seed='abc' is not allowed: seed must be an integer ≥ 0"),
    ("mdl.num_blocks=-1", "mdl.num_blocks=-1 is not allowed: mdl.num_blocks must be an integer ≥ 2"),
    ("optim.lr=0", "optim.lr=0 is not allowed: optim.lr must be a number > 0"),
    ("optim.lr=-0.1", "optim.lr=-0.1 is not allowed: optim.lr must be a number > 0"),
    ("training.engine=fast",
     "training.engine='fast' is not allowed: training.engine must be one of auto, loop, stacked"),
    ("dataset.zscore=maybe", "dataset.zscore='maybe' is not allowed: dataset.zscore must be true or false"),
    ("optim.beta1=1.5", "optim.beta1=1.5 is not allowed: optim.beta1 must be a number in [0, 1)"),
    ("+eraser.options.bogus=1", "eraser.options.bogus is not allowed: not an option of eraser control"),
    # group options are declared by their module
    ("+arch.bogus=1", "arch.bogus=1 is not allowed: not an option of architecture mlp"),
    ("arch.activation=tanh", "arch.activation='tanh' is not allowed: arch.activation must be one of relu, gelu, "
                             "swiglu"),
    ("+dataset.n=5", "dataset.n=5 is not allowed: not an option of dataset digits"),
    ("eraser=qleace", None),
    ("regularizer=sd", None),
])
def test_bad_values_are_one_line_naming_key_value_and_what_is_allowed(override: str, message: str | None,
                                                                      tmp_path: Path) -> None:
    cfg = job_config(tmp_path, [*SMOKE, override])
    if message is None:
        load_job(cfg)
        return
    with pytest.raises(ConfigError) as err:
        load_job(cfg)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_the_job_receives_frozen_typed_sections_read_as_attributes(tmp_path: Path) -> None:
    composed = job_config(tmp_path, SMOKE)
    job = load_job(composed)
    assert isinstance(job, JobConfig) and job.mdl.max_epochs == 3 and job.training.engine == "auto"
    assert isinstance(job.arch.options, MlpOptions) and job.arch.options.activation == "relu"  # the MLP's own key
    assert not hasattr(job, "get") and not hasattr(job.mdl, "get")  # no mapping reads with a default on the side
    with pytest.raises(dataclasses.FrozenInstanceError):
        job.mdl.patience = 1  # type: ignore[misc]
    stored = flatten(job.to_dict())  # what result.json stores: every composed key, unchanged (but the cell's seeds)
    assert all(stored[k] == v for k, v in flatten(composed).items() if not k.startswith("hydra.") and k != "seeds")
    assert "seeds" in composed and "seeds" not in stored
    assert job_hash(job) == job_hash(composed)


def test_hash_ignores_where_and_how_but_not_what(tmp_path: Path) -> None:
    base = job_config(tmp_path, SMOKE)
    same = [["+dataset.download=false"], ["+dataset.root=/elsewhere"], ["training.workers=1"], ["progress=true"],
            ["device=cpu"], ["logger=wandb"], [f"paths.out_dir={tmp_path / 'other'}"], ["dataset.tag=renamed"]]
    for extra in same:
        assert job_hash(job_config(tmp_path, [*SMOKE, *extra])) == job_hash(base), extra
    for extra in (["mdl.max_epochs=4"], ["optim.lr=0.002"], ["seed=1"], ["dataset.limit=100"]):
        assert job_hash(job_config(tmp_path, [*SMOKE, *extra])) != job_hash(base), extra
    # the directory's cell hash leaves out the seed only
    assert job_cell_hash(job_config(tmp_path, [*SMOKE, "seed=1"])) == job_cell_hash(base)
    assert job_cell_hash(job_config(tmp_path, [*SMOKE, "optim.lr=0.002"])) != job_cell_hash(base)


def test_runtime_eraser_options_stay_out_of_hash_andcache_key(tmp_path: Path) -> None:
    a = job_config(tmp_path, [*SMOKE, "eraser=gradient"])
    b = job_config(tmp_path, [*SMOKE, "eraser=gradient", "eraser.options.progress=false", "eraser.options.device=cpu"])
    assert job_hash(a) == job_hash(b)
    assert job_hash(a) != job_hash(job_config(tmp_path, [*SMOKE, "eraser=gradient", "eraser.options.w_mse=2"]))
    data = LoadedData("toy", torch.zeros(4, 1, 2, 2), torch.tensor([0, 1, 0, 1]), 2)
    assert cache_key(data, "gradient", a["eraser"]["options"]) == cache_key(data, "gradient", b["eraser"]["options"])
    assert "progress" not in cache_key(data, "gradient", {})["options"]
    cfg = job_config(tmp_path, [*SMOKE, "eraser=leace"])  # dead config is gone
    assert "cache" not in cfg["eraser"]
    assert cfg["optim"]["name"] == "schedulefree"  # live since optim=adamw: it picks the optimizer


def test_a_pre_v2_result_of_the_same_config_is_reused_and_another_is_explained(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from training.tasks.mdl.job import run_job

    cfg = job_config(tmp_path, SMOKE)
    old = json.loads(json.dumps(cfg))  # what a pre-v2 job stored: paper settings as null, dead keys, no hash_version
    old["optim"].update(lr=None, beta1=None, warmup_steps=10, name="adamw_schedulefree")
    old["eraser"]["cache"] = True
    legacy = Path(cfg["paths"]["legacy_job_dir"])
    stored = {"config_hash": "0" * 16, "config": old, "mdl": {"bits_per_sample": 1.5}}
    atomic_write_json(legacy / "result.json", stored)  # no numerics_version: older numbers, never reused
    assert legacy_differences(old, load_job(cfg)) == []
    with caplog.at_level("INFO"):
        assert result_of(run_job(cfg))["mdl"]["bits_per_sample"] != 1.5  # recomputed
    assert "numerics version 1" in caplog.text
    cfg = job_config(tmp_path / "again", SMOKE)
    atomic_write_json(Path(cfg["paths"]["legacy_job_dir"]) / "result.json",
                      {**stored, "numerics_version": numerics_of(spec_of("mdl"))})
    caplog.clear()
    with caplog.at_level("INFO"):
        reused = run_job(cfg)
    assert reused.status == "reused" and result_of(reused)["mdl"]["bits_per_sample"] == 1.5  # not recomputed
    assert "pre-v2 layout" in caplog.text and not (Path(cfg["paths"]["job_dir"]) / "result.json").exists()

    other = job_config(tmp_path / "again", [*SMOKE, "mdl.num_blocks=3"])
    assert legacy_differences(old, load_job(other)) == ["mdl.num_blocks"]
    caplog.clear()
    with caplog.at_level("INFO"):
        result = result_of(run_job(other))
    assert "it differs in mdl.num_blocks" in caplog.text
    assert result["hash_version"] == 2 and len(result["mdl"]["blocks"]) == 2
