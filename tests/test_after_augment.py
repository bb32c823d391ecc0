"""eraser.after_augment=true: each augmented training batch is erased on the device by the fitted
eraser (`transform(augment(x))`, the paper code's order), while the validation set and the coded blocks are the
once-erased, unaugmented images. Without augmentation it gives the numbers of after_augment=false."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

import erasure
import models
from erasure.qleace import QleaceEraser, coupling_noise_ranks
from tests.helpers import fit_settings, group_options, job_config, prepare_data, result_of
from tests.test_refusals import _cli
from tests.test_vectorized import _data, _models
from training.app.schema import ConfigError, group_config
from training.app.tasks import load_job
from training.data import LoadedData, load_dataset
from training.engine.batches import DeviceData
from training.engine.fit import Member, TrainData, fit
from training.engine.group import fit_group
from training.engine.seeding import generator
from training.errors import UserError
from training.inputs import pipeline
from training.inputs.erase import BatchEraser, fitted_eraser
from training.inputs.plan import EraserSpec, Rows
from training.inputs.store import Store
from training.tasks.mdl.job import run_job
from training.tasks.mdl.refusals import precheck
from training.tasks.mdl.trainer import Trainer

SMOKE = ["experiment=smoke", "mdl.full_run=false"]
# 3×8×8 class-conditional Gaussians (300 per class: QLEACE's classes are non-singular, no coupling noise), few steps
SYNTH = ["experiment=smoke", "mdl.full_run=false", "dataset=synthetic", "dataset.channels=3", "dataset.size=8",
         "dataset.n=1200", "dataset.augment=true", "mdl.max_epochs=2", "mdl.min_steps=0", "mdl.patience_min_steps=0"]


@pytest.mark.parametrize("overrides", [
    ["eraser=leace"],
    # label-dependent eraser fitted out of sample, erased batches z-scored with the erased data's statistics
    ["eraser=qleace_paper", "eraser.fit_on=holdout", "dataset.zscore=true", "dataset.zscore_order=after"],
], ids=["leace", "qleace-holdout-zscore-after"])
def test_without_augmentation_after_augment_changes_nothing(overrides: list[str], tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Erasing each batch or the data once is the same row-wise map: the same code (measured: bitwise equal on
    CPU, the float64 map rounds to the same float32 batch), while the batches really went through the eraser.
    (Not refused: the paper_fig8 presets set it on SVHN without augmentation, and their job hashes stay.)"""
    calls = {"n": 0}

    class Counting(BatchEraser):
        def __call__(self, x: Tensor, y: Tensor, segments: Any = None) -> Tensor:
            calls["n"] += 1
            return super().__call__(x, y, segments)

    monkeypatch.setattr(pipeline, "BatchEraser", Counting)
    once = result_of(run_job(job_config(tmp_path, [*SMOKE, *overrides])))
    per_batch = result_of(run_job(job_config(tmp_path, [*SMOKE, *overrides, "eraser.after_augment=true"])))
    assert calls["n"] == sum(b["steps"] for b in per_batch["mdl"]["blocks"]) > 0
    assert once["eraser"]["after_augment"] is False and per_batch["eraser"]["after_augment"] is True
    assert per_batch["eraser"]["batch_eraser"]["report"]["name"] == per_batch["eraser"]["name"]
    assert per_batch["mdl"]["block_ce_bits"] == pytest.approx(once["mdl"]["block_ce_bits"], rel=1e-5, abs=1e-6)
    assert [b["steps"] for b in per_batch["mdl"]["blocks"]] == [b["steps"] for b in once["mdl"]["blocks"]]


def _capture(monkeypatch: pytest.MonkeyPatch, keep: int = 6) -> dict[str, Any]:
    """Record the job's Trainer, the first `keep` training gathers (idx, offsets, flips, pad) and the first `keep`
    inputs a model saw in train mode (the fit loop: gather k feeds training forward k)."""
    seen: dict[str, Any] = {"gathers": [], "inputs": []}
    init, batch, build = Trainer.__init__, DeviceData.batch, models.build_with_facts

    def trainer_init(self: Trainer, *args: Any, **kwargs: Any) -> None:
        init(self, *args, **kwargs)
        seen["trainer"] = self

    def gather(self: DeviceData, idx: Tensor, offsets: Tensor | None = None, flips: Tensor | None = None,
               pad: int = 0) -> Tensor:
        if len(seen["gathers"]) < keep:
            assert offsets is not None and flips is not None  # an augmented batch
            seen["gathers"].append((idx.clone(), offsets.clone(), flips.clone(), pad))
        return batch(self, idx, offsets, flips, pad)

    def hooked(*args: Any, **kwargs: Any) -> tuple[torch.nn.Module, dict[str, Any]]:
        model, facts = build(*args, **kwargs)

        def pre(module: torch.nn.Module, inputs: tuple[Tensor, ...]) -> None:
            if module.training and len(seen["inputs"]) < keep:
                seen["inputs"].append(inputs[0].detach().clone())

        model.register_forward_pre_hook(pre)
        return model, facts

    monkeypatch.setattr(Trainer, "__init__", trainer_init)
    monkeypatch.setattr(DeviceData, "batch", gather)
    monkeypatch.setattr(models, "build_with_facts", hooked)
    return seen


@pytest.mark.parametrize("name", ["leace", "qleace"])
def test_training_batches_are_erased_after_augmentation(name: str, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    overrides = [*SYNTH, f"eraser={name}", "training.parallel_models=1"]
    seen = _capture(monkeypatch)
    result = result_of(run_job(job_config(tmp_path, [*overrides, "eraser.after_augment=true"])))
    monkeypatch.undo()
    trainer: Trainer = seen["trainer"]
    coded, once, _ = prepare_data(load_job(job_config(tmp_path, overrides)))  # erased once, unaugmented

    # validation set and coded blocks: the once-erased images, exactly as with after_augment=false
    assert torch.equal(trainer.data.all(), once)
    assert torch.equal(trainer.x_val, once[trainer.split.val_idx])
    # training batches: drawn from the unerased images, erased by the eraser fitted on them (unaugmented)
    assert torch.equal(trainer.train_data.all(), coded.x) and trainer.train_data is not trainer.data
    assert trainer.batch_transform is not None and trainer.batch_transform.eraser is not None
    eraser = trainer.batch_transform.eraser
    assert eraser.name == name and eraser.needs_labels == (name == "qleace")
    refit = erasure.fit(name, coded.x, coded.y, **load_job(job_config(tmp_path, overrides)).eraser.options)
    for key, value in refit.state.items():
        assert torch.allclose(eraser.state[key], value, rtol=1e-10, atol=1e-12), key
    assert result["eraser"]["after_augment"] is True and result["eraser"]["batch_eraser"]["applied"] is True

    assert len(seen["inputs"]) == len(seen["gathers"]) == 6
    for (idx, offsets, flips, pad), model_input in zip(seen["gathers"], seen["inputs"], strict=True):
        y = trainer.y[idx]
        raw = trainer.train_data.batch(idx, offsets, flips, pad)
        assert pad == 1 and not torch.equal(raw, trainer.train_data.batch(idx))  # really augmented
        expected = eraser(raw, y) if eraser.needs_labels else eraser(raw)
        assert torch.equal(model_input, expected)  # eraser(augment(raw batch)), bit for bit
        # ... which is not augment(erased data): the zero padding is erased too
        augmented_once = trainer.data.batch(idx, offsets, flips, pad)
        assert float((model_input - augmented_once).abs().max()) > 1e-2
        if eraser.needs_labels:  # QLEACE maps each row by its own label: the batch's labels were used
            assert not torch.allclose(model_input, eraser(raw, y.roll(1)), atol=1e-3)


def _leace_transform(data: DeviceData, y: Tensor) -> BatchEraser:
    return BatchEraser(erasure.fit("leace", data.all(), y))


@pytest.mark.parametrize("engine", ["loop", "stacked"])
def test_group_engines_erase_each_members_batch_as_fit_does(engine: str) -> None:
    """The lockstep group applies the members' batch transform after augmentation: the loop engine bitwise as
    `fit` (each member's batch alone), the stacked one (all rows in one call) up to float32 rounding."""
    data, y, xv, yv = _data()
    transform = _leace_transform(data, y)
    subsets = [torch.arange(80, 80 + s) for s in (45, 150, 300)]
    cfg = fit_settings(batch_size=32, patience=2, max_epochs=4, augment=True, progress=False, batch_transform=transform)
    alone = [fit(Member(m, o, subsets[k], generator(0, "b", k), cfg), TrainData(data, y, xv, yv))
             for k, (m, o) in enumerate(_models("mlp", [0, 1, 2]))]
    members = [Member(m, o, subsets[k], generator(0, "b", k), cfg)
               for k, (m, o) in enumerate(_models("mlp", [0, 1, 2]))]
    together = fit_group(members, TrainData(data, y, xv, yv), group_options(engine=engine))
    for a, b in zip(alone, together, strict=True):
        assert (a.epochs, a.steps) == (b.epochs, b.steps)
        if engine == "loop":
            assert a.curve == b.curve
        else:
            assert [v for _, v in b.curve] == pytest.approx([v for _, v in a.curve], rel=1e-5)
    # the transform matters: without it the same members train differently
    model, opt = _models("mlp", [0])[0]
    plain_cfg = fit_settings(batch_size=32, patience=2, max_epochs=4, augment=True, progress=False)
    plain = fit(Member(model, opt, subsets[0], generator(0, "b", 0), plain_cfg), TrainData(data, y, xv, yv))
    assert plain.curve != alone[0].curve


def test_fit_and_group_with_a_batch_transform_need_a_shared_validation_set() -> None:
    """Validating on the member's own `val_idx` would score raw (untransformed) training rows: both refuse."""
    data, y, _, _ = _data(n=200)
    cfg = fit_settings(batch_size=32, patience=100, max_epochs=1, progress=False,
                       batch_transform=_leace_transform(data, y))
    (model, opt), = _models("mlp", [0])
    member = Member(model, opt, torch.arange(80, 200), generator(0, "b", 0), cfg, val_idx=torch.arange(80))
    with pytest.raises(ValueError, match="need a shared x_val"):
        fit_group([member], TrainData(data, y), group_options(engine="loop"))
    with pytest.raises(ValueError, match="need a shared x_val"):
        fit(member, TrainData(data, y))


def _singular() -> tuple[Tensor, Tensor]:
    g = torch.Generator().manual_seed(0)
    x, y = torch.rand(90, 12, generator=g, dtype=torch.float64), torch.arange(90) % 3
    x[y == 0, :6] = 0.5  # half the pixels constant within class 0
    return x, y


def test_fitted_eraser_is_cached_and_a_corrupt_entry_refitted(tmp_path: Path, caplog: pytest.LogCaptureFixture
                                                              ) -> None:
    g = torch.Generator().manual_seed(0)
    data = LoadedData("toy", torch.rand(60, 1, 4, 4, generator=g), torch.arange(60) % 3, 3)
    def fit_cached(rows: LoadedData) -> tuple[erasure.Eraser, bool]:
        return fitted_eraser(Store(tmp_path), Rows(rows), EraserSpec("leace", {}))

    first, hit1 = fit_cached(data)
    second, hit2 = fit_cached(data)
    assert (hit1, hit2) == (False, True)
    assert all(torch.equal(first.state[k], second.state[k]) for k in first.state)
    other, hit3 = fit_cached(LoadedData("toy", data.x, data.y.roll(1), 3))
    assert hit3 is False  # another content, another entry
    (entry,) = [p for p in (tmp_path / "erasers").glob("*.pt") if p.stat().st_mtime_ns == min(
        q.stat().st_mtime_ns for q in (tmp_path / "erasers").glob("*.pt"))]
    entry.write_bytes(b"not a torch file")
    with caplog.at_level(logging.WARNING):
        again, hit4 = fit_cached(data)
    assert hit4 is False and "corrupt" in caplog.text
    assert all(torch.equal(first.state[k], again.state[k]) for k in first.state)
    assert fit_cached(data)[1] is True


def _digits(limit: int | None = None) -> tuple[Tensor, Tensor]:
    d = load_dataset(group_config("dataset", "digits", **({} if limit is None else {"limit": limit})))
    return d.x.reshape(len(d.x), -1), d.y


@pytest.mark.parametrize(("make", "noise"), [
    (_singular, True),
    (lambda: (torch.randn(900, 12, dtype=torch.float64), torch.arange(900) % 3), False),  # Gaussian classes
    (_digits, True),  # 1797 rows: every class singular in the 61-dim support
    (lambda: _digits(300), False),  # 30 rows a class: r = 29 directions, every class spans them
], ids=["constant-pixels", "gaussian", "digits", "digits-300"])
def test_coupling_noise_is_predicted_without_fitting(make: Any, noise: bool) -> None:
    """The precheck's prediction (erasure/qleace.py `coupling_noise_ranks`) and the fit agree on whether the
    coupling adds noise; on the exactly singular class they agree on its rank. That noise has exact moments on a whole
    class, not on a batch: a batch eraser refuses it in one line."""
    x, y = make()
    ranks = coupling_noise_ranks(x, y)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fitted = erasure.fit("qleace", x, y)
    assert isinstance(fitted, QleaceEraser)
    assert fitted.has_noise == noise and (max(ranks) > 0) == noise, (ranks, fitted.info["noise_rank"])
    if make is _singular:
        assert ranks == fitted.info["noise_rank"] == [6, 0, 0]
        with pytest.raises(UserError) as err:
            BatchEraser(fitted)
        assert str(err.value).startswith("eraser.after_augment=true is not allowed with qleace's "
                                         "rank_deficient=coupling here: classes [0] of the fitted eraser are singular")
        assert "eraser=qleace_paper" in str(err.value) and "\n" not in str(err.value)
        BatchEraser(erasure.fit("qleace", x, y, rank_deficient="shrinkage"))  # the paper code's estimator: fine


DIGITS_AFTER = ["experiment=smoke", "dataset=digits", "eraser=qleace", "eraser.after_augment=true",
                "dataset.augment=true", "mdl.full_run=false"]


def test_after_augment_with_coupling_noise_is_refused_before_any_fit(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    def no_fit(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("the eraser was fitted")

    monkeypatch.setattr(erasure.api, "fit", no_fit)
    monkeypatch.setattr(erasure, "fit", no_fit)
    with pytest.raises(ConfigError) as err:
        run_job(job_config(tmp_path, DIGITS_AFTER))
    assert str(err.value).startswith("eraser.after_augment=true is not allowed with qleace's rank_deficient=coupling "
                                     "here: classes [0, 1, 2, 3, 4, 5, 6, 7, 8, 9] of digits are singular")
    assert not (tmp_path / "runs").exists()


def test_after_augment_refusal_from_the_command_line_is_one_line(tmp_path: Path) -> None:
    proc = _cli(tmp_path, *DIGITS_AFTER)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr[-3000:]
    assert lines[0].startswith("error: eraser.after_augment=true is not allowed with qleace's") and \
        lines[0].endswith("or eraser.after_augment=false")
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("extra", [["eraser=qleace_paper"], ["eraser.options.rank_deficient=truncate"],
                                   ["eraser.after_augment=false"], ["dataset.limit=300"]])
def test_after_augment_alternatives_pass_the_precheck(tmp_path: Path, extra: list[str]) -> None:
    assert precheck(load_job(job_config(tmp_path, [*DIGITS_AFTER, *extra])), torch.device("cpu")) is not None
