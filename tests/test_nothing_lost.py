"""Nothing a user finished is overwritten without force=true.

- a result.json written by newer code (a schema_version above this code's) is refused in one line, never recomputed;
- a finished result whose data changed is moved aside (result.data-<fingerprint>.json) before the job runs again,
  and the aggregate reads it only when asked (--set-aside);
- the same data in another encoding (a re-gzipped file) is the same data: SKIP.
"""

from __future__ import annotations

import gzip
import json
import logging
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import result_of
from tests.test_trust import _fashion_fixture, _run, _shuffle_labels
from training.app.result_types import RESULT_SCHEMA
from training.errors import UserError


def _result_path(outcome_result: dict[str, Any]) -> Path:
    return Path(outcome_result["job_dir"]) / "result.json"


def test_a_result_of_a_newer_schema_is_refused_in_one_line_and_kept(tmp_path: Path) -> None:
    from tests.helpers import TINY, job_config
    from training.tasks.mdl.job import run_job

    first = run_job(job_config(tmp_path, TINY))
    path = _result_path(result_of(first))
    newer = {**json.loads(path.read_text()), "schema_version": RESULT_SCHEMA + 1, "from": "newer code"}
    path.write_text(json.dumps(newer))
    with pytest.raises(UserError) as err:
        run_job(job_config(tmp_path, TINY))
    line = str(err.value)
    assert "\n" not in line and "newer code" in line and "force=true" in line, line
    assert json.loads(path.read_text()) == newer  # untouched
    forced = run_job(job_config(tmp_path, [*TINY, "force=true"]))
    assert forced.status == "done" and json.loads(path.read_text())["schema_version"] == RESULT_SCHEMA


def test_a_multirun_over_a_newer_result_is_refused_before_anything_runs(tmp_path: Path) -> None:
    import subprocess
    import sys

    from tests.helpers import ENV, REPO, TINY, job_config
    from training.tasks.mdl.job import run_job

    first = run_job(job_config(tmp_path, TINY))
    path = _result_path(result_of(first))
    newer = {**json.loads(path.read_text()), "schema_version": RESULT_SCHEMA + 1}
    path.write_text(json.dumps(newer))
    proc = subprocess.run([sys.executable, "-m", "training.run", "-m", f"paths.out_dir={tmp_path}", "logger=none",
                           *TINY, "seed=0,1"], capture_output=True, text=True, env=ENV, cwd=REPO, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    errors = [ln for ln in proc.stderr.splitlines() if ln.startswith("error") or "refused" in ln]
    assert len(errors) == 1 and "newer code" in errors[0], proc.stderr[-2000:]
    assert json.loads(path.read_text()) == newer
    assert not (path.parent.parent / "seed1" / "result.json").exists()  # nothing ran


def test_a_result_of_other_data_is_moved_aside_and_read_by_the_aggregate_only_when_asked(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from training.tasks.mdl.aggregate_collect import collect_dir

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
    from scripts import aggregate

    assert aggregate.main([str(tmp_path / "out"), "--set-aside", "--out", str(tmp_path / "t")]) == 0
    assert "runs on different data" in (tmp_path / "t" / "results.md").read_text()  # never averaged


def test_the_same_data_re_gzipped_is_the_same_data(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "data"
    _fashion_fixture(root)
    first = result_of(_run(tmp_path / "out", f"dataset.root={root}"))
    labels = root / "train-labels-idx1-ubyte.gz"
    before = labels.read_bytes()
    with gzip.open(labels, "rb") as f:
        raw = f.read()
    labels.write_bytes(gzip.compress(raw, compresslevel=1, mtime=12345))  # other bytes, the same decoded content
    assert labels.read_bytes() != before
    with caplog.at_level(logging.WARNING):
        again = _run(tmp_path / "out", f"dataset.root={root}")
    assert again.status == "skipped" and again.result == first, caplog.text
    assert not list(_result_path(first).parent.glob("result.data-*.json"))
