"""Nothing a user finished is overwritten without force=true.

- a result.json written by newer code (a schema_version above this code's), or whose schema_version is not a
  version at all, is refused in one line, never recomputed over nor read as a result;
- a finished result whose data changed is moved aside (result.data-<fingerprint>.json, a free name: never over an
  earlier one) before the job runs again, restored when that data returns, and the aggregate reads it only when
  asked (--set-aside);
- the same data in another encoding (a re-gzipped file) is the same data: SKIP.
"""

from __future__ import annotations

import gzip
import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from scripts import aggregate
from tests.helpers import ENV, REPO, TINY, job_config, result_of
from tests.test_trust import _fashion_fixture, _run, _shuffle_labels
from training.app.result_types import RESULT_SCHEMA
from training.app.results import read_result, set_aside_copies, unused_path
from training.errors import UserError
from training.tasks.mdl.aggregate_collect import collect_dir
from training.tasks.mdl.job import run_job


def _result_path(outcome_result: dict[str, Any]) -> Path:
    return Path(outcome_result["job_dir"]) / "result.json"


def test_a_result_of_a_newer_schema_is_refused_in_one_line_and_kept_by_a_job_and_a_multirun(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    first = run_job(job_config(tmp_path, TINY))
    path = _result_path(result_of(first))
    newer = {**json.loads(path.read_text()), "schema_version": RESULT_SCHEMA + 1, "from": "newer code"}
    path.write_text(json.dumps(newer))
    caplog.clear()
    with pytest.raises(UserError) as err, caplog.at_level(logging.WARNING):
        run_job(job_config(tmp_path, TINY))
    line = str(err.value)
    assert "\n" not in line and "newer code" in line and "force=true" in line, line
    assert not caplog.records, caplog.text  # the line alone: no warning saying the same before it
    assert json.loads(path.read_text()) == newer  # untouched
    proc = subprocess.run([sys.executable, "-m", "training.run", "-m", f"paths.out_dir={tmp_path}", "logger=none",
                           *TINY, "seed=0,1"], capture_output=True, text=True, env=ENV, cwd=REPO, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error") or "refused" in ln]
    assert len(errors) == 1 and "newer code" in errors[0], proc.stderr[-2000:]
    assert json.loads(path.read_text()) == newer
    assert not (path.parent.parent / "seed1" / "result.json").exists()  # the sweep refused before anything ran
    forced = run_job(job_config(tmp_path, [*TINY, "force=true"]))
    assert forced.status == "done" and json.loads(path.read_text())["schema_version"] == RESULT_SCHEMA


def test_a_result_of_other_data_is_moved_aside_and_read_by_the_aggregate_only_when_asked(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "data"
    _fashion_fixture(root)
    first = result_of(_run(tmp_path / "out", f"dataset.root={root}"))
    path = _result_path(first)
    _shuffle_labels(root / "train-labels-idx1-ubyte.gz")
    with caplog.at_level(logging.WARNING):
        again = _run(tmp_path / "out", f"dataset.root={root}")
    assert again.status == "done"
    content = first["dataset"]["fingerprint"]["content"]
    kept = path.parent / f"result.data-{content}.json"
    assert json.loads(kept.read_text()) == first  # the measurement of the old data, kept whole
    assert json.loads(path.read_text())["dataset"]["fingerprint"]["content"] != content
    assert f"kept as {kept.name}" in caplog.text
    df, results = collect_dir(tmp_path / "out")
    assert len(results) == 1 and len(df) == 1  # the aggregate ignores it ...
    df, results = collect_dir(tmp_path / "out", set_aside=True)
    assert len(results) == 2 and len(df) == 2  # ... unless asked
    assert aggregate.main([str(tmp_path / "out"), "--set-aside", "--out", str(tmp_path / "t")]) == 0
    text = (tmp_path / "t" / "results.md").read_text()
    (line,) = [ln for ln in text.splitlines() if "set aside" in ln]  # never averaged with the cell's runs
    assert line.count("seed 0") == 2 and "now: " in line, line  # the one set aside, then the current run
    assert "runs on different data" not in text  # the cell's own runs are on one data
    now = json.loads(path.read_text())["mdl"]["bits_per_sample"]
    assert f"{now:.3f}" in text, text
    assert f"{first['mdl']['bits_per_sample']:.3f}" not in text  # the cell's current number


@pytest.mark.parametrize("version", ['"3"', "2.5", "1e9", "-1", "true", "0", "null"])
def test_a_schema_version_that_is_no_version_is_kept_like_a_newer_one(tmp_path: Path, version: str) -> None:
    first = run_job(job_config(tmp_path, TINY))
    path = _result_path(result_of(first))
    text = path.read_text().replace(f'"schema_version": {RESULT_SCHEMA}', f'"schema_version": {version}', 1)
    assert text != path.read_text()
    path.write_text(text)
    with pytest.raises(UserError) as err:
        run_job(job_config(tmp_path, TINY))
    line = str(err.value)
    assert "\n" not in line and "schema_version" in line and "force=true" in line, line
    assert path.read_text() == text  # neither recomputed over nor accepted as a SKIP
    assert read_result(path, None) is None  # nor read as a result by a reader (the aggregate)


def test_data_switched_back_and_forth_or_re_gzipped_restores_each_result_and_replaces_none(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """dataset.root A -> B -> A -> B in one job directory: each return restores that data's result (SKIP), and no
    set-aside file is ever replaced. A re-gzipped first (other bytes, the same decoded content) is the same data."""
    a, b = tmp_path / "a", tmp_path / "b"
    _fashion_fixture(a)
    shutil.copytree(a, b)
    _shuffle_labels(b / "train-labels-idx1-ubyte.gz")
    on_a = result_of(_run(tmp_path / "out", f"dataset.root={a}"))
    job = _result_path(on_a).parent
    labels = a / "train-labels-idx1-ubyte.gz"
    before = labels.read_bytes()
    with gzip.open(labels, "rb") as f:
        labels.write_bytes(gzip.compress(f.read(), compresslevel=1, mtime=12345))
    assert labels.read_bytes() != before
    with caplog.at_level(logging.WARNING):
        again = _run(tmp_path / "out", f"dataset.root={a}")
    assert again.status == "skipped" and again.result == on_a, caplog.text
    assert not list(job.glob("result.data-*.json"))
    on_b = result_of(outcome := _run(tmp_path / "out", f"dataset.root={b}"))
    assert outcome.status == "done" and on_b["dataset"]["fingerprint"] != on_a["dataset"]["fingerprint"]
    for root, expected in ((a, on_a), (b, on_b)):
        with caplog.at_level(logging.WARNING):
            back = _run(tmp_path / "out", f"dataset.root={root}")
        assert back.status == "skipped" and back.result == expected, caplog.text
        assert json.loads((job / "result.json").read_text()) == expected
        assert "restored result.data-" in caplog.text
    kept = sorted(job.glob("result.data-*.json"))
    assert [json.loads(p.read_text()) for p in kept] == [on_a]  # B is result.json, A set aside, once


def test_a_set_aside_name_already_taken_gets_a_free_one(tmp_path: Path) -> None:
    first = tmp_path / "result.data-x.json"
    assert unused_path(first) == first
    first.write_text("{}")
    second = unused_path(first)
    assert second.name == "result.data-x.2.json"
    second.write_text("{}")
    assert unused_path(first).name == "result.data-x.3.json"
    (tmp_path / "result.data-xy.json").write_text("{}")  # another fingerprint's file
    assert {p.name for p in set_aside_copies(tmp_path, first.name)} == {first.name, second.name}
