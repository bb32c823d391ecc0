"""Data flows one way. The layers and the rules between packages are import-linter contracts in pyproject.toml
([tool.importlinter], checked by `make lint` with lint-imports; they count imports inside functions too); this file
holds what a contract cannot say, and checks that the contracts catch each edge they forbid.

The layers, bottom up:
    atomicio/             atomic file writes, shared by erasure/ and training/common/: the standard library only
    erasure/              the eraser library: torch, numpy, atomicio, the standard library and itself, nothing else
    models/               architectures; of erasure/ only the Registry class
    training/common/, training/errors.py   the harness's utilities (atomic files, locks, progress) and its errors
    training/engine/, training/data/
    training/app/         the core: typed configs and the job hash, results, the task declarations (TaskSpec), sweeps
    training/analysis/    what the tasks' tables share (eraser order, markdown tables, mean ± sd, comparison groups)
    training/inputs/      a job's inputs (load, permute, fit plan, erase through the cache, z-score) and fit settings
    training/tasks/       one package per task (mdl/; gs/ with its three tasks), independent of each other:
                          its declaration (the package's __init__), code, typed result and tables. What discovery
                          imports (the declarations and their result types) imports at its top level only the
                          standard library, training.app and more of the same: the task's code, in the methods
    training/cli/, scripts/   the command line (Hydra entry, one-line errors, SIGTERM, the multirun ledger; imported
                          only by the shim training/run.py) and the scripts
    tools/                operations (benchmarks, the GPU report, the SLURM and test-tier helpers): not installed,
                          may import any layer; no layer imports it

The one dynamic import: training/app/task_spec.py discovers the packages of `training.tasks` (a new task is a package
that nothing else names). So the core reads a task's declaration without its code, its top level imports nothing else.
"""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("atomicio", "erasure", "models", "training", "scripts", "tools", "hydra_plugins")
DISCOVERS = "training.app.task_spec"  # the one module that imports modules by name: those of training.tasks
HYDRA_PRIVATE = "training.common.hydra_private"  # the one module that imports Hydra's private modules
# what a task's declaration imports when discovered (besides the stdlib): the core and more of its declaration (its
# result type's module, the gs tasks' shared base), which imports the same only (`_discovered`)
TASK_TOP_LEVEL = ("training.app", "training.tasks")


def _modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    out = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _calls(path: Path) -> set[str]:
    """Names of dynamic-import calls (`__import__`, `import_module`) in the module."""
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else ""
            if name in ("__import__", "import_module", "iter_modules", "walk_packages"):
                names.add(name)
    return names


def _private_hydra(path: Path) -> set[str]:
    """Private modules of Hydra or of its launcher plugins (a part that starts with `_`) that the module imports."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        found = [a.name for a in node.names] if isinstance(node, ast.Import) else \
            [node.module] if isinstance(node, ast.ImportFrom) and node.module else []
        names.update(n for n in found if n.split(".")[0] in ("hydra", "hydra_plugins")
                     and any(part.startswith("_") for part in n.split(".")[1:]))
    return names


def _top_level_imports(path: Path) -> set[str]:
    """What a module imports when it is imported: its module-level import statements (not those in functions or
    under `if TYPE_CHECKING:`)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
            if node.module.startswith("training."):  # `from training.tasks.mdl import job`: the module job too
                found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _discovered(modules: dict[str, Path]) -> set[str]:
    """The modules discovery imports: each package (or module) directly in training.tasks, and what they import at
    their top level inside training.tasks, and so on."""
    todo = [m for m in modules if m.startswith("training.tasks.") and m.count(".") == 2]
    seen: set[str] = set()
    while todo:
        module = todo.pop()
        if module in seen or module not in modules:
            continue
        seen.add(module)
        todo += [name for name in _top_level_imports(modules[module]) if _matches(name, "training.tasks")]
    return seen


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _violations(modules: dict[str, Path]) -> list[str]:
    """What the contracts cannot say: a task module's top level, dynamic-import calls, Hydra's private modules."""
    bad = []
    discovered = _discovered(modules)
    for module, path in modules.items():
        if module in discovered:
            bad += [f"{module} imports {name} when discovered (a task's declaration and its result type import at "
                    f"their top level only the standard library, {' and '.join(TASK_TOP_LEVEL)}; import the task's "
                    "code in its methods)"
                    for name in sorted(_top_level_imports(path)) if name.split(".")[0] not in sys.stdlib_module_names
                    and name != "__future__" and not any(_matches(name, a) for a in TASK_TOP_LEVEL)]
        if module != HYDRA_PRIVATE:
            bad += [f"{module} imports {name} (Hydra's private API is used in {HYDRA_PRIVATE} only)"
                    for name in sorted(_private_hydra(path))]
        if _matches(module, "scripts") or _matches(module, "tools") or module == DISCOVERS:
            continue  # the command lines and tools may probe what is installed (tools/gpu_report.py)
        bad += [f"{module} calls {call}() (a hidden edge: import modules by name, in a list)"
                for call in sorted(_calls(path))]
    return bad


def test_what_the_contracts_cannot_say_holds() -> None:
    bad = _violations(_modules())
    assert not bad, bad


def test_the_check_catches_each_rule(tmp_path: Path) -> None:
    cases = {
        "erasure.registry": "x = __import__('erasure.leace')\n",
        "training.tasks.toy": "import torch\nfrom training.app.tasks import Task\n",
        "training.app.schema": "from importlib import import_module\nimport_module('training.tasks.mdl')\n",
        # a declaration that imports its task's code at its top level: discovery would load torch
        "training.tasks.toy_pkg": "from training.tasks.toy_pkg import job\n",
        "training.tasks.toy_pkg.job": "import torch\n",
        "training.cli.toy": "def f():\n    import hydra._internal.core_plugins.basic_launcher as b\n",
        "tools.toy": "from hydra_plugins.hydra_joblib_launcher._core import run_job\n",
    }
    fine = {  # a task's code, which discovery does not import, may import anything below it
        "training.tasks.toy_pkg.trainer": "import torch\nfrom training.engine.fit import fit\n",
        "training.tasks.other": "from training.app.tasks import Task\nfrom training.tasks.other import result\n",
        "training.tasks.other.result": "import dataclasses\nfrom training.app.result_types import Result\n",
        HYDRA_PRIVATE: "from hydra._internal.config_loader_impl import ConfigLoaderImpl\n",
        "training.cli.hydra": "from hydra.core.utils import JobReturn\nimport hydra_plugins.erasure_mdl_slurm\n",
    }
    modules = {}
    for name, text in {**cases, **fine}.items():
        path = tmp_path / (name.replace(".", "_") + ".py")
        path.write_text(text)
        modules[name] = path
    bad = _violations(modules)
    for name in cases:
        if name != "training.tasks.toy_pkg":
            assert any(line.startswith(f"{name} ") for line in bad), (name, bad)
    assert not [line for line in bad if line.startswith(("training.tasks.toy_pkg ", *(f"{m} " for m in fine)))], bad


# An edge each contract forbids (module to add -> its code), and what the report then names.
BROKEN = {
    "hydra_plugins/erasure_mdl_slurm/_bad.py": ("import training.cli.preemption\n",
                                                ["hydra_plugins.erasure_mdl_slurm._bad -> training.cli.preemption"]),
    "erasure/_bad.py": ("import filelock\nfrom training.data import cache\n", ["erasure._bad -> filelock",
                                                                                  "erasure._bad -> training.data"]),
    "atomicio/_bad.py": ("import torch\n", ["atomicio._bad -> torch"]),
    "models/_bad.py": ("from erasure.api import fit\n", ["models._bad -> erasure.api"]),
    "training/common/_bad.py": ("from training.app.schema import config_hash\n",
                                ["training.common._bad -> training.app.schema"]),
    "training/app/_bad.py": ("from training.tasks.mdl.job import run_job\n",
                             ["training.app._bad -> training.tasks.mdl.job"]),
    "training/data/_bad.py": ("from training.run import main\n", ["training.data._bad -> training.run"]),
    "training/analysis/_bad.py": ("from training.tasks.mdl.result import MdlResult\n",
                                  ["training.analysis._bad -> training.tasks.mdl.result"]),
    "training/inputs/_bad.py": ("from training.tasks.mdl import job\n", ["training.inputs._bad -> training.tasks.mdl"]),
    "training/cli/_bad.py": ("from training.tasks.mdl import job\n", ["training.cli._bad -> training.tasks.mdl"]),
    "training/tasks/_bad.py": ("from scripts import aggregate\n", ["training.tasks._bad -> scripts.aggregate"]),
    "scripts/_bad.py": ("from training.cli.run import main\nfrom tools import bench_sweep\n",
                        ["scripts._bad -> training.cli.run", "scripts._bad -> tools.bench_sweep"]),
    "training/engine/_bad.py": ("import importlib\n", ["training.engine._bad -> importlib"]),
    "training/tasks/mdl/_bad.py": ("from training.common.sweeps import expand\nfrom training.tasks.gs import common\n",
                                   ["training.tasks.mdl._bad -> training.common.sweeps",
                                    "training.tasks.mdl._bad -> training.tasks.gs.common"]),
    "training/app/_loop_a.py": ("from training.app import _loop_b\n", ["- ._loop_"]),  # the edge it would cut
    "training/app/_loop_b.py": ("from training.app import _loop_a\n", []),
}


def _lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    code = "import sys; from importlinter.cli import lint_imports_command; sys.argv = ['lint-imports']; " \
           "lint_imports_command()"
    path = os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])
    return subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": path, "NO_COLOR": "1", "COLUMNS": "200"})


def test_the_contracts_hold_and_catch_each_forbidden_edge(tmp_path: Path) -> None:
    """lint-imports passes on the tree, and fails on a copy of it with one forbidden edge per contract, naming each."""
    pytest.importorskip("importlinter", reason="import-linter is in the dev extra: make setup installs it")
    ok = _lint_imports(ROOT)
    assert ok.returncode == 0, ok.stdout[-3000:] + ok.stderr[-3000:]
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path)
    for path, (code, _) in BROKEN.items():
        (tmp_path / path).write_text(code)
    broken = _lint_imports(tmp_path)
    assert broken.returncode != 0
    for _, named in BROKEN.values():
        for edge in named:
            assert edge in broken.stdout, (edge, broken.stdout[-5000:])
    assert "KEPT" not in broken.stdout, broken.stdout  # each contract caught its edge


def test_erasure_alone_imports_no_harness() -> None:
    """Using the eraser library loads nothing of ours but itself, and no filelock or Hydra (torch loads tqdm)."""
    code = ("import sys, erasure; erasure.fit('leace', __import__('torch').randn(20, 3), "
            "__import__('torch').arange(20) % 2)\n"
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('training', 'models', 'scripts', 'filelock', 'hydra', 'omegaconf')))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout


def test_a_plain_start_imports_no_numba_and_the_core_no_task_code() -> None:
    """Checking and hashing a config, and importing the command line, load numba only when the fused optimizer
    runs (it cost 1.9 s on every start); the core alone loads no task code and no command line (the tasks'
    declarations and result types, which discovery imports, are no code: `_discovered`)."""
    declarations = sorted(_discovered(_modules(("training",))))
    assert {"training.tasks.mdl", "training.tasks.gs", "training.tasks.gs.gs_two_moons", "training.tasks.mdl.result",
            "training.tasks.gs.result"} <= set(declarations), declarations
    assert "training.tasks.mdl.job" not in declarations
    code = f"declarations = {declarations!r}\n" + """
import sys
from tests.helpers import job_config
from training.app.tasks import job_cell_hash, job_hash, load_job
for overrides in (["experiment=smoke"], ["experiment=gs_two_moons"], ["experiment=demo", "regularizer=sd"]):
    cfg = job_config("/tmp/unused", overrides)
    load_job(cfg), job_hash(cfg), job_cell_hash(cfg)
core = sorted(m for m in sys.modules if m.startswith(("training.tasks.", "training.cli")) and m not in declarations)
import training.cli.run
print(core, "numba" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[] False", out.stdout
