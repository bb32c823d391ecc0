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
    training/mdl/, training/starvation/   the tasks' code
    training/tasks/       the task declarations (one module per task), which bind a task's implementation
                          (training/mdl, training/starvation) and its tables in their methods; at their top level
                          they import only the standard library, training.app and training.tasks
    training/cli/, scripts/   the command line (Hydra entry, one-line errors, SIGTERM, the multirun ledger; imported
                          only by the shim training/run.py) and the scripts

The one dynamic import: training/app/task_spec.py discovers the modules of `training.tasks` (a new task is a module
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
PACKAGES = ("atomicio", "erasure", "models", "training", "scripts")
DISCOVERS = "training.app.task_spec"  # the one module that imports modules by name: those of training.tasks
# what a task module imports when discovered (besides the stdlib): the core, its fellow declarations, and its result
# type's module in the task's package (which itself imports only the stdlib and training.app: RESULT_MODULES)
RESULT_MODULES = ("training.mdl.result", "training.starvation.result")
TASK_TOP_LEVEL = ("training.app", "training.tasks", *RESULT_MODULES)


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


def _top_level_imports(path: Path) -> set[str]:
    """What a module imports when it is imported: its module-level import statements (not those in functions or
    under `if TYPE_CHECKING:`)."""
    found: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return found


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _violations(modules: dict[str, Path]) -> list[str]:
    """What the contracts cannot say: a task module's top level, and dynamic-import calls."""
    bad = []
    for module, path in modules.items():
        if _matches(module, "training.tasks"):
            bad += [f"{module} imports {name} when discovered (a task module's top level imports only the standard "
                    f"library and {', '.join(TASK_TOP_LEVEL)}; import the task's code in its methods)"
                    for name in sorted(_top_level_imports(path)) if name.split(".")[0] not in sys.stdlib_module_names
                    and name != "__future__" and not any(_matches(name, a) for a in TASK_TOP_LEVEL)]
        if module in RESULT_MODULES:
            bad += [f"{module} imports {name} (a result module, imported when tasks are discovered, imports only the "
                    "standard library and training.app)" for name in sorted(_top_level_imports(path))
                    if name.split(".")[0] not in sys.stdlib_module_names and name != "__future__"
                    and not _matches(name, "training.app")]
        if _matches(module, "scripts") or module == DISCOVERS:
            continue  # scripts may probe what is installed (scripts/gpu_report.py); the registries live below
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
        "training.app.schema": "from importlib import import_module\nimport_module('training.mdl')\n",
    }
    modules = {}
    for name, text in cases.items():
        path = tmp_path / (name.replace(".", "_") + ".py")
        path.write_text(text)
        modules[name] = path
    bad = _violations(modules)
    for name in cases:
        assert any(line.startswith(f"{name} ") for line in bad), (name, bad)


# An edge each contract forbids (module to add -> its code), and what the report then names.
BROKEN = {
    "erasure/_bad.py": ("import filelock\nfrom training.data import cache\n", ["erasure._bad -> filelock",
                                                                                  "erasure._bad -> training.data"]),
    "atomicio/_bad.py": ("import torch\n", ["atomicio._bad -> torch"]),
    "models/_bad.py": ("from erasure.api import fit\n", ["models._bad -> erasure.api"]),
    "training/common/_bad.py": ("from training.app.schema import config_hash\n",
                                ["training.common._bad -> training.app.schema"]),
    "training/app/_bad.py": ("from training.mdl.job import run_job\n", ["training.app._bad -> training.mdl.job"]),
    "training/data/_bad.py": ("from training.run import main\n", ["training.data._bad -> training.run"]),
    "training/starvation/_bad.py": ("from training.tasks.gs_two_moons import TwoMoonsOptions\n",
                                    ["training.starvation._bad -> training.tasks.gs_two_moons"]),
    "training/tasks/_bad.py": ("from scripts import aggregate\n", ["training.tasks._bad -> scripts.aggregate"]),
    "scripts/_bad.py": ("from training.cli.run import main\nfrom training.tasks import mdl\n",
                        ["scripts._bad -> training.cli.run", "scripts._bad -> training.tasks.mdl"]),
    "training/engine/_bad.py": ("import importlib\n", ["training.engine._bad -> importlib"]),
    "training/mdl/_bad.py": ("from training.common.sweeps import expand\n",
                             ["training.mdl._bad -> training.common.sweeps"]),
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
    runs (it cost 1.9 s on every start); the core alone loads no task code and no command line (the task packages'
    result modules, which the declarations name, are no code: RESULT_MODULES)."""
    code = """
import sys
from tests.helpers import job_config
from training.app.tasks import job_cell_hash, job_hash, load_job
for overrides in (["experiment=smoke"], ["experiment=gs_two_moons"], ["experiment=demo", "regularizer=sd"]):
    cfg = job_config("/tmp/unused", overrides)
    load_job(cfg), job_hash(cfg), job_cell_hash(cfg)
results = ("training.mdl", "training.starvation", "training.mdl.result", "training.starvation.result")
core = sorted(m for m in sys.modules if m.startswith(("training.mdl", "training.starvation", "training.cli"))
              and m not in results)  # the tasks' result types (declarations, discovered with them) are no task code
import training.cli.run
print(core, "numba" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[] False", out.stdout
