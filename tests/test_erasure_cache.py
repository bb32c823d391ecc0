"""Erased-data cache: hit without refit, corrupt/partial entries rebuilt, key sensitivity, process lock."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from torch import Tensor

from training.data.cache import cached_erase, code_version, key_hash

KEY = {"dataset": "toy", "content": "abc123", "eraser": "leace", "options": {"rtol": None}}


class Builder:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> tuple[Tensor, dict]:
        self.calls += 1
        return torch.arange(12, dtype=torch.float32).reshape(3, 4) * self.calls, {"rank_removed": self.calls}


def _entry(root: Path) -> Path:
    return root / "erased" / key_hash(KEY)


def test_second_call_hits_without_refit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    build = Builder()
    with caplog.at_level(logging.INFO, logger="training.data.cache"):
        x1, r1, hit1 = cached_erase(tmp_path, KEY, build)
        x2, r2, hit2 = cached_erase(tmp_path, dict(reversed(list(KEY.items()))), build)  # key order irrelevant
    assert (hit1, hit2) == (False, True) and build.calls == 1
    assert torch.equal(x1, x2) and r1 == r2 == {"rank_removed": 1}
    assert "cache miss" in caplog.text and "cache hit" in caplog.text
    entry = _entry(tmp_path)
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["code_version"] == code_version() and manifest["key"]["eraser"] == "leace"
    assert set(manifest["sha256"]) == {"data.pt", "report.json"}
    assert not list(entry.glob("*.tmp"))


def test_key_changes_miss(tmp_path: Path) -> None:
    build = Builder()
    cached_erase(tmp_path, KEY, build)
    cached_erase(tmp_path, {**KEY, "options": {"rtol": 1e-8}}, build)
    cached_erase(tmp_path, {**KEY, "content": "other"}, build)
    assert build.calls == 3
    assert key_hash(KEY) != key_hash({**KEY, "eraser": "qleace"})
    assert key_hash({"a": (1, 2)}) == key_hash({"a": [1, 2]})


@pytest.mark.parametrize("damage", ["flip_byte", "truncate", "drop_manifest", "bad_manifest", "drop_report"])
def test_corrupt_or_partial_entry_is_rebuilt(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                             damage: str) -> None:
    build = Builder()
    cached_erase(tmp_path, KEY, build)
    entry = _entry(tmp_path)
    data = entry / "data.pt"
    if damage == "flip_byte":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif damage == "truncate":
        data.write_bytes(data.read_bytes()[:20])
    elif damage == "drop_manifest":
        (entry / "manifest.json").unlink()
    elif damage == "bad_manifest":
        (entry / "manifest.json").write_text("{not json")
    else:
        (entry / "report.json").unlink()
    with caplog.at_level(logging.WARNING, logger="training.data.cache"):
        x, rep, hit = cached_erase(tmp_path, KEY, build)
    assert not hit and build.calls == 2 and rep == {"rank_removed": 2}
    assert "partial or corrupt" in caplog.text
    x3, rep3, hit3 = cached_erase(tmp_path, KEY, build)  # the rebuilt entry is valid
    assert hit3 and torch.equal(x3, x) and build.calls == 2


_WORKER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import torch
    from training.data.cache import cached_erase

    root, log = Path(sys.argv[1]), Path(sys.argv[2])

    def build():
        with open(log, "a") as f:
            f.write("fit\\n")
        time.sleep(2.0)
        return torch.ones(4, 3), {"ok": True}

    (root.parent / "ready").write_text("1")
    x, rep, hit = cached_erase(root, {"dataset": "toy", "eraser": "leace"}, build)
    print(json.dumps({"hit": hit, "sum": float(x.sum())}))
""")


def test_two_processes_fit_once(tmp_path: Path) -> None:
    """A worker process and this one race for the same key (the fit takes 2 s): exactly one fits."""
    script = tmp_path / "worker.py"
    script.write_text(_WORKER)
    log = tmp_path / "fits.log"
    root = Path(__file__).resolve().parents[1]
    # PYTHONPATH: the worker script's own folder comes first on sys.path, so without it the worker would import an
    # installed copy of erasure/ (another checkout: another code version, another cache key) instead of this one.
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen([sys.executable, str(script), str(tmp_path / "cache"), str(log)], cwd=root, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (tmp_path / "ready").exists():
        assert proc.poll() is None, proc.communicate()[1]
        assert time.monotonic() < deadline
        time.sleep(0.01)

    def build() -> tuple[Tensor, dict]:
        with open(log, "a") as f:
            f.write("fit\n")
        time.sleep(2.0)
        return torch.ones(4, 3), {"ok": True}

    x, _, hit = cached_erase(tmp_path / "cache", {"dataset": "toy", "eraser": "leace"}, build)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    other = json.loads(out.strip().splitlines()[-1])
    assert log.read_text().count("fit") == 1
    assert sorted([hit, other["hit"]]) == [False, True]
    assert float(x.sum()) == other["sum"] == 12.0
