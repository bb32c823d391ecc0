"""The lock holder's note (training/common/locks.py `Holder`) is decoded once: a note another process (of any
version) left is read as far as it goes, and one that is not a note says "holder unknown", never a traceback."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path

import pytest

from training.common.locks import Holder, describe_holder, holder_path


@pytest.mark.parametrize("text", [None, "", "{not json", "[1, 2]", "{}"])
def test_no_note_or_not_a_note_is_holder_unknown(tmp_path: Path, text: str | None) -> None:
    lock = tmp_path / "x.lock"
    if text is not None:
        holder_path(lock).write_text(text)
    assert describe_holder(lock) == "holder unknown"


def test_a_partial_note_is_read_as_far_as_it_goes(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    holder_path(lock).write_text(json.dumps({"pid": 5, "since": "yesterday", "extra": 1}))
    assert describe_holder(lock) == "held since ? by pid 5 on ?"


def test_this_process_s_note_round_trips(tmp_path: Path) -> None:
    lock = tmp_path / "x.lock"
    mine = Holder.mine()
    holder_path(lock).write_text(json.dumps(dataclasses.asdict(mine)))
    assert Holder.read(lock) == mine
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(mine.since))
    assert describe_holder(lock) == f"held since {when} by pid {mine.pid} on {mine.host}"
