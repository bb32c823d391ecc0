"""Progress off a terminal is a log line at a modest interval, not thousands of carriage returns."""

from __future__ import annotations

import io
import logging
import sys

import pytest
from tqdm.auto import tqdm

from training.common.progress import LogProgress, progress_bar


def test_off_a_terminal_progress_is_periodic_log_lines(monkeypatch: pytest.MonkeyPatch,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    stderr = io.StringIO()
    monkeypatch.setattr(sys, "stderr", stderr)  # not a terminal (a SLURM or Hydra log file)
    monkeypatch.setenv("ERASURE_MDL_PROGRESS_SECONDS", "0")
    bar = progress_bar(total=3, desc="2 models", unit="model")
    assert isinstance(bar, LogProgress)
    with caplog.at_level(logging.INFO, logger="progress"):
        for _ in range(3):
            bar.set_postfix(step=7)
            bar.update(1)
        bar.close()
        lines = [r.getMessage() for r in caplog.records if r.name == "progress"]
        caplog.clear()
        monkeypatch.setenv("ERASURE_MDL_PROGRESS_SECONDS", "3600")  # the interval limits the lines
        long = progress_bar(total=1000, desc="fit", unit="ep")
        for _ in range(1000):
            long.update(1)
        long.close()
    assert [r for r in caplog.records if r.name == "progress"] == []  # a short run logs nothing
    assert lines[0].startswith("2 models: 1/3 model") and lines[-1].startswith("2 models: 3/3 model")
    assert all("\r" not in line and line.endswith("(step=7)") for line in lines)
    assert stderr.getvalue() == ""  # nothing written as a bar


def test_on_a_terminal_it_is_a_tqdm_bar_and_disable_gives_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stderr", Tty())
    bar = progress_bar(total=2, desc="fit")
    assert isinstance(bar, tqdm)
    bar.close()
    off = progress_bar(total=2, desc="fit", disable=True)
    assert not isinstance(off, (tqdm, LogProgress))
    off.update(1)
    off.close()
