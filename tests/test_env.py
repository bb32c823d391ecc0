"""The environment variables the harness reads go through training/common/env.py: each named once there, typed,
with its default; no other module of training/ reads os.environ by name."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from training.common import env

ROOT = Path(__file__).resolve().parents[1]


def test_accessors_read_their_variable_with_its_default(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in (env.MEMORY_CHECK, env.LOCK_LOG_EVERY, env.MULTIRUN_LEDGER, env.MULTIRUN_TOTAL,
                "SUBMITIT_EXECUTOR", "SUBMITIT_PREEMPT_SIGNAL"):
        monkeypatch.delenv(var, raising=False)
    assert env.memory_check() and env.lock_log_every() == 60.0 and env.multirun_ledger() is None
    assert env.multirun_total() == "?" and env.submitit_executor() is None and env.submitit_preempt_signal() == "USR2"
    monkeypatch.setenv(env.MEMORY_CHECK, "0")
    monkeypatch.setenv(env.LOCK_LOG_EVERY, "0")
    monkeypatch.setenv(env.MULTIRUN_TOTAL, "")
    monkeypatch.setenv("SUBMITIT_EXECUTOR", "local")
    assert not env.memory_check() and env.lock_log_every() == 0.01 and env.multirun_total() == "?"
    assert env.submitit_executor() == "local"
    monkeypatch.setenv(env.LOCK_LOG_EVERY, "soon")  # not a number: the default, not a traceback
    assert env.lock_log_every() == 60.0


def test_set_multirun_is_what_a_job_reads(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv(env.MULTIRUN_LEDGER, raising=False)
    monkeypatch.delenv(env.MULTIRUN_TOTAL, raising=False)
    env.set_multirun(tmp_path, 12)
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
