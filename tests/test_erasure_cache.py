"""Erased-data cache: hit without refit, an entry served only if it is the one asked for (its manifest's key, code
version and checksums), others set aside (never deleted) and rebuilt, key sensitivity, process lock; the
after-erasure certificate cached with its entry (seeds of a fit_on=all cell reuse it)."""

from __future__ import annotations

import json
import logging
import os
import runpy
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

import erasure
from tests.helpers import TINY, job_config, result_of
from training.app.schema import group_config
from training.app.tasks import load_job
from training.data import load_dataset
from training.data.cache import cached_erase, code_version, key_hash
from training.inputs.erase import apply_eraser, cache_key, certify, certify_erased
from training.inputs.store import Store
from training.tasks.mdl.job import run_job

KEY = {"dataset": "toy", "content": "abc123", "eraser": "leace", "options": {"rtol": None}}


class Builder:
    def __init__(self) -> None:
        self.calls = 0

    def __call__(self) -> tuple[Tensor, dict]:
        self.calls += 1
        return torch.arange(12, dtype=torch.float32).reshape(3, 4) * self.calls, {"rank_removed": self.calls}


def test_second_call_hits_without_refit(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    build = Builder()
    with caplog.at_level(logging.INFO, logger="training.data.cache"):
        x1, r1, hit1 = cached_erase(tmp_path, KEY, build)
        x2, r2, hit2 = cached_erase(tmp_path, dict(reversed(list(KEY.items()))), build)  # key order irrelevant
    assert (hit1, hit2) == (False, True) and build.calls == 1
    assert torch.equal(x1, x2) and r1 == r2 == {"rank_removed": 1}
    assert "cache miss" in caplog.text and "cache hit" in caplog.text
    entry = tmp_path / "erased" / key_hash(KEY)
    manifest = json.loads((entry / "manifest.json").read_text())
    assert manifest["code_version"] == code_version() and manifest["key"]["eraser"] == "leace"
    assert set(manifest["sha256"]) == {"data.pt", "report.json"}
    assert not list(entry.glob("*.tmp"))
    cached_erase(tmp_path, {**KEY, "options": {"rtol": 1e-8}}, build)  # another key: a miss
    cached_erase(tmp_path, {**KEY, "content": "other"}, build)
    assert build.calls == 3
    assert key_hash(KEY) != key_hash({**KEY, "eraser": "qleace"})
    assert key_hash({"a": (1, 2)}) == key_hash({"a": [1, 2]})


def _copy_entry(root: Path, source: dict, target: dict) -> Path:
    """A hand copy (or a rename, a sync tool, a bad restore) of the entry of `source` under the name of `target`'s."""
    src, dst = root / "erased" / key_hash(source), root / "erased" / key_hash(target)
    dst.mkdir(parents=True)
    for f in src.iterdir():
        (dst / f.name).write_bytes(f.read_bytes())
    return dst


CORRUPT = ["flip_byte", "truncate", "drop_manifest", "bad_manifest", "drop_report"]
MANIFEST_EDITS = ["another code version", "data hash dropped", "data.pt replaced"]


@pytest.mark.parametrize("edit", [*CORRUPT, "another key", *MANIFEST_EDITS])
def test_an_entry_is_served_only_if_it_is_whole_and_the_one_asked_for(tmp_path: Path,
                                                                      caplog: pytest.LogCaptureFixture,
                                                                      edit: str) -> None:
    """A corrupt or partial entry, another key's entry under this key's name, an entry of another code version, a
    manifest that no longer checks data.pt, or data.pt swapped for another valid tensor: never served; refitted, the
    entry set aside (renamed, never deleted) with one warning line. The entry asked for is still a hit (no refit)."""
    other = {**KEY, "eraser": "random"}
    build = Builder()
    cached_erase(tmp_path, KEY, build)  # the entry of KEY (built once)
    if edit == "another key":
        entry = _copy_entry(tmp_path, KEY, other)
    else:
        cached_erase(tmp_path, other, Builder())
        entry = tmp_path / "erased" / key_hash(other)
    data, manifest = entry / "data.pt", json.loads((entry / "manifest.json").read_text())
    if edit == "flip_byte":
        raw = bytearray(data.read_bytes())
        raw[len(raw) // 2] ^= 0xFF
        data.write_bytes(bytes(raw))
    elif edit == "truncate":
        data.write_bytes(data.read_bytes()[:20])
    elif edit == "drop_manifest":
        (entry / "manifest.json").unlink()
    elif edit == "bad_manifest":
        (entry / "manifest.json").write_text("{not json")
    elif edit == "drop_report":
        (entry / "report.json").unlink()
    elif edit == "another code version":
        manifest["code_version"] = "0" * 16
    elif edit == "data hash dropped":
        del manifest["sha256"]["data.pt"]
    elif edit == "data.pt replaced":
        torch.save(torch.zeros(3, 4), data)  # a valid tensor, not the one whose hash is recorded
    if edit in MANIFEST_EDITS:
        (entry / "manifest.json").write_text(json.dumps(manifest))
    kept = {p.name: p.read_bytes() for p in entry.iterdir()}
    fresh = Builder()
    with caplog.at_level(logging.INFO, logger="training.data.cache"):
        x, report, hit = cached_erase(tmp_path, other, lambda: (-fresh()[0], {"rank_removed": -1}))
    assert not hit and fresh.calls == 1 and report == {"rank_removed": -1}
    assert torch.equal(x, -torch.arange(12, dtype=torch.float32).reshape(3, 4))  # its own data, not KEY's
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and str(entry) in warnings[0] and "set aside" in warnings[0], warnings
    assert "partial or corrupt" in warnings[0] or edit not in CORRUPT, warnings
    aside = entry.with_name(f"{entry.name}.set-aside-1")
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == kept  # kept aside exactly as it was
    x_again, _, hit_again = cached_erase(tmp_path, other, Builder())
    assert hit_again and torch.equal(x_again, x)  # the rebuilt entry is served
    x0, _, hit0 = cached_erase(tmp_path, KEY, build)  # the right entry: still a cache hit, no refit
    assert hit0 and build.calls == 1 and torch.equal(x0, torch.arange(12, dtype=torch.float32).reshape(3, 4))
    assert sorted(p.name for p in entry.parent.glob("*.set-aside-*")) == [aside.name]
    # a second bad entry under the same name gets the next free name: the first one set aside stays as it was
    entry.rename(tmp_path / "good")
    _copy_entry(tmp_path, KEY, other)
    assert cached_erase(tmp_path, other, Builder())[2] is False
    assert sorted(p.name for p in entry.parent.glob("*.set-aside-*")) == [f"{entry.name}.set-aside-{n}" for n in (1, 2)]
    assert {p.name: p.read_bytes() for p in aside.iterdir()} == kept


def test_the_random_eraser_is_never_served_leaces_entry(tmp_path: Path) -> None:
    """LEACE's erased digits copied under the random eraser's entry name: the random eraser's job erases with the
    random eraser (as in a fresh cache), not with LEACE."""
    data = load_dataset(group_config("dataset", "digits"))
    leace, rnd = group_config("eraser", "leace"), group_config("eraser", "random")
    x_leace, _ = apply_eraser(data, leace, Store(tmp_path / "shared"), certificate=False)
    x_fresh, fresh = apply_eraser(data, rnd, Store(tmp_path / "fresh"), certificate=False)
    _copy_entry(tmp_path / "shared", cache_key(data, "leace", leace.options), cache_key(data, "random", rnd.options))
    x, info = apply_eraser(data, rnd, Store(tmp_path / "shared"), certificate=False)
    assert info["cache_hit"] is False and not torch.equal(x, x_leace)
    assert torch.equal(x, x_fresh) and info["report"]["rank_removed"] == fresh["report"]["rank_removed"]


_WORKER = textwrap.dedent("""
    import json, sys, time
    from pathlib import Path
    import torch
    from training.data.cache import cached_erase

    def race(root, log):
        def build():
            with open(log, "a") as f:
                f.write("fit\\n")
            time.sleep(2.0)
            return torch.ones(4, 3), {"ok": True}

        return cached_erase(root, {"dataset": "toy", "eraser": "leace"}, build)

    if __name__ == "__main__":
        root = Path(sys.argv[1])
        (root.parent / "ready").write_text("1")
        x, rep, hit = race(root, Path(sys.argv[2]))
        print(json.dumps({"hit": hit, "sum": float(x.sum())}))
""")


def test_two_processes_fit_once(tmp_path: Path) -> None:
    """A worker process and this one (the worker's `race`) race for the same key (the fit takes 2 s): one fits."""
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
    x, _, hit = runpy.run_path(str(script))["race"](tmp_path / "cache", log)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    other = json.loads(out.strip().splitlines()[-1])
    assert log.read_text().count("fit") == 1
    assert sorted([hit, other["hit"]]) == [False, True]
    assert float(x.sum()) == other["sum"] == 12.0


# ---------------------------------------------------------------- the after-erasure certificate in the entry

LEACE = [*TINY, "eraser=leace", "certificate=true", "eraser.fit_on=all"]


def _without_seconds(cert: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in cert.items() if k != "seconds"}


def _counting(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = erasure.certificate

    def counted(*args: Any, **kwargs: Any) -> dict[str, Any]:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(erasure, "certificate", counted)
    return calls


def test_second_seed_reuses_the_after_certificate(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = _counting(monkeypatch)
    first = result_of(run_job(job_config(tmp_path, [*LEACE, "seed=0"])))
    assert len(calls) == 2  # before (cached per dataset) and after (cached with the erased data)
    second = result_of(run_job(job_config(tmp_path, [*LEACE, "seed=1"])))
    assert len(calls) == 2  # seed 1: both from the cache
    assert second["eraser"]["cache_hit"] is True
    assert second["certificate"] == first["certificate"]  # seconds included: the same cached file
    on_disk = json.loads((Path(job_config(tmp_path, [*LEACE, "seed=1"])["paths"]["job_dir"]) / "result.json")
                         .read_text())
    assert on_disk["certificate"] == first["certificate"]
    # == a certificate computed afresh from the erased data (its timing aside)
    cfg = load_job(job_config(tmp_path, LEACE))
    data = load_dataset(cfg.dataset)
    x, _ = apply_eraser(data, cfg.eraser, Store(Path(cfg.paths.cache_dir)), certificate=False)
    fresh = json.loads(json.dumps(certify(x, data.y), default=float))  # as result.json stores it
    assert _without_seconds(fresh) == _without_seconds(second["certificate"]["after"])
    assert len(calls) == 3


def test_cached_certificate_is_keyed_by_labels_and_rebuilt_when_corrupt(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    cfg = load_job(job_config(tmp_path, LEACE))
    data = load_dataset(cfg.dataset)
    cache = Path(cfg.paths.cache_dir)
    x, _ = apply_eraser(data, cfg.eraser, Store(cache), certificate=False)
    key = cache_key(data, "leace", cfg.eraser.options)
    entry = cache / "erased" / key_hash(key)
    calls = _counting(monkeypatch)
    cert = certify_erased(x, data.y, key, Store(cache))
    (stored,) = entry.glob("certificate-*.json")
    assert certify_erased(x, data.y, key, Store(cache)) == cert and len(calls) == 1
    # other labels: another certificate, never the cached one
    other = certify_erased(x, data.y.roll(1), key, Store(cache))
    assert len(calls) == 2 and len(list(entry.glob("certificate-*.json"))) == 2
    assert _without_seconds(other) != _without_seconds(cert)
    for damage in ("{not json", "[1, 2]"):
        stored.write_text(damage)
        caplog.clear()
        with caplog.at_level(logging.WARNING):
            again = certify_erased(x, data.y, key, Store(cache))
        assert len(caplog.records) == 1 and str(stored) in caplog.text
        assert _without_seconds(again) == _without_seconds(json.loads(json.dumps(cert, default=float)))
    assert len(calls) == 4
    assert certify_erased(x, data.y, key, Store(cache)) == json.loads(stored.read_text())  # rewritten, used again
    assert len(calls) == 4
    # without a complete erased-data entry (an unwritable cache) the certificate is computed and nothing written
    certify_erased(data.x, data.y, key, Store(tmp_path / "no entry"))
    certify_erased(data.x, data.y, key, Store(tmp_path / "no entry"))
    assert len(calls) == 6 and not (tmp_path / "no entry").exists()
