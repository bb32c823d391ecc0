"""Adding an eraser or an architecture is one module + one yaml: a toy entry of each runs a real MDL job. Adding a task
is one package of `training.tasks` + one preset: a toy task, written to a temporary directory, runs from the
command line and its rows reach the aggregate's tables, with no file of the project edited."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, cast

import pytest
import torch
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
from torch import nn

from erasure.base import Eraser
from erasure.registry import ERASERS, Registry, UnknownNameError
from models.registry import ARCHS
from tests.helpers import TOY_TASK, TOY_TASK_INIT, TOY_TASK_PRESET, TOY_TASK_RESULT, result_of
from training.app.tasks import TASKS, Task, get_task, task_names
from training.tasks.mdl.job import run_job

CONF = Path(__file__).resolve().parents[1] / "conf"


# --- the "module" of a toy eraser: shift every class mean onto the global mean (a crude linear eraser) -----------
class MeanShiftEraser(Eraser):
    name = "toy_mean_shift"
    needs_labels = True

    def _apply(self, x64: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        assert y is not None
        return x64 - self.state["class_means"][y] + self.state["mean"]


def fit_toy_mean_shift(x: Any, y: Any, *, strength: float = 1.0) -> MeanShiftEraser:
    from erasure.base import base_info, prepare_fit

    x64, labels, flat, k = prepare_fit(x, y)
    means = torch.stack([x64[labels == c].mean(0) for c in range(k)]) * strength
    info = base_info("toy_mean_shift", flat, k, torch.bincount(labels, minlength=k).cpu(), {"strength": strength})
    return MeanShiftEraser({"class_means": means, "mean": x64.mean(0) * strength}, info)


# --- the "module" of a toy architecture: a one-hidden-layer μP MLP ----------------------------------------------
@dataclass(frozen=True, kw_only=True)
class ToyOptions:
    """The toy's own option: one field, validated from its annotation, read as `arch.options.activation`."""

    activation: Literal["relu", "tanh"] = "relu"


@dataclass(frozen=True)
class ToySpec:
    in_features: int
    width: int
    num_classes: int
    activation: str = "relu"

    @staticmethod
    def stage_depths(arch: Any, depth: int | None = None) -> tuple[int, ...]:
        return (1,)

    @classmethod
    def from_arch(cls, arch: Any, input_shape: tuple[int, int, int], num_classes: int) -> ToySpec:
        c, h, w = input_shape
        return cls(c * h * w, arch.width, num_classes, arch.options.activation)

    def build(self) -> nn.Module:
        from mup import MuReadout

        act = nn.ReLU() if self.activation == "relu" else nn.Tanh()
        return nn.Sequential(nn.Flatten(), nn.Linear(self.in_features, self.width), act,
                             MuReadout(self.width, self.num_classes, readout_zero_init=True))

    def info(self) -> dict[str, Any]:
        return {"in_features": self.in_features, "activation": self.activation}


@pytest.fixture
def toy_entries(tmp_path: Path) -> Iterator[Path]:
    from models.mup_utils import kaiming_uniform_init

    ERASERS.add("toy_mean_shift", fit_toy_mean_shift, family="linear", kind="map")
    ARCHS.add("toy_mlp", ToySpec, vectorises=True, base_width=16, depth_exponent=1.0, init=kaiming_uniform_init,
              options=ToyOptions)
    extra = tmp_path / "conf_extra"
    (extra / "eraser").mkdir(parents=True)
    (extra / "arch").mkdir()
    (extra / "eraser" / "toy_mean_shift.yaml").write_text("name: toy_mean_shift\noptions:\n  strength: 1.0\n")
    (extra / "arch" / "toy_mlp.yaml").write_text(
        "name: toy_mlp\ntag: toy\nwidth: 16\ndepth: 1\nbase_width: 16\nbase_depth: 1\n"
        "paper_optim:\n  lr: {control: 1.0e-3, linear: 2.0e-3, quadratic: 3.0e-3}\n  beta1: 0.9\n"
        "  warmup_steps: 0\n")
    yield extra
    for reg, name in ((ERASERS, "toy_mean_shift"), (ARCHS, "toy_mlp")):
        reg._entries.pop(name, None)


def test_a_toy_eraser_and_architecture_run_from_one_module_and_one_yaml_each(toy_entries: Path, tmp_path: Path) -> None:
    """And an architecture's option is one dataclass field."""
    from training.app.schema import ConfigError
    from training.app.tasks import load_job

    def composed(*extra: str) -> dict[str, Any]:
        with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
            cfg = compose("config", overrides=[f"hydra.searchpath=[file://{toy_entries}]", "experiment=smoke",
                                               "arch=toy_mlp", f"paths.out_dir={tmp_path}", *extra])
        return cast(dict[str, Any], OmegaConf.to_container(cfg, resolve=True))  # a composed config's keys: strings

    job = composed("eraser=toy_mean_shift", "certificate=true", "mdl.max_epochs=3")
    assert job["optim"]["lr"] == 2.0e-3  # the paper-optim table of the new arch, at the new eraser's family
    result = result_of(run_job(job))
    assert result["model"]["arch"] == "toy_mlp" and result["eraser"]["name"] == "toy_mean_shift"
    assert result["certificate"]["after"]["max_mean_gap"] < 1e-6 < result["certificate"]["before"]["max_mean_gap"]
    assert result["mdl"]["bits_per_sample"] > 0 and len(result["mdl"]["blocks"]) == job["mdl"]["num_blocks"] - 1
    assert (Path(job["paths"]["job_dir"]) / "result.json").exists()
    assert load_job(composed()).arch.options.activation == "relu"  # the dataclass default
    assert load_job(composed("+arch.activation=tanh")).arch.options == ToyOptions(activation="tanh")
    with pytest.raises(ConfigError, match="arch.activation='gelu' is not allowed: arch.activation must be one of "
                                          "relu, tanh"):
        load_job(composed("+arch.activation=gelu"))


def test_registry_metadata_replaces_name_branches() -> None:
    """Every registered eraser declares a kind and a family that every registered architecture's yaml prices (its
    `paper_optim.lr` per family: what `optim.lr` reads), so any eraser runs on any architecture."""
    families = {a: set(OmegaConf.load(CONF / "arch" / f"{a}.yaml").paper_optim.lr) for a in ARCHS.names()}
    for entry in ERASERS:
        assert entry.meta["kind"] in ("map", "edit"), entry.name
        unpriced = [a for a, priced in families.items() if entry.meta["family"] not in priced]
        assert not unpriced, f"eraser {entry.name}: family {entry.meta['family']!r} has no lr in arch {unpriced}"
    assert ERASERS.meta("gradient")["kind"] == "edit" and ERASERS.meta("leace")["kind"] == "map"
    assert ERASERS.meta("leace")["family"] == "linear" and ERASERS.meta("qleace")["family"] == "quadratic"
    assert ARCHS.meta("mlp")["vectorises"] and not ARCHS.meta("convnext")["vectorises"]
    assert ARCHS.meta("mlp")["depth_exponent"] == 1.5 and ARCHS.meta("swin")["depth_exponent"] == 0.5
    assert get_task("gs_two_moons").uses == ("dataset", "regularizer", "gs") and get_task("mdl").uses is None


def test_every_task_is_discovered_once_from_its_module() -> None:
    """What discovery registers is what the modules of every `training/tasks/` directory declare (TASK or TASKS),
    each task once, from the module that declares it."""
    import importlib

    import training.tasks

    names = task_names()  # discovery sets the package's path: its own directory and those on sys.path now
    declared: dict[str, str] = {}
    for home in training.tasks.__path__:
        for path in sorted(Path(home).iterdir()):
            stem = path.stem
            if stem.startswith("_") or not (path.suffix == ".py" or (path / "__init__.py").exists()):
                continue
            module = importlib.import_module(f"training.tasks.{stem}")
            for task in getattr(module, "TASKS", None) or (module.TASK,):
                assert task.name not in declared, f"task {task.name} declared twice"
                declared[task.name] = module.__name__
    assert "mdl" in declared and names == sorted(declared)
    for name, module_name in declared.items():
        task = get_task(name)
        assert isinstance(task, Task) and type(task).__module__.startswith(module_name), (name, module_name)


@pytest.mark.parametrize(("text", "error"), [
    ("from training.tasks.mdl import Mdl\nTASK = type('Again', (Mdl,), {})()\n", "registered twice"),
    ("NAME = 'no task'\n", "declares no task"),
])
def test_a_task_module_declares_one_new_task(text: str, error: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    (tmp_path / "training" / "tasks").mkdir(parents=True)
    (tmp_path / "training" / "tasks" / "broken.py").write_text(text)
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises((ValueError, TypeError), match=error):
            task_names()
    finally:
        sys.modules.pop("training.tasks.broken", None)
        monkeypatch.undo()
    assert "mdl" in task_names()


@pytest.fixture
def toy_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The toy task's package in <tmp>/training/tasks/toy_count/ (found with <tmp> on sys.path: `training.tasks`
    spans every such directory) and its preset in <tmp>/conf_extra (a Hydra search path); removed from the registry
    afterwards."""
    import sys

    package = tmp_path / "training" / "tasks" / TOY_TASK
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(TOY_TASK_INIT)
    (package / "result.py").write_text(TOY_TASK_RESULT)
    (tmp_path / "conf_extra" / "experiment").mkdir(parents=True)
    (tmp_path / "conf_extra" / "experiment" / f"{TOY_TASK}.yaml").write_text(TOY_TASK_PRESET)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    TASKS._entries.pop(TOY_TASK, None)
    TASKS._modules.discard(f"training.tasks.{TOY_TASK}")
    for module in (f"training.tasks.{TOY_TASK}", f"training.tasks.{TOY_TASK}.result"):
        sys.modules.pop(module, None)


def test_a_toy_task_runs_from_the_command_line_and_reaches_the_aggregate(toy_task: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    from scripts.aggregate import main as aggregate

    root = Path(__file__).resolve().parents[1]
    out = toy_task / "out"
    cmd = [sys.executable, "-m", "training.run", f"hydra.searchpath=[file://{toy_task / 'conf_extra'}]",
           "experiment=toy_count", "seed=3", f"paths.out_dir={out}", "logger=none", "progress=false"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(toy_task), str(root)]), "WANDB_MODE": "disabled"}
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=300, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    (path,) = out.rglob("result.json")
    result = json.loads(path.read_text())
    assert result["counts"] == [178, 182, 177, 183, 181, 182, 181, 179, 174, 180]  # sklearn's digits: 1797 images
    assert result["mean_pixel"] > 0 and result["config"]["toy"] == {"scale": 2.0}
    # the same job again: the lifecycle finds it finished (its hash covers the declared `uses`: dataset, toy)
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=root, timeout=300, env=env)
    assert again.returncode == 0 and json.loads(path.read_text()) == result
    assert "toy_count" in task_names()  # discovered in this process too (tmp_path is on sys.path)
    tables = toy_task / "tables"
    assert aggregate([str(out), "--out", str(tables), "--name", "toy"]) == 0
    table = (tables / "toy_toy_count.md").read_text()
    assert f"| digits | 3 | {result['mean_pixel']:.6f} | 1797 |" in table


def test_registry_errors() -> None:
    def small() -> None: ...
    def large() -> None: ...

    reg: Registry[Any] = Registry("widget", meta=("size",))
    reg.add("a", small, size=2)
    reg.add("a", small, size=2)  # the same object again (a module imported twice) is fine
    with pytest.raises(UnknownNameError, match=r"unknown widget 'b'; choose one of \['a'\]"):
        reg.get("b")
    with pytest.raises(TypeError, match="metadata"):
        reg.add("c", small)
    with pytest.raises(ValueError, match="registered twice"):
        reg.add("a", large, size=1)
