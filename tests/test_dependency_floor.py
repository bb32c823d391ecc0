"""The declared floors hold: every registered architecture builds and trains a step on the lowest timm that
pyproject.toml accepts (installed into a throwaway target), and it is the same model as on the installed timm.

timm is the one dependency with a floor (`>=`) that a model or an eraser depends on: mup is pinned exactly (the
installed version is its floor) and the erasers need only torch and numpy. The GPU image's timm 1.0.29 failed
here (per-stage windows, the unpadded attention mask, odd grids), which is why the floor is 1.0.31.
Run as a script (by the test, under the floor timm) it prints one JSON line per architecture and input.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FLOORED = ("timm",)  # packages with a `>=` floor that a model or an eraser imports
EXACT = ("mup",)  # pinned with `==`: the installed version is the floor
INPUTS = [(1, 28, 28), (3, 32, 32), (1, 8, 8)]  # odd grids (28: 14 → 7 → 4), padded windows (32), tiny grids (8)


def declared(name: str) -> tuple[str, str]:
    """(operator, version) of `name` in pyproject.toml's dependencies."""
    text = (ROOT / "pyproject.toml").read_text()
    m = re.search(rf'^\s*"{re.escape(name)}\s*(==|>=)\s*([0-9][0-9.]*)[",]', text, re.M)
    assert m is not None, f"pyproject.toml declares no floor for {name}"
    return m.group(1), m.group(2)


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=600)


def build_all() -> list[dict[str, object]]:
    """Every registered architecture at its default config, per input shape: parameter count and the logits of a
    fixed input after one optimiser step (seeded), so two timm versions can be compared."""
    import torch
    import torch.nn.functional as F

    import training  # noqa: F401  (OmegaConf resolvers)
    from models import build_model, param_count
    from models.registry import ARCHS
    from tests.helpers import optimizer
    from training.app.schema import group_config

    out: list[dict[str, object]] = []
    for entry in ARCHS:
        for shape in INPUTS:
            torch.manual_seed(0)
            model = build_model(group_config("arch", entry.name), shape, 10)
            x, y = torch.rand(4, *shape), torch.arange(4) % 10
            opt = optimizer(model, lr=1e-3, beta1=0.9)
            model.train()
            opt.train()
            F.cross_entropy(model(x), y).backward()
            opt.step()
            model.eval()
            with torch.no_grad():
                logits = model(x)
            assert torch.isfinite(logits).all(), (entry.name, shape)
            out.append({"arch": entry.name, "shape": list(shape), "params": param_count(model),
                        "logits": logits.flatten().tolist()})
    return out


def test_declared_floors_are_exact_or_floored() -> None:
    for names, operator in ((FLOORED, ">="), (EXACT, "==")):
        assert [declared(name)[0] for name in names] == [operator] * len(names), names


def test_every_arch_builds_on_the_declared_timm_floor(tmp_path: Path) -> None:
    target = tmp_path / "floor"
    pins = [f"{name}=={declared(name)[1]}" for name in FLOORED]
    proc = _pip("install", "-q", "--no-deps", "--disable-pip-version-check", "--target", str(target), *pins)
    if proc.returncode:
        # the floor itself not installable fails; only a registry pip cannot reach at all skips
        if _pip("download", "-q", "--no-deps", "--disable-pip-version-check", "-d", str(tmp_path / "any"),
                "timm").returncode:
            pytest.skip(f"pip cannot reach the package registry: {proc.stderr.strip().splitlines()[-1:]}")
        pytest.fail(f"cannot install the declared floor {pins}: {proc.stderr.strip()[-400:]}")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(target), str(ROOT)]), "OMP_NUM_THREADS": "1"}
    code = ("import json, timm; from tests.test_dependency_floor import build_all; "
            "print(json.dumps({'timm': timm.__version__, 'models': build_all()}))")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT,
                         timeout=900)
    assert run.returncode == 0, run.stderr[-2000:]
    floor = json.loads(run.stdout.strip().splitlines()[-1])
    assert floor["timm"] == declared("timm")[1]  # the throwaway target's timm, not the installed one
    here = build_all()
    assert {m["arch"] for m in here} >= {"mlp", "lenet", "convnext", "swin"}
    for a, b in zip(floor["models"], here, strict=True):
        assert (a["arch"], a["shape"], a["params"]) == (b["arch"], b["shape"], b["params"])
        assert a["logits"] == pytest.approx(b["logits"], rel=1e-4, abs=1e-5), (a["arch"], a["shape"])
