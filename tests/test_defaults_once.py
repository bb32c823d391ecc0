"""Every default lives once: in training/app/schema.py or the group yaml. The engine's settings (what a fit, a
vectorised group and the optimiser take) have no defaults of their own, and the job builds them from its typed
config, every field from the config."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import pkgutil
from pathlib import Path

import pytest

import training.engine
from models import make_optimizer
from tests.helpers import job_config
from training.app.tasks import load_job

# Fields of the engine's settings that are runtime objects, not settings: None means "none", never a default value.
RUNTIME = {"batch_transform", "on_finish", "regularizer", "checkpoint", "numerics"}  # objects the job hands in
SETTINGS = ("Config", "Options", "Settings")


def _engine_settings() -> list[type]:
    found = []
    for info in pkgutil.iter_modules(training.engine.__path__):
        module = importlib.import_module(f"training.engine.{info.name}")
        found += [obj for name, obj in vars(module).items() if dataclasses.is_dataclass(obj) and isinstance(obj, type)
                  and obj.__module__ == module.__name__ and name.endswith(SETTINGS)]
    return found


def test_the_engine_settings_stop_rule_and_make_optimizer_declare_no_defaults() -> None:
    classes = _engine_settings()
    assert {c.__name__ for c in classes} >= {"FitConfig", "GroupOptions", "OptimSettings"}
    for cls in classes:
        for f in dataclasses.fields(cls):
            has_default = f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING
            if f.name in RUNTIME:
                assert f.default is None, f"{cls.__name__}.{f.name}"
            else:
                assert not has_default, f"{cls.__name__}.{f.name} has a default of its own ({f.default!r}): it lives " \
                    "in training/app/schema.py"
    # EarlyStopping holds a model's stop rule (settings, from FitConfig) and its state (which starts empty)
    from training.engine.stopping import EarlyStopping

    state = {"best_loss", "best_epoch", "improved", "improved_step"}
    for f in dataclasses.fields(EarlyStopping):
        assert (f.default is dataclasses.MISSING) == (f.name not in state), f.name
    params = list(inspect.signature(make_optimizer).parameters.values())[1:]
    assert {p.name for p in params} == {"lr", "beta1", "beta2", "weight_decay", "warmup_steps"}
    assert all(p.default is inspect.Parameter.empty for p in params), params


OFF_DEFAULT = ["experiment=smoke", "optim.batch_size=40", "mdl.patience=7", "mdl.max_epochs=11", "dataset.augment=true",
               "mdl.eval_every_steps=13", "progress=true", "optim.warmup_steps=17", "mdl.min_steps=19",
               "mdl.patience_min_steps=23", "optim.lr=0.0031", "optim.beta1=0.83", "optim.beta2=0.97",
               "optim.weight_decay=0.05", "arch.depth=4", "mdl.full_run=true", "mdl.stopping=backtrack",
               "mdl.batch_order=fixed"]


def test_the_job_builds_the_engine_settings_from_its_typed_config(tmp_path: Path) -> None:
    """Every field comes from the config (each value here is off its default, so a field the job leaves to a default
    would differ), the fit's from `mdl`, `optim`, `dataset` and `progress`."""
    from training.inputs.fit_settings import fit_config, resolve_optim

    cfg = load_job(job_config(tmp_path, OFF_DEFAULT))
    optim = resolve_optim(cfg.optim, cfg.arch)
    o, m = cfg.optim, cfg.mdl
    assert optim.depth_lr_multiplier != 1.0 and optim.lr == pytest.approx(o.lr * optim.depth_lr_multiplier)
    assert (optim.lr_base, optim.beta1, optim.beta2, optim.weight_decay, optim.warmup_steps, optim.batch_size) == (
        o.lr, o.beta1, o.beta2, o.weight_decay, o.warmup_steps, o.batch_size)
    fit = fit_config(cfg, optim.warmup_steps, m.eval_every_steps)
    assert dataclasses.asdict(fit) == {
        "batch_size": 40, "patience": 7, "max_epochs": 11, "augment": True, "eval_every_steps": 13, "progress": True,
        "warmup_steps": 17, "min_steps": 19, "patience_min_steps": 23, "batch_transform": None,
        "lr_schedule": "constant", "stopping": "backtrack", "batch_order": "fixed",
        "numerics": None}  # numerics: the job's JobNumerics, handed in by the lifecycle (JobRun.numerics), not config
    from models import build_model

    model = build_model(cfg.arch, (1, 8, 8), 10)
    groups = optim.build(model).param_groups  # μP scales the matrix-like groups' weight decay by 1/width_mult
    assert {(g["betas"], g["warmup_steps"]) for g in groups} == {((0.83, 0.97), 17)}
    assert max(g["weight_decay"] for g in groups) == 0.05
