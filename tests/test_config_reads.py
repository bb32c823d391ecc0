"""The config is read as typed attributes: `.get(` reads of config objects stay few (at most 5 in
training/, models/, scripts/ and tools/ outside the schema's loading code)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# A `.get(` whose receiver reads a config: a composed or stored config, a group of one, or its options.
CONFIG_NAMES = re.compile(r"\b(cfg|config|conf|arch|dataset|eraser|optim|regularizer|training|logger|paths|gs|"
                          r"opts|options|reg|o|m)\b|\[\"config\"\]")
EXEMPT = {"training/app/schema.py", "training/app/sections.py", "training/app/loading.py"}  # the loading code itself
LIMIT = 5


def config_gets(source: str) -> list[str]:
    """`receiver.get(...)` calls whose receiver is a config (by name), as source text."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "get":
            receiver = ast.unparse(node.func.value)
            if CONFIG_NAMES.search(receiver) and "environ" not in receiver:
                found.append(f"{receiver}.get(...)")
    return found


def test_the_counter_sees_config_reads() -> None:
    assert config_gets('x = cfg["mdl"].get("patience", 100)\ny = os.environ.get("A")\nz = hc.sweeper.get("p")') \
        == ["cfg['mdl'].get(...)"]
    assert config_gets('lam = reg.get("lam", 0.0)\nv = r["config"].get("seed")') == ["reg.get(...)",
                                                                                   "r['config'].get(...)"]


def test_config_is_read_as_attributes() -> None:
    reads = []
    for package in ("training", "models", "scripts", "tools"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = str(path.relative_to(ROOT))
            if rel not in EXEMPT:
                reads += [f"{rel}: {r}" for r in config_gets(path.read_text())]
    assert len(reads) <= LIMIT, "\n".join(reads)
