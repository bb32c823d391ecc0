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
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _type_checking(node: ast.AST) -> bool:
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, in_function: bool = False) -> Iterator[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement outside `if TYPE_CHECKING:`, with whether it is inside a function."""
    for child in ast.iter_child_nodes(tree):
        if _type_checking(child):
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
    """The strongly connected sets of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                on.discard(w)
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                found.append(sorted(scc))

    sys.setrecursionlimit(10_000)
    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def layers() -> list[list[str]]:
    """The `layers` contract of pyproject.toml, top first: each layer's modules (`a | b`: independent siblings)."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contract = next(c for c in config["tool"]["importlinter"]["contracts"] if c["type"] == "layers")
    return [[m.strip() for m in layer.replace(":", "|").split("|")] for layer in contract["layers"]]


def _level(module: str, levels: list[list[str]]) -> int | None:
    best: tuple[int, int] | None = None  # (prefix length, level): the most specific layer holding the module
    for i, layer in enumerate(levels):
        for prefix in layer:
            if (module == prefix or module.startswith(prefix + ".")) and (best is None or len(prefix) > best[0]):
                best = (len(prefix), i)
    return None if best is None else best[1]


def upward(edges: dict[str, set[str]]) -> list[tuple[str, str]]:
    levels = layers()
    out = []
    for source, targets in sorted(edges.items()):
        for target in sorted(targets):
            a, b = _level(source, levels), _level(target, levels)
            if a is not None and b is not None and b < a:  # index 0 is the top layer
                out.append((source, target))
    return out


def lines(path: Path) -> int:
    return len(path.read_text().splitlines())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--list", action="store_true", help="list every cycle, upward import and in-function import")
    args = parser.parse_args(argv)
    edges, inside = graph()
    found, up = cycles(edges), upward(edges)
    app_inside = [(a, b) for a, b in inside if a.startswith("training.app") and b.startswith("training.app")]
    sizes = {m: lines(p) for m, p in modules().items()}
    app = sum(n for m, n in sizes.items() if m.startswith("training.app"))
    largest = max(sizes, key=lambda m: sizes[m])
    over = sorted(m for m, n in sizes.items() if n > 600)
    print(f"modules: {len(sizes)}, lines: {sum(sizes.values())}")
    print(f"import cycles: {len(found)} ({', '.join(str(len(c)) + ' modules' for c in found) or 'none'})")
    print(f"upward imports: {len(up)}")
    print(f"project imports inside functions: {len(inside)} (training.app -> training.app: {len(app_inside)})")
    print(f"training/app lines: {app}")
    print(f"training/tasks/mdl/job.py lines: {sizes.get('training.tasks.mdl.job', 0)}")
    print(f"largest module: {largest} ({sizes[largest]} lines); over 600 lines: {len(over)} {over or ''}")
    if args.list:
        for c in found:
            print("cycle:", " ".join(c))
        for a, b in up:
            print(f"upward: {a} -> {b}")
        for a, b in inside:
            print(f"inside a function: {a} -> {b}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
