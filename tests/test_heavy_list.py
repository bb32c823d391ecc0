"""tests/heavy_tests.txt (tools/heavy_tests.py) names tests that exist: a renamed or deleted test would otherwise
leave its line marking nothing, and a renamed heavy test would slip back into `make test`."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from tests.conftest import HEAVY_LIST, heavy_tests
from tools.heavy_tests import node_id

ROOT = Path(__file__).resolve().parents[1]


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}


def test_every_listed_heavy_test_names_a_test_function_that_exists() -> None:
    listed = heavy_tests()
    assert listed, HEAVY_LIST
    missing = []
    for nodeid in sorted(listed):
        path, *_, name = nodeid.split("::")
        function = re.sub(r"\[.*\]$", "", name)
        file = ROOT / path
        if not file.exists() or function not in _functions(file):
            missing.append(nodeid)
    assert not missing, f"stale lines in {HEAVY_LIST} (rerun tools/heavy_tests.py): {missing}"


def test_node_id_of_a_junit_case() -> None:
    assert node_id("tests.test_packed", "test_x[a-b]@expensive_module_fixtures") == "tests/test_packed.py::test_x[a-b]"
    assert node_id("tests.test_a.TestB", "test_c") == "tests/test_a.py::TestB::test_c"
