"""The shape of the code, counted: import cycles, imports that go up a layer, project imports inside functions, and
module sizes (rerun after a change to compare).

    .venv/bin/python tools/import_graph.py          # the figures
    .venv/bin/python tools/import_graph.py --list   # and every cycle, upward import and in-function import

An edge is an import statement of one project module by another, at any depth (inside functions too), except under
`if TYPE_CHECKING:`; `from a import b` is an edge to a.b where that is a module. A cycle is a strongly connected set
of modules (counted once however many loops it holds). The layers are those of the `layers` contract in
pyproject.toml ([tool.importlinter], which `make lint` checks with lint-imports): an edge is upward when its target
is in a higher layer than its source. Imports inside functions are the project imports in a function body.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("atomicio", "erasure", "models", "training", "scripts", "tools")


def modules() -> dict[str, Path]:
    out = {}
    for path in (p for package in PACKAGES for p in sorted((ROOT / package).rglob("*.py"))):
        parts = path.relative_to(ROOT).with_suffix("").parts
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _imports(tree: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement outside `if TYPE_CHECKING:`, with whether it is inside a function."""
    for child in ast.iter_child_nodes(tree):
        if isinstance(child, ast.If) and isinstance(child.test, ast.Name | ast.Attribute) \
                and ast.unparse(child.test).rpartition(".")[2] == "TYPE_CHECKING":
            continue
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, in_function
        else:
            yield from _imports(child, in_function or isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef))


def _targets(node: ast.Import | ast.ImportFrom, module: str, path: Path, known: dict[str, Path]) -> set[str]:
    if isinstance(node, ast.Import):
        names = [a.name for a in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
            base = ".".join([*package[: len(package) - node.level + 1], *([node.module] if node.module else [])])
        names = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
    return {n for n in names if n.split(".")[0] in PACKAGES}


def graph() -> tuple[dict[str, set[str]], list[tuple[str, str]]]:
    """Module -> the project modules it imports; and the (module, imported) pairs inside functions."""
    known = modules()
    edges: dict[str, set[str]] = {m: set() for m in known}
    inside: list[tuple[str, str]] = []
    for module, path in known.items():
        for node, in_function in _imports(ast.parse(path.read_text())):
            for target in sorted(_targets(node, module, path, known)):
                while target not in known and "." in target:
                    target = target.rpartition(".")[0]
                if target in known and target != module:
                    edges[module].add(target)
                    if in_function:
                        inside.append((module, target))
    return edges, inside


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected sets of more than one module: a module with the modules that it reaches and that reach
    it."""
    reach: dict[str, set[str]] = {}
    for start in edges:
        seen: set[str] = set()
        todo = [start]
        while todo:
            for w in edges[todo.pop()] - seen:
                seen.add(w)
                todo.append(w)
        reach[start] = seen
    return [list(c) for c in sorted({tuple(sorted(w for w in reach[v] if v in reach[w])) for v in edges
                                     if v in reach[v]})]


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The edges whose target is in a higher layer (of the `layers` contract, top first; `a | b`: siblings) than
    their source; a module's layer is that of the most specific name holding it."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    prefixes = [(m.strip(), i) for i, layer in enumerate(contract["layers"])
                for m in layer.replace(":", "|").split("|")]

    def level(module: str) -> int | None:
        held = [(len(p), i) for p, i in prefixes if module == p or module.startswith(p + ".")]
        return max(held)[1] if held else None

    return [(a, b) for a in sorted(edges) for b in sorted(edges[a])
            if (la := level(a)) is not None and (lb := level(b)) is not None and lb < la]  # index 0: the top layer


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list every cycle, upward import and in-function import")
    args = parser.parse_args(argv)
    edges, inside = graph()
    found, up = cycles(edges), upward(edges)
    app_inside = [(a, b) for a, b in inside if a.startswith("training.app") and b.startswith("training.app")]
    sizes = {m: len(p.read_text().splitlines()) for m, p in modules().items()}
    largest = max(sizes, key=lambda m: sizes[m])
    over = sorted(m for m, n in sizes.items() if n > 600)
    print(f"modules: {len(sizes)}, lines: {sum(sizes.values())}")
    print(f"import cycles: {len(found)} ({', '.join(str(len(c)) + ' modules' for c in found) or 'none'})")
    print(f"upward imports: {len(up)}")
    print(f"project imports inside functions: {len(inside)} (training.app -> training.app: {len(app_inside)})")
    print(f"training/app lines: {sum(n for m, n in sizes.items() if m.startswith('training.app'))}")
    print(f"training/tasks/mdl/job.py lines: {sizes.get('training.tasks.mdl.job', 0)}")
    print(f"largest module: {largest} ({sizes[largest]} lines); over 600 lines: {len(over)} {over or ''}")
    if args.list:
        print("".join(f"cycle: {' '.join(c)}\n" for c in found) + "".join(f"upward: {a} -> {b}\n" for a, b in up)
              + "".join(f"inside a function: {a} -> {b}\n" for a, b in inside), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main())
