"""Data flows one way: no module imports code of a layer above it (checked on every import statement, lazy imports
included), and every edge is an import statement (no discovery by importlib / pkgutil).

The layers, bottom up:
    atomicio/             atomic file writes, shared by erasure/ and training/common/: the standard library only
    erasure/              the eraser library: torch, numpy, atomicio, the standard library and itself, nothing else
    models/               architectures; of erasure/ only the Registry class
    training/common/      the harness's utilities (atomic files, locks, progress): nothing of training/ above it
    training/engine/, training/data/
    training/app/         the core: typed configs and the job hash, results, the task declarations, sweeps
    training/mdl/, training/starvation/   the tasks
    training/cli/         the command line (Hydra entry, one-line errors, SIGTERM, the multirun ledger); imported
                          only by the shim training/run.py
    training/tasks/       the task declarations (one module per task), which bind a task's implementation
                          (training/mdl, training/starvation) and its tables (scripts/) in their methods; at their
                          top level they import only the standard library, training.app and training.tasks

The one dynamic import: training/app/tasks.py discovers the modules of `training.tasks` (a new task is a module
that nothing else names). So the core reads a task's declaration without its code, its top level imports nothing else.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("atomicio", "erasure", "models", "training", "scripts")
CLI = ("training.cli", "training.run")
TASK_CODE = ("training.mdl", "training.starvation")

# package prefix -> module prefixes it must not import
FORBIDDEN = {
    "atomicio": ("erasure", "models", "training", "scripts", "torch", "numpy"),
    "erasure": ("training", "models", "scripts"),
    "models": ("training", "scripts"),
    "training.common": ("training", "erasure", "models", "scripts"),  # except itself: see _forbidden
    "training.engine": ("training.app", *TASK_CODE, *CLI, "scripts"),
    "training.data": ("training.app", *TASK_CODE, *CLI, "scripts"),
    "training.app": (*TASK_CODE, *CLI, "scripts"),
    "training.mdl": (*CLI, "training.app.sweeps", "training.starvation", "scripts"),
    "training.starvation": (*CLI, "training.app.sweeps", "scripts"),
    "scripts": (*CLI, "training.tasks"),
    "training": ("training.tasks",),  # the task modules are discovered, never imported by name (but by each other)
    "training.tasks": CLI,
}
DISCOVERS = ("training.app.tasks",)  # the one module that imports modules by name: those of training.tasks
TASK_TOP_LEVEL = ("training.app", "training.tasks")  # what a task module imports when discovered (besides the stdlib)
# What a package may import of a forbidden prefix all the same.
EXCEPT = {
    "training.common": ("training.common",),
    "models": (),
}
# models/ may use the Registry class of erasure/, nothing else of it (not the erasers, not the library entry).
MODELS_FROM_ERASURE = ("erasure.registry",)
# erasure/ imports only these (besides the standard library and itself).
ERASURE_MAY_IMPORT = ("torch", "numpy", "atomicio")
DYNAMIC = ("importlib", "pkgutil")


def _modules(packages: tuple[str, ...] = PACKAGES) -> dict[str, Path]:
    out = {}
    for package in packages:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(path: Path, module: str) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against the module's package
                package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = package[: len(package) - node.level + 1]
                found.add(".".join([*base, node.module] if node.module else base))
                found.update(".".join([*base, *([node.module] if node.module else []), a.name]) for a in node.names)
            elif node.module:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


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
    bad = []
    for module, path in modules.items():
        imported = sorted(_imports(path, module))
        for owner, forbidden in FORBIDDEN.items():
            if not _matches(module, owner):
                continue
            allowed = EXCEPT.get(owner, ()) + (("training.tasks",) if _matches(module, "training.tasks") else ())
            bad += [f"{module} imports {name}" for name in imported
                    if any(_matches(name, f) for f in forbidden) and not any(_matches(name, a) for a in allowed)]
        if _matches(module, "models"):
            bad += [f"{module} imports {name} (models/ may use only {MODELS_FROM_ERASURE} of erasure/)"
                    for name in imported if _matches(name, "erasure")
                    and not any(_matches(name, a) or _matches(a, name) for a in MODELS_FROM_ERASURE)]
        if _matches(module, "erasure"):
            bad += [f"{module} imports {name} (erasure/ imports only torch, numpy, the standard library and itself)"
                    for name in imported if name.split(".")[0] not in (*ERASURE_MAY_IMPORT, "erasure")
                    and name.split(".")[0] not in sys.stdlib_module_names]
        if not _matches(module, "training.cli") and module != "training.run":
            bad += [f"{module} imports {name} (only the shim training/run.py imports the command-line layer)"
                    for name in imported if any(_matches(name, c) for c in CLI)]
        if _matches(module, "training.tasks"):
            bad += [f"{module} imports {name} when discovered (a task module's top level imports only the standard "
                    f"library and {', '.join(TASK_TOP_LEVEL)}; import the task's code in its methods)"
                    for name in sorted(_top_level_imports(path)) if name.split(".")[0] not in sys.stdlib_module_names
                    and name != "__future__" and not any(_matches(name, a) for a in TASK_TOP_LEVEL)]
        if _matches(module, "scripts"):
            continue  # scripts may probe what is installed (scripts/gpu_report.py); the registries live below
        if module in DISCOVERS:
            continue
        bad += [f"{module} imports {name} (a hidden edge: import modules by name, in a list)"
                for name in imported if any(_matches(name, d) for d in DYNAMIC)]
        bad += [f"{module} calls {call}() (a hidden edge: import modules by name, in a list)"
                for call in sorted(_calls(path))]
    return bad


def test_no_module_imports_upward() -> None:
    bad = _violations(_modules())
    assert not bad, bad


def test_the_check_sees_imports() -> None:
    assert "erasure.registry" in _imports(ROOT / "models" / "registry.py", "models.registry")
    assert "erasure.registry" in _imports(ROOT / "erasure" / "leace.py", "erasure.leace")
    assert "erasure.api" in _imports(ROOT / "erasure" / "__init__.py", "erasure")  # `from .api import ...`
    assert "erasure.leace" in _imports(ROOT / "erasure" / "__init__.py", "erasure")  # `from . import leace`
    assert "training.cli.run" in _imports(ROOT / "training" / "run.py", "training.run")


def test_the_check_catches_each_rule(tmp_path: Path) -> None:
    """Each rule fails on a module that breaks it (these are the edges the tree had before the rules)."""
    cases = {
        "erasure.cache": "from filelock import FileLock\nfrom training.data import LoadedData\n",
        "erasure.progress": "from tqdm.auto import tqdm\n",
        "atomicio": "import torch\nfrom training.common.files import read_json\n",
        "erasure.registry": "import importlib\nimportlib.import_module('erasure.leace')\n",
        "models.build": "from erasure.api import fit\n",
        "training.common.files": "from training.app.schema import config_hash\n",
        "training.app.tasks": "from training.mdl.job import run_job\n",
        "training.app.ledger": "from training.cli.report import exit_user_error\n",
        "scripts.aggregate": "from training.cli.run import main\n",
        "training.data.erase": "from training.run import main\n",
        "training.tasks.toy": "import torch\nfrom training.app.tasks import Task\n",
        "training.starvation.moons": "from training.tasks.gs_two_moons import TwoMoonsOptions\n",
        "training.app.schema": "import importlib\n",
    }
    modules = {}
    for name, text in cases.items():
        path = tmp_path / (name.replace(".", "_") + ".py")
        path.write_text(text)
        modules[name] = path
    bad = _violations(modules)
    for name in cases:
        assert any(line.startswith(f"{name} ") for line in bad), (name, bad)


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
    runs (it cost 1.9 s on every start); the core alone loads no task code and no command line."""
    code = """
import sys
from tests.helpers import job_config
from training.app.schema import cell_hash, config_hash, load_config
for overrides in (["experiment=smoke"], ["experiment=gs_two_moons"], ["experiment=demo", "regularizer=sd"]):
    cfg = job_config("/tmp/unused", overrides)
    load_config(cfg), config_hash(cfg), cell_hash(cfg)
core = sorted(m for m in sys.modules if m.startswith(("training.mdl", "training.starvation", "training.cli")))
import training.cli.run
print(core, "numba" in sys.modules)
"""
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "disabled"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[] False", out.stdout
