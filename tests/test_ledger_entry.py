"""The multirun ledger's entry (training/common/ledger_entry.py): decoded once, entries of older versions read as they
were written, and a file that is not an entry is one warning naming it, never a traceback."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from training.common.ledger_entry import LedgerEntry, LedgerEntryError, read_ledger

# What the callback wrote before the entry was a type (the keys in this order; error/reason only when set).
OLDER = [{"num": 0, "job_dir": "/r/a", "seconds": 1.25, "status": "done"},
         {"num": 1, "job_dir": "/r/b", "seconds": 0.5, "status": "skipped", "reason": "done by another run"},
         {"num": 2, "job_dir": "/r/c", "seconds": 2.0, "status": "failed", "error": "ValueError: bad"}]


@pytest.mark.parametrize("raw", OLDER)
def test_an_older_entry_reads_and_writes_back_byte_for_byte(raw: dict) -> None:
    entry = LedgerEntry.from_json(raw)
    assert json.dumps(entry.to_json()) == json.dumps(raw)
    assert entry.done_by_another_run == (raw["num"] == 1)


def test_a_hand_written_entry_without_seconds_reads() -> None:
    entry = LedgerEntry.from_json({"num": 1, "job_dir": "/r/x", "status": "failed", "error": "ValueError: boom"})
    assert (entry.seconds, entry.error, entry.file_name) == (None, "ValueError: boom", "job-00001.json")


@pytest.mark.parametrize(("raw", "why"), [
    ([1, 2], "a JSON object expected, not list"),
    ({"num": 3, "job_dir": "/r/d"}, "it lacks status"),
    ({"num": 3, "job_dir": "/r/d", "status": "finished"}, "status='finished' is not allowed"),
    ({"num": "3", "job_dir": "/r/d", "status": "done"}, "num='3' is not allowed"),
    ({"num": 3, "job_dir": None, "status": "done"}, "job_dir=None is not allowed"),
])
def test_what_is_not_an_entry_is_refused_in_one_line(raw: object, why: str) -> None:
    with pytest.raises(LedgerEntryError, match=why) as err:
        LedgerEntry.from_json(raw)
    assert "\n" not in str(err.value)


def test_a_corrupt_file_in_a_ledger_is_a_warning_naming_it_and_the_rest_counts(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    from training.cli.ledger import summary_line

    for raw in OLDER:
        (tmp_path / f"job-{raw['num']:05d}.json").write_text(json.dumps(raw))
    (tmp_path / "job-00003.json").write_text('{"num": 3, "job_dir": "/r/d"')  # truncated
    (tmp_path / "job-00004.json").write_text(json.dumps({"num": 4, "job_dir": "/r/e"}))  # no status
    with caplog.at_level(logging.WARNING):
        entries = read_ledger(tmp_path)
    assert [e.num for e in entries] == [0, 1, 2]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "job-00003.json" in warned[0] and "job-00004.json: it lacks status" in warned[1]
    assert "3/5 jobs ran: 1 done, 1 skipped (1 done by another run), 1 failed, 2 not run" in summary_line(entries, 5)
