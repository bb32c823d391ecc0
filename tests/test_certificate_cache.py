"""The after-erasure certificate is cached with its erased-data entry: seeds of a fit_on=all cell reuse it."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

import erasure
from tests.helpers import TINY, job_config, result_of
from training.app.tasks import load_job
from training.data import load_dataset
from training.data.cache import key_hash
from training.inputs.erase import apply_eraser, cache_key, certify, certify_erased
from training.inputs.store import Store
from training.tasks.mdl.job import run_job

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


def test_no_entry_no_certificate_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a complete erased-data entry (an unwritable cache) the certificate is computed and nothing written."""
    cfg = load_job(job_config(tmp_path, LEACE))
    data = load_dataset(cfg.dataset)
    calls = _counting(monkeypatch)
    key = cache_key(data, "leace", cfg.eraser.options)
    certify_erased(data.x, data.y, key, Store(tmp_path / "cache"))
    certify_erased(data.x, data.y, key, Store(tmp_path / "cache"))
    assert len(calls) == 2 and not (tmp_path / "cache").exists()
