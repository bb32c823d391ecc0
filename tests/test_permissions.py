"""A group-shared output directory: files get the mode the umask gives, not mkstemp's 0o600, and a
cache entry this process may not read is another user's, not a corrupt one: named with its owner, never deleted."""

from __future__ import annotations

import errno
import json
import logging
import os
import pwd
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

import atomicio
import erasure
from erasure import base
from training.common import files
from training.common.files import atomic_write_json, atomic_write_text, umask
from training.data import cache as cache_mod
from training.data.cache import cached_erase, key_hash
from training.data.registry import LoadedData
from training.inputs import erase as erase_mod
from training.inputs.store import Store

KEY = {"dataset": "toy", "content": "abc123", "eraser": "leace", "options": {}}


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def _build(value: float = 1.0) -> tuple[Callable[[], tuple[torch.Tensor, dict]], list[int]]:
    calls: list[int] = []

    def build() -> tuple[torch.Tensor, dict]:
        calls.append(1)
        return torch.full((3, 4), value), {"rank_removed": len(calls)}

    return build, calls


@pytest.mark.parametrize(("mask", "mode"), [(0o002, 0o664), (0o077, 0o600)])  # group-readable; a strict umask kept
def test_files_written_get_the_mode_the_umask_gives(tmp_path: Path, mask: int, mode: int) -> None:
    old = os.umask(mask)
    try:
        assert umask() == mask
        atomic_write_text(tmp_path / "a.txt", "x")
        atomic_write_json(tmp_path / "result.json", {"a": 1})
        build, _ = _build()
        cached_erase(tmp_path / "cache", KEY, build)
        eraser = erasure.fit("leace", torch.randn(40, 3), torch.arange(40) % 2)
        eraser.save(tmp_path / "e.pt")
    finally:
        os.umask(old)
    entry = tmp_path / "cache" / "erased" / key_hash(KEY)
    files = [tmp_path / "a.txt", tmp_path / "result.json", tmp_path / "e.pt",
             *(entry / n for n in ("data.pt", "report.json", "manifest.json"))]
    assert {f.name: oct(_mode(f)) for f in files} == {f.name: oct(mode) for f in files}


def _make_entry(root: Path) -> Path:
    build, _ = _build(1.0)
    cached_erase(root, KEY, build)
    return root / "erased" / key_hash(KEY)


def test_an_unreadable_entry_is_named_with_its_owner_and_never_deleted(tmp_path: Path, caplog: pytest.LogCaptureFixture,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Simulated: tests run as root, where chmod 000 does not stop reading (a real other user: the test below)."""
    entry = _make_entry(tmp_path)
    before = {p.name: p.read_bytes() for p in entry.iterdir()}
    read_text = Path.read_text

    def denied(self: Path, *args: Any, **kwargs: Any) -> str:
        if self.parent == entry:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(self))
        return read_text(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", denied)
    build, calls = _build(2.0)
    with caplog.at_level(logging.INFO, logger="training.data.cache"):
        x, report, hit = cached_erase(tmp_path, KEY, build)
    assert not hit and calls == [1] and float(x[0, 0]) == 2.0  # erased in memory
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    me = pwd.getpwuid(os.getuid()).pw_name
    assert len(warnings) == 1 and "\n" not in warnings[0], warnings
    assert str(entry / "manifest.json") in warnings[0] and f"owner {me}" in warnings[0], warnings[0]
    assert "not readable" in warnings[0] and "corrupt" not in warnings[0]
    assert {p.name: p.read_bytes() for p in entry.iterdir()} == before  # left exactly as it was
    monkeypatch.undo()
    x, _, hit = cached_erase(tmp_path, KEY, _build(3.0)[0])
    assert hit and float(x[0, 0]) == 1.0  # the owner's entry still serves


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A directory another user can reach (pytest's tmp_path sits under a 0o700 directory of root's)."""
    path = Path(tempfile.mkdtemp(prefix="erasure-mdl-shared-"))
    os.chmod(path, 0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.mark.skipif(not hasattr(os, "fork") or os.geteuid() != 0, reason="needs root to act as another user")
def test_another_users_unreadable_entry_is_left_alone(shared_dir: Path) -> None:
    """The case for real: root's entry with mkstemp's old 0o600 files, read by `nobody` (a forked
    child that drops to uid 65534): it warns naming the owner, erases in memory, and deletes nothing."""
    tmp_path = shared_dir
    entry = _make_entry(tmp_path)
    for p in entry.iterdir():
        os.chmod(p, 0o600)  # what the harness wrote before files followed the umask
    lock = tmp_path / "erased" / f"{key_hash(KEY)}.lock"
    os.chmod(lock, 0o666)  # a group-shared directory lets the colleague take the lock
    before = {p.name: p.read_bytes() for p in entry.iterdir()}
    value = torch.full((3, 4), 5.0)  # made before the fork: the child runs no torch op
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(f"{record.levelname} {record.getMessage()}")

    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the colleague
        status = 1
        try:
            os.close(read_fd)
            os.setgid(65534)
            os.setuid(65534)
            logger = logging.getLogger("training.data.cache")
            logger.addHandler(Keep())
            logger.setLevel(logging.INFO)
            x, _, hit = cache_mod.cached_erase(tmp_path, KEY, lambda: (value, {"mine": True}))
            out = {"hit": hit, "value": float(x[0, 0]), "records": records}
            status = 0
        except BaseException as err:  # noqa: BLE001 - report anything to the parent
            out = {"error": f"{type(err).__name__}: {err}"}
        finally:
            os.write(write_fd, json.dumps(out).encode())
            os.close(write_fd)
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd) as f:
        out = json.loads(f.read() or "{}")
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, out
    assert out["hit"] is False and out["value"] == 5.0
    warnings = [r for r in out["records"] if r.startswith("WARNING")]
    assert len(warnings) == 1 and "owner root" in warnings[0] and str(entry / "manifest.json") in warnings[0]
    assert "-rw-------" in warnings[0] and "corrupt" not in warnings[0]
    assert {p.name: p.read_bytes() for p in entry.iterdir()} == before


def test_an_unreadable_cached_certificate_is_computed_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    data = LoadedData("toy", torch.rand(40, 1, 2, 2), torch.arange(40) % 2, 2)

    def denied(path: Path) -> None:
        raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))

    monkeypatch.setattr(erase_mod, "read_json", denied)
    with caplog.at_level(logging.WARNING):
        cert = erase_mod.certify_original(data, Store(tmp_path))
    assert "max_mean_gap" in cert
    assert any("cached certificate" in r.getMessage() and "not readable" in r.getMessage() for r in caplog.records)


def test_the_eraser_library_and_the_harness_write_files_with_one_implementation(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """erasure/ (which imports nothing of the harness) and training/common/files.py share atomicio.atomic_write:
    a full disk while an eraser saves is named by the eraser's file (as for a result), and leaves no temp file."""
    assert files.atomic_write is atomicio.atomic_write and base.atomic_write is atomicio.atomic_write

    def full_disk(obj: object, f: str) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a write on a full disk: no file name

    eraser = erasure.fit("leace", torch.randn(40, 3), torch.arange(40) % 2)
    monkeypatch.setattr(base.torch, "save", full_disk)
    with pytest.raises(OSError) as err:
        eraser.save(tmp_path / "e.pt")
    assert err.value.errno == errno.ENOSPC and err.value.filename == str(tmp_path / "e.pt")
    assert list(tmp_path.iterdir()) == []
