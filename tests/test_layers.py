"""Data flows one way: no module imports code of a layer above it (checked on every import statement)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# package prefix -> module prefixes it must not import (anywhere in the module, lazy imports included)
FORBIDDEN = {
    "erasure": ("training", "models", "scripts"),
    "models": ("training", "scripts", "erasure.api", "erasure.cache"),
    "training.engine": ("training.app", "training.mdl", "training.starvation", "training.run", "scripts"),
    "training.data": ("training.app", "training.mdl", "training.starvation", "training.run", "scripts"),
    "training.app.schema": ("training.mdl", "training.starvation", "training.run", "scripts"),
    "training.app.results": ("training.mdl", "training.starvation", "training.run", "scripts"),
    "training.app.tasks": ("training.mdl", "training.starvation", "training.run", "scripts"),
    "training.mdl": ("training.run", "training.app.ledger", "training.app.sweeps", "training.starvation", "scripts"),
    "training.starvation": ("training.run", "training.app.ledger", "training.app.sweeps", "scripts"),
}


def _modules() -> dict[str, Path]:
    out = {}
    for package in ("erasure", "models", "training"):
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
                base = module.split(".")[: -node.level] if not path.name == "__init__.py" else module.split(".")
                found.add(".".join([*base, node.module] if node.module else base))
            elif node.module:
                found.add(node.module)
                found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def _matches(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def test_no_module_imports_upward() -> None:
    bad = []
    for module, path in _modules().items():
        for owner, forbidden in FORBIDDEN.items():
            if _matches(module, owner):
                bad += [f"{module} imports {name}" for name in sorted(_imports(path, module))
                        if any(_matches(name, f) for f in forbidden)]
    assert not bad, bad


def test_the_check_sees_imports() -> None:
    assert "erasure.registry" in _imports(ROOT / "models" / "registry.py", "models.registry")
    assert "erasure.registry" in _imports(ROOT / "erasure" / "leace.py", "erasure.leace")
