"""The errand pages (docs/errands/) name exactly the files an errand touches, and docs/extending.md agrees with them.

Each page has a table whose first column names the files (`<name>` stands for the new entry's name). A new eraser,
architecture and task are done here as their page says: the repository is copied, only the files the page names
are written (a toy entry of each), and in the copy the generic tests that the page says cover the new entry collect
it and pass, and a tiny job runs with it from the command line. A page naming a file this test does not write, or
not naming one it writes, fails naming the line to change. The block partition is checked against the code: what
defines the partition, what a numerics bump touches, the tests of the partition's sizes and every module of the job
that calls the partition (`partition_logspace`, `most_blocks`, `make_split`) are on its page. The code trail of "why
a number is what it is" names modules and functions that exist, and the modules on it write the result fields it
describes.
"""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.helpers import TOY_TASK, TOY_TASK_INIT, TOY_TASK_PRESET, TOY_TASK_RESULT

ROOT = Path(__file__).resolve().parents[1]
PAGES = ROOT / "docs" / "errands"
ROW = re.compile(r"^\| *`([^`]+)`")  # a table row whose first cell is a file


def page_files(page: str, table: int = 0) -> list[str]:
    """The files the page's `table`-th table names (its first column), in order: the first table is the errand."""
    tables: list[list[str]] = []
    inside = False
    for line in (PAGES / page).read_text().splitlines():
        if line.startswith("|") and not inside:
            tables.append([])
        inside = line.startswith("|")
        if (m := ROW.match(line)):
            tables[-1].append(m.group(1))
    return tables[table] if table < len(tables) else []


def page_tests(page: str) -> set[str]:
    """The test files the page names (as what covers the new entry)."""
    return set(re.findall(r"`(tests/test_\w+\.py)`", (PAGES / page).read_text()))


def add_to_import_line(package: str, name: str) -> Callable[[Path], None]:
    """The edit of a package's `__init__.py` that lists its modules in one import line (`from . import a, b`)."""

    def edit(path: Path) -> None:
        modules = {p.stem for p in path.parent.glob("*.py")}
        lines = path.read_text().splitlines(keepends=True)
        for i, line in enumerate(lines):
            m = re.match(rf"^from (?:\.|{package}) import ([\w, ]+?)(\s*#.*)?$", line.rstrip("\n"))
            if m and {n.strip() for n in m.group(1).split(",")} <= modules:
                names = sorted({*(n.strip() for n in m.group(1).split(",")), name})
                lines[i] = line.replace(m.group(1), ", ".join(names), 1)
                path.write_text("".join(lines))
                return
        raise AssertionError(f"{path}: no import line listing the package's modules")

    return edit


def doc_block(doc: str, path: str) -> str:
    """The code block of docs/`doc` whose first line is `# <path>` (the page's worked example of that file)."""
    text = (ROOT / "docs" / doc).read_text()
    for block in re.findall(r"```\w*\n(.*?)```", text, flags=re.S):
        first, _, rest = block.partition("\n")
        if first.strip() == f"# {path}":
            return rest
    raise AssertionError(f"docs/{doc} has no code block starting with `# {path}`")


# --- the toy entries: what each errand writes into the files its page names ---------------------------------------
ERASER = "mean_shift"  # the worked example of docs/extending.md, written from its code blocks
ARCH = "toy_mlp"
TOY_ARCH = '''"""An MLP of `depth` hidden layers in μP: the throwaway architecture of tests/test_errands.py."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from torch import nn

from models.mup_utils import kaiming_uniform_init
from models.registry import ARCHS, Arch


@dataclass(frozen=True, kw_only=True)
class ToyOptions:
    activation: Literal["relu", "tanh"] = "relu"


@ARCHS.register("toy_mlp", vectorises=True, base_width=64, depth_exponent=1.0, init=kaiming_uniform_init,
                options=ToyOptions)
@dataclass(frozen=True)
class ToySpec:
    in_features: int
    width: int
    depth: int
    num_classes: int
    activation: str = "relu"

    @staticmethod
    def stage_depths(arch: Arch, depth: int | None = None) -> tuple[int, ...]:
        return (arch.depth if depth is None else depth,)

    @classmethod
    def from_arch(cls, arch: Arch, input_shape: tuple[int, ...], num_classes: int) -> ToySpec:
        c, h, w = input_shape
        return cls(c * h * w, arch.width, arch.depth, num_classes, arch.options.activation)

    def build(self) -> nn.Module:
        from mup import MuReadout

        layers: list[nn.Module] = [nn.Flatten()]
        for i in range(self.depth):
            layers += [nn.Linear(self.in_features if i == 0 else self.width, self.width),
                       nn.ReLU() if self.activation == "relu" else nn.Tanh()]
        return nn.Sequential(*layers, MuReadout(self.width, self.num_classes, readout_zero_init=True))

    def info(self) -> dict[str, Any]:
        return {"in_features": self.in_features, "activation": self.activation}
'''
TOY_ARCH_YAML = """name: toy_mlp
tag: toy_mlp_${.activation}
activation: relu
width: 64
depth: 2
base_width: 64
base_depth: 2
parametrization: mup
paper_optim:
  lr: {control: 1.0e-3, linear: 2.0e-3, quadratic: 3.0e-3}
  beta1: 0.9
  warmup_steps: 0
"""
TASK = TOY_TASK  # tests/helpers.py holds its files


def _write(text: str) -> Callable[[Path], None]:
    def write(path: Path) -> None:
        path.write_text(text)

    return write


ERRANDS: dict[str, tuple[str, dict[str, Callable[[Path], None]]]] = {  # page: (name, {file it names: its edit})
    "new-eraser.md": (ERASER, {
        "erasure/<name>.py": _write(doc_block("extending.md", f"erasure/{ERASER}.py")),
        "erasure/__init__.py": add_to_import_line("erasure", ERASER),
        "conf/eraser/<name>.yaml": _write(doc_block("extending.md", f"conf/eraser/{ERASER}.yaml")),
    }),
    "new-architecture.md": (ARCH, {
        "models/<name>.py": _write(TOY_ARCH),
        "models/__init__.py": add_to_import_line("models", ARCH),
        "conf/arch/<name>.yaml": _write(TOY_ARCH_YAML),
    }),
    "new-task.md": (TASK, {
        "training/tasks/<name>/__init__.py": _write(TOY_TASK_INIT),
        "training/tasks/<name>/result.py": _write(TOY_TASK_RESULT),
        "conf/experiment/<name>.yaml": _write(TOY_TASK_PRESET),
    }),
}
# The generic tests that must collect the new entry (the page must name them); their other tests run too.
COVERED_BY = {
    "new-eraser.md": {"tests/test_erasure_common.py", "tests/test_erasure_api.py", "tests/test_eraser_keys.py"},
    "new-architecture.md": {"tests/test_models.py", "tests/test_coord_check.py"},
    "new-task.md": {"tests/test_task_keys.py"},
}
# The command line each errand's new entry runs (a tiny job), in the copy.
JOB = {
    "new-eraser.md": ["experiment=smoke", f"eraser={ERASER}", "mdl.max_epochs=2", "certificate=true", "seed=0"],
    "new-architecture.md": ["experiment=smoke", f"arch={ARCH}", "mdl.max_epochs=2", "seed=0"],
    "new-task.md": [f"experiment={TASK}", "seed=3"],
}


@pytest.mark.parametrize("page", sorted(ERRANDS))
def test_the_page_names_exactly_the_files_the_errand_writes(page: str) -> None:
    named, (_, edits) = page_files(page), ERRANDS[page]
    assert named, f"docs/errands/{page}: no table of files (| `path` | what to change |)"
    assert len(named) == len(set(named)), f"docs/errands/{page} names a file twice: {named}"
    extra, missing = sorted(set(named) - set(edits)), sorted(set(edits) - set(named))
    assert not extra, f"docs/errands/{page} names {extra}, which the errand does not touch: drop those rows"
    assert not missing, f"docs/errands/{page} misses {missing}, which the errand touches: add a row for each"
    assert COVERED_BY[page] <= page_tests(page), f"docs/errands/{page}: name {COVERED_BY[page]} as what covers it"


def test_extending_lists_the_same_files_as_each_errand_page() -> None:
    """docs/extending.md's table of errands: each row's files are its page's files, and it links each page."""
    rows = {}
    for line in (ROOT / "docs" / "extending.md").read_text().splitlines():
        m = re.match(r"^\| *\[[^\]]+\]\(errands/([\w-]+\.md)\) *\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = re.findall(r"`([^`]+)`", m.group(2))
    pages = sorted(p.name for p in PAGES.glob("*.md") if "Files to touch" in p.read_text())
    assert sorted(rows) == pages, f"docs/extending.md's errand table lists {sorted(rows)}; the pages: {pages}"
    for page, files in rows.items():
        assert files == page_files(page), f"docs/extending.md's row of {page}: {files} != the page's {page_files(page)}"


def _copy_repo(dest: Path) -> Path:
    listed = subprocess.run(["git", "ls-files", "-z", "-co", "--exclude-standard"], cwd=ROOT, capture_output=True,
                            check=True).stdout.decode().split("\0")
    for rel in filter(None, listed):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)
    return dest


def _run(cmd: list[str], cwd: Path, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(cwd), "WANDB_MODE": "disabled", "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.mark.skipif(not (ROOT / ".git").exists(), reason="copies the repository's files as git lists them")
@pytest.mark.parametrize("page", sorted(ERRANDS))
def test_the_errand_done_as_its_page_says_passes_the_generic_tests(page: str, tmp_path: Path) -> None:
    name, edits = ERRANDS[page]
    repo = _copy_repo(tmp_path / "repo")
    for rel in page_files(page):  # only what the page names
        path = repo / rel.replace("<name>", name)
        path.parent.mkdir(parents=True, exist_ok=True)
        edits[rel](path)
    tests = sorted(page_tests(page))
    collected = _run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q",
                      "--collect-only", *tests], repo)
    assert collected.returncode == 0, collected.stdout[-3000:] + collected.stderr[-3000:]
    nodes = [n for n in collected.stdout.splitlines() if "::" in n]
    new = [n for n in nodes if re.search(rf"[\[-]{name}[\]-]", n)]
    for test in COVERED_BY[page]:
        assert any(n.startswith(test) for n in new), f"{test} does not collect the new entry {name!r}"
    plain = [n for n in nodes if "[" not in n]  # the registry-wide checks of those files
    proc = _run([sys.executable, "-m", "pytest", "-p", "no:xdist", "-p", "no:cacheprovider", "-q", "-x",
                 "-m", "not gpu and not slurm and not slow and not heavy", *new, *plain], repo, timeout=1800)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
    job = _run([sys.executable, "-m", "training.run", *JOB[page], f"paths.out_dir={tmp_path / 'out'}", "logger=none",
                "progress=false"], repo)
    assert job.returncode == 0, job.stderr[-3000:]
    assert len(list((tmp_path / "out").rglob("result.json"))) == 1


# --- the block partition: checked against the code ----------------------------------------------------------------
PARTITION = ("partition_logspace", "most_blocks", "make_split")


def _calls(path: Path, names: tuple[str, ...]) -> bool:
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Call):
            f = node.func
            if (isinstance(f, ast.Name) and f.id in names) or (isinstance(f, ast.Attribute) and f.attr in names):
                return True
    return False


def _modules(under: str, keep: Callable[[Path], bool]) -> set[str]:
    return {p.relative_to(ROOT).as_posix() for p in sorted((ROOT / under).rglob("*.py")) if keep(p)}


def test_the_block_partition_page_names_what_a_new_partition_touches() -> None:
    rule, option = page_files("block-partition.md", 0), page_files("block-partition.md", 1)
    missing = [f for f in rule + option if not (ROOT / f).exists()]
    assert not missing, f"docs/errands/block-partition.md names files that do not exist: {missing}"
    defines = _modules("training", lambda p: bool(re.search(r"^def (partition_logspace|most_blocks)\(", p.read_text(),
                                                            flags=re.M)))
    numerics = _modules("training", lambda p: bool(re.search(r"^NUMERICS = \d+", p.read_text(), flags=re.M)))
    mdl_task = _modules("training/tasks", lambda p: p.name == "__init__.py" and 'name = "mdl"' in p.read_text())
    known_answers = _modules("tests", lambda p: _calls(p, PARTITION[:2]))  # tests of the partition's sizes
    needed = {*defines, *numerics, *mdl_task, *known_answers, "tests/golden/numerics.json", "docs/running.md"}
    assert not needed - set(rule), f"docs/errands/block-partition.md's first table does not name " \
                                   f"{sorted(needed - set(rule))}: add a row for each"
    callers = _modules("training", lambda p: _calls(p, PARTITION)) - defines  # the job's code, from the mdl section
    assert not callers - set(option), f"docs/errands/block-partition.md's option table does not name " \
                                      f"{sorted(callers - set(option))}, which call the partition: add a row for each"


# --- why a number is what it is: the trail exists --------------------------------------------------------------------
def test_the_explain_a_number_trail_names_modules_and_functions_that_exist() -> None:
    text = (PAGES / "explain-a-number.md").read_text()
    paths = set(re.findall(r"`((?:training|erasure|models|scripts)/[\w/]+\.py)`", text))
    assert paths, "the page names no module"
    for rel in sorted(paths):
        assert (ROOT / rel).exists(), f"docs/errands/explain-a-number.md names {rel}, which does not exist"
    # `module.py` (`function`, ...): each function named right after a module is defined there
    for rel, names in re.findall(r"`((?:training|erasure|models|scripts)/[\w/]+\.py)` \(([^)]*)\)", text):
        defined = {n.name for n in ast.walk(ast.parse((ROOT / rel).read_text()))
                   if isinstance(n, ast.FunctionDef | ast.ClassDef)}
        for fn in re.findall(r"`(\w+)`", names):
            assert fn in defined, f"docs/errands/explain-a-number.md: {rel} defines no {fn}"
    fields = re.findall(r"`mdl\.(\w+)`", text)
    assert fields, "the page names the result's mdl fields"
    written = "".join((ROOT / rel).read_text() for rel in paths)
    for name in fields:  # a key of the mdl section, as the modules on the trail write it
        assert f'"{name}"' in written, f"docs/errands/explain-a-number.md: no module on its trail writes mdl.{name}"
