"""A multirun ledger's entry: one job's status file, `<sweep dir>/.multirun/<run id>/job-<num>.json` (one per seed of a
cell of several: `job-<num>-<k>.json`, k its place among the cell's seeds). Written by the Hydra callback
(training/cli/ledger.py) wherever the job ran, read back by it and by the aggregate (failed jobs' errors). Decoded
once, here (`LedgerEntry.from_json`); a file that is not an entry is skipped with one log line naming it.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)
STATUSES = ("done", "skipped", "failed")
DONE_BY_ANOTHER_RUN = "done by another run"  # a skipped job's reason: a concurrent identical sweep finished it
ENTRY_GLOB = "job-*.json"


class LedgerEntryError(ValueError):
    """A ledger file that is not an entry; the message says what is wrong in one line."""


@dataclass(frozen=True)
class LedgerEntry:
    num: int  # hydra.job.num
    job_dir: str
    status: str  # one of STATUSES
    seconds: float | None = None  # the job's wall time (absent in hand-written entries)
    error: str | None = None  # failed: the error's line
    reason: str | None = None  # skipped: why (DONE_BY_ANOTHER_RUN), when not by an earlier run
    part: int | None = None  # which of its cell's seeds (the k-th), in a cell of several (training/common/cells.py)

    @property
    def file_name(self) -> str:
        return f"job-{self.num:05d}.json" if self.part is None else f"job-{self.num:05d}-{self.part:03d}.json"

    @property
    def done_by_another_run(self) -> bool:
        return self.reason == DONE_BY_ANOTHER_RUN

    def to_json(self) -> dict[str, Any]:
        """The file's content: the keys in the order older versions wrote them; the optional ones only when set."""
        out = {"num": self.num, "job_dir": self.job_dir, "seconds": self.seconds, "status": self.status,
               "error": self.error, "reason": self.reason, "part": self.part}
        return {k: v for k, v in out.items() if v is not None or k in ("num", "job_dir", "status")}

    @classmethod
    def from_json(cls, raw: Any) -> LedgerEntry:
        """The entry a parsed file holds (other keys are ignored); LedgerEntryError for one that is not an entry."""
        if not isinstance(raw, dict):
            raise LedgerEntryError(f"a JSON object expected, not {type(raw).__name__}")
        fields = dataclasses.fields(cls)
        missing = [f.name for f in fields if f.default is dataclasses.MISSING and f.name not in raw]
        if missing:
            raise LedgerEntryError(f"it lacks {', '.join(missing)}")
        entry = cls(**{f.name: raw[f.name] for f in fields if f.name in raw})
        entry._check()
        return entry

    def _check(self) -> None:
        wrong = [name for name, ok in (
            ("num", isinstance(self.num, int) and not isinstance(self.num, bool)),
            ("job_dir", isinstance(self.job_dir, str)),
            ("status", self.status in STATUSES),
            ("seconds", self.seconds is None or (isinstance(self.seconds, (int, float))
                                                  and not isinstance(self.seconds, bool))),
            ("error", self.error is None or isinstance(self.error, str)),
            ("reason", self.reason is None or isinstance(self.reason, str)),
            ("part", self.part is None or (isinstance(self.part, int) and not isinstance(self.part, bool)))) if not ok]
        if wrong:
            shown = ", ".join(f"{k}={getattr(self, k)!r}" for k in wrong)
            raise LedgerEntryError(f"{shown} is not allowed (num: an integer, job_dir: a path, status: one of "
                                   f"{', '.join(STATUSES)}, error/reason: text)")


def read_entry(path: Path) -> LedgerEntry | None:
    """The entry in `path`, or None (with one warning naming the file) for one that cannot be read or is not one."""
    try:
        return LedgerEntry.from_json(json.loads(Path(path).read_text()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, LedgerEntryError) as err:
        log.warning("ignoring the multirun ledger entry %s: %s", path, err)
        return None


def read_ledger(ledger: Path) -> list[LedgerEntry]:
    """The entries of one ledger directory, by file name (so by job number)."""
    return [e for path in sorted(Path(ledger).glob(ENTRY_GLOB)) if (e := read_entry(path)) is not None]
