"""Every task honours every key that enters its hash, or refuses it in one line.

For each task, a tiny base job; for each leaf of its semantic config (training/app/schema.py `semantic`, what the
job hash covers) the key is set to another value. That changes the job hash; then the job must either be refused
with one line naming the key (ConfigError before anything is made), or compute something else (its result's
computed sections differ from the base's). A key whose other value changes the hash and nothing else fails the
test: a "null" (permuted labels) or a "holdout" fit that did nothing would be read as one.

A new key enters this walk by itself (the leaves are enumerated): give it an other value in OTHER if the generic
rule (flip a bool, ×0.5 a float, +1 an int) does not fit it.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import TINY, job_config, result_of
from training.app.result_types import Result
from training.app.schema import ConfigError, flatten
from training.app.tasks import get_task, job_hash, job_semantic, task_names

# Early stopping that binds (gs_erased_eval: patience 1 stops it at step 135 of 180, inside a 300-step warm-up
# because stop_after_warmup is off), so that every stopping key can show it is read; depth 3: the depth lr rule.
STOPPING = ["arch.width=16", "arch.depth=3", "optim.lr=0.05", "optim.warmup_steps=300", "mdl.max_epochs=20",
            "mdl.patience=1", "mdl.stop_after_warmup=false", "mdl.min_steps=0", "mdl.patience_min_steps=0"]
ERASED_EVAL = ["experiment=gs_sd_erasure", "task=gs_erased_eval", "eraser=leace", "dataset=digits", *STOPPING]
BASES: dict[str, list[str]] = {  # tiny budgets; each reaches its every key (e.g. SD starts before the last step)
    "mdl": [*TINY, *STOPPING],
    "gs_two_moons": ["experiment=gs_two_moons", "gs.steps=30", "gs.hidden=16", "gs.grid.n=41"],
    "gs_colored_mnist": ["experiment=gs_colored_mnist", "gs.steps=4", "gs.hidden=8", "gs.eval_every=1",
                         "regularizer.start_step=1", "dataset.n_test=200"],
    "gs_erased_eval": ERASED_EVAL,
}
# What each task computes: its result's sections compared (what it echoes of its config, timings, provenance and
# where it ran are not).
OUTPUTS: dict[str, tuple[str, ...]] = {
    "mdl": ("mdl", "final", "certificate"),
    "gs_two_moons": ("train", "test", "geometry", "train_loss_curve"),
    "gs_colored_mnist": ("train", "test", "environments", "fig3", "curve"),
    "gs_erased_eval": ("eval", "gap_erased_minus_original", "temperature", "fit"),
}
# Another value, as an override, where the generic rule does not fit (a name, a choice, null, a value that must
# bind: mdl.val_size only matters below val_frac·n).
OTHER: dict[str, str] = {
    "dataset.name": "dataset=mnist5k",
    "arch.name": "arch=lenet",
    "regularizer.name": "regularizer=sd",
    "arch.activation": "gelu",
    "arch.depth_counts": "linear",
    "arch.swiglu_ratio": "0.5",
    "arch.parametrization": "sp",
    "dataset.limit": "1000",
    "dataset.zscore_order": "after",
    "eraser.fit_on": "holdout",
    "eraser.fit_labels": "coded",  # eraser=leace_shuffled sets shuffled: the other value is coded
    "eraser.options.method": "orth",
    "eraser.options.rtol": "0.1",
    "mdl.protocol": "paper",
    "mdl.val_size": "100",
    "mdl.patience": "3",
    "mdl.patience_min_steps": "200",
    "mdl.max_epochs": "1",
    "mdl.eval_every_steps": "3",
    "mdl.min_steps": "150",
    "regularizer.loss_scale": "2.0",
    "regularizer.gamma": "0.5",
    "gs.init": "xavier",
    "gs.weight_decay": "0.1",
    "optim.weight_decay": "0.1",
    "dataset.rotation": "30.0",
    "dataset.color_flip": "[0.4,0.1]",
}
OTHER_BY_TASK: dict[tuple[str, str], str] = {
    ("gs_two_moons", "dataset.name"): "dataset=colored_mnist",
    ("gs_colored_mnist", "dataset.name"): "dataset=two_moons",
    ("gs_erased_eval", "eraser.name"): "eraser=random",
    ("gs_erased_eval", "dataset.name"): "dataset=gaussian",  # another dataset in 1 s (MNIST-5k's certificates: 13 s)
    ("mdl", "eraser.name"): "eraser=leace",
    ("gs_colored_mnist", "gs.init"): "default",
}
# Keys with no other value to try here, and why.
NO_OTHER_BY_TASK = {
    ("gs_two_moons", "regularizer.name"): "the preset sets regularizer.lam, an sd option: the ERM runs are lam=0",
    ("gs_colored_mnist", "regularizer.name"): "as gs_two_moons",
}
NO_OTHER = {
    "task": "the task itself",
    "eraser.options": "the control eraser takes no options (any key is refused by the eraser check)",
    "dataset.source": "colored_mnist's other source is the full MNIST files (not offline); it selects the data read",
}
# Known holes, each with its owner: a key that still changes the hash without changing the job here. Listed so the
# walk runs over everything else; an entry that no longer changes the hash is skipped like any other key.
KNOWN: dict[str, str] = {}  # key -> why a dead hashed key is tolerated (none left: a new one must say why)


def _shown(v: Any) -> str:
    return json.dumps(v) if not isinstance(v, str) else v


def _other(task: str, key: str, value: Any) -> str | None:
    """The override that sets `key` to another value; None where NO_OTHER says there is none."""
    top = key.split(".")[0] if key.split(".")[0] in NO_OTHER else key
    if key in NO_OTHER or top in NO_OTHER or (task, key) in NO_OTHER_BY_TASK or value == {}:
        return None
    given = OTHER_BY_TASK.get((task, key), OTHER.get(key))
    if given is not None and "=" in given:
        return given  # a group choice (dataset=..., arch=...)
    if given is None:
        if isinstance(value, bool):
            given = _shown(not value)
        elif isinstance(value, int):
            given = str(value + 1)
        elif isinstance(value, float):
            given = repr(value * 0.5 if value else 0.1)
        else:
            raise AssertionError(f"{task}: no other value for {key}={value!r}: add one to OTHER in {__file__}")
    return f"++{key}={given}"


def _timeless(value: Any) -> Any:
    """`value` without wall-clock timings (`seconds`, `*_s`), which differ between identical runs."""
    if isinstance(value, dict):
        return {k: _timeless(v) for k, v in value.items() if k != "seconds" and not k.endswith("_s")}
    if isinstance(value, list):
        return [_timeless(v) for v in value]
    return value


def _computed(result: dict[str, Any], task: str) -> str:
    return json.dumps(_timeless({k: result.get(k) for k in _outputs(task, result)}), sort_keys=True, default=str)


def _outputs(task: str, result: dict[str, Any]) -> tuple[str, ...]:
    """The computed sections of `task`'s result: OUTPUTS, else (a task not listed) every section it wrote."""
    envelope = {f.name for f in dataclasses.fields(Result)}
    return OUTPUTS.get(task) or tuple(k for k in result if k not in envelope)


def _known(key: str) -> str | None:
    return next((why for k, why in KNOWN.items() if key == k or key.startswith(k + ".")), None)


def _walk(task: str, tmp_path: Path, only: set[str] | None = None, overrides: list[str] | None = None) -> None:
    given = BASES.get(task, [f"experiment={task}"]) if overrides is None else overrides  # else: its preset
    base_cfg = job_config(tmp_path / "base", given)
    run = get_task(task)
    base = result_of(run(base_cfg))
    assert base, f"{task}: the base job computed nothing"
    again = result_of(run(job_config(tmp_path / "again", [*given, "force=true"])))
    assert _computed(again, task) == _computed(base, task), f"{task}: the base job is not deterministic"
    dead: list[str] = []
    known: list[str] = []
    tried = 0
    for i, (key, value) in enumerate(sorted(flatten(job_semantic(base_cfg)).items())):
        if only is not None and key not in only:
            continue
        override = _other(task, key, value)
        if override is None:
            continue
        try:  # the base's cache, as a sweep shares one: a cache entry that ignored the key would show it dead
            cfg = job_config(tmp_path / f"k{i}", [*given, override, f"paths.cache_dir={tmp_path / 'base' / 'cache'}"])
        except Exception as err:  # noqa: BLE001 - Hydra's own refusal of a value
            raise AssertionError(f"{task}: {override} does not compose: {err}") from err
        if job_hash(cfg) == job_hash(base_cfg):
            continue  # not in the hash (or the same value): nothing to honour
        tried += 1
        try:
            result = result_of(run(cfg))
        except ConfigError as err:  # refused, in one line naming the key
            line = str(err)
            assert "\n" not in line and "is not allowed" in line, line
            assert ("task=" in line or "read only with" in line), f"{task}: {override} refused for another " \
                f"reason (a bad value in this test's table?): {line}"
            continue
        if _computed(result, task) == _computed(base, task):
            (known if _known(key) else dead).append(f"{key}={value!r} -> {override}")
    assert tried > 0
    assert not dead, f"task {task}: keys that change the hash but not the computation: {dead}"
    if known:
        print(f"{task}: known, owned elsewhere: {known}")


FAST = tuple(name for name in task_names() if name != "mdl")  # every task (mdl: the walks below)


@pytest.mark.parametrize("task", FAST)
def test_1_every_hashed_key_is_honoured_or_refused(task: str, tmp_path: Path) -> None:
    _walk(task, tmp_path)


# The keys of the mdl task that the Gradient Starvation tasks also hash: the fast walk of the MDL task.
MDL_FAST = {"dataset.permute_labels", "dataset.limit", "dataset.zscore", "dataset.augment", "eraser.fit_on",
            "eraser.after_augment", "mdl.protocol", "mdl.full_run", "mdl.calibrate_temperature", "optim.beta2",
            "certificate", "seed"}


def test_1_mdl_task_walk_fast(tmp_path: Path) -> None:
    _walk("mdl", tmp_path, only=MDL_FAST, overrides=TINY)  # no stopping key: the cheapest MDL job


@pytest.mark.slow
def test_1_mdl_task_walk_every_key(tmp_path: Path) -> None:
    _walk("mdl", tmp_path)


def test_1_the_walk_catches_a_dead_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk fails on a hashed key that changes nothing: two moons' permute_labels, were it not refused."""
    task = get_task("gs_two_moons")
    fixed = {k: v for k, v in task.fixed.items() if k != "dataset.permute_labels"}
    monkeypatch.setattr(task, "fixed", fixed)
    with pytest.raises(AssertionError, match=r"dataset\.permute_labels=False"):
        _walk("gs_two_moons", tmp_path, only={"dataset.permute_labels"})


@pytest.mark.parametrize(("overrides", "refused"), [
    (["dataset.zscore_order=after"], "dataset.zscore_order"),
    (["dataset.zscore=true", "dataset.zscore_order=after"], None),
    (["arch.swiglu_ratio=0.5"], "arch.swiglu_ratio"),
    (["arch.activation=swiglu", "arch.swiglu_ratio=0.5"], None),
    (["mdl.full_run=false", "mdl.eval_every_steps=5"], "mdl.eval_every_steps"),
    (["mdl.full_run=true", "mdl.eval_every_steps=5"], None),
    # gs_erased_eval reads mdl.eval_every_steps and has no full run (mdl.full_run is not in its hash)
    ([*ERASED_EVAL[:4], "mdl.full_run=false", "mdl.eval_every_steps=5"], None),
    (["experiment=gs_two_moons", "dataset.permute_labels=true"], "dataset.permute_labels"),
    ([*ERASED_EVAL[:4], "dataset.permute_labels=true"], None),
    ([*ERASED_EVAL[:4], "eraser.fit_on=holdout"], "eraser.fit_on"),
    ([*ERASED_EVAL[:4], "dataset.zscore=true"], "dataset.zscore"),
    ([*ERASED_EVAL[:4], "eraser=gradient"], "eraser"),  # no map for held-out rows (training/tasks/gs/gs_erased_eval.py)
    (["experiment=smoke", "eraser=gradient"], None),
])
def test_1_a_key_is_refused_only_where_it_is_not_read(tmp_path: Path, overrides: list[str], refused: str | None
                                                      ) -> None:
    from training.app.tasks import load_job

    cfg = job_config(tmp_path, overrides)
    if refused is None:
        load_job(cfg)
        return
    with pytest.raises(ConfigError, match=rf"^{refused}=\S+ is not allowed"):
        load_job(cfg)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("zscore", [False, True])
def test_keys_left_out_of_the_hash_change_nothing(zscore: bool, tmp_path: Path) -> None:
    """The keys the hash leaves out because they change nothing (arch.paper_optim and dataset.paper_lr: tables that
    optim.* interpolate; eraser.after_augment for the identity control) really change nothing; with a z-score after
    the (identity) erasure per batch, after_augment is hashed again."""
    base = [*TINY, "eraser=control", "dataset.augment=true", "mdl.max_epochs=3"]
    if zscore:
        base += ["dataset.zscore=true", "dataset.zscore_order=after"]
    plain = job_config(tmp_path / "a", base)
    tables = job_config(tmp_path / "b", [*base, "++arch.paper_optim.lr.qleace=0.5", "++dataset.paper_lr.lenet=0.1"])
    assert tables["optim"] == plain["optim"] and job_hash(tables) == job_hash(plain)
    per_batch = job_config(tmp_path / "c", [*base, "eraser.after_augment=true"])
    if zscore:
        assert job_hash(per_batch) != job_hash(plain)
        return
    assert job_hash(per_batch) == job_hash(plain)
    run = get_task("mdl")
    assert _computed(result_of(run(per_batch)), "mdl") == _computed(result_of(run(plain)), "mdl")
