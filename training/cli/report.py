"""How `python -m training.run` reports a user error: one line on stderr, the same line in the job's run.log,
exit code 2; `HYDRA_FULL_ERROR=1` shows the traceback as well."""

from __future__ import annotations

import functools
import logging
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from hydra.errors import CompactHydraException

from training.app.schema import ConfigError
from training.common import env
from training.errors import UserError
from training.errors import user_error_line as _line

log = logging.getLogger("training.run")
EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # 128 + SIGINT, as a shell reports a Ctrl-C


class SweepJobFailed(UserError, CompactHydraException):
    """A multirun job's user error, re-raised as this so that the ledger records its line and Hydra, which prints a
    CompactHydraException as its message alone, ends the sweep with that line instead of a traceback."""


def user_error_line(err: BaseException) -> str | None:
    """One line for a user error (missing/corrupt data, bad config value, unwritable path, config mismatch)."""
    return _line(err, (ConfigError,))


def to_run_log(level: int, msg: str, exc: BaseException | None = None) -> None:
    """Write to the job's log files only (run.log), not the console."""
    exc_info = (type(exc), exc, exc.__traceback__) if exc is not None else None
    record = log.makeRecord(log.name, level, __file__, 0, msg, (), exc_info)
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handle(record)


_log_file_failed = False  # a log file could not be written in this process (said once)


class RunLog(logging.FileHandler):
    """The job's run.log (conf/config.yaml hydra.job_logging): opened at its first record, and a file that cannot
    be opened (a read-only archive of finished jobs) is one warning through `handleError`, never an exception
    that stops the job or the sweep."""

    def __init__(self, filename: str, mode: str = "a", encoding: str | None = None) -> None:
        super().__init__(filename, mode, encoding, delay=True)

    def emit(self, record: logging.LogRecord) -> None:
        if self.stream is None:
            try:
                self.stream = self._open()
            except OSError:
                self.handleError(record)
                return
        super().emit(record)


def quiet_log_file_errors() -> None:
    """A log file (the job's run.log) that cannot be written, e.g. on a full disk, is said in one line and dropped,
    instead of logging's `--- Logging error ---` traceback for every record (hundreds of lines in a multirun)."""
    for handler in logging.getLogger().handlers:
        if isinstance(handler, logging.FileHandler):
            handler.handleError = functools.partial(_drop_log_file, handler)  # type: ignore[method-assign]


def _drop_log_file(handler: logging.FileHandler, record: logging.LogRecord) -> None:
    global _log_file_failed
    err = sys.exc_info()[1]
    if not isinstance(err, OSError):
        logging.FileHandler.handleError(handler, record)
        return
    logging.getLogger().removeHandler(handler)
    if not _log_file_failed and not (record.name == log.name and record.levelno >= logging.ERROR):  # not for the
        # job's own error line (`to_run_log`): stderr says it, an unwritable run.log adds nothing to it
        _log_file_failed = True
        why = err.strerror or type(err).__name__
        print(f"warning: cannot write the log file {handler.baseFilename} ({why.lower()}): the log goes to the "
              "console only (log files this process cannot write later are dropped without a word); free space or "
              "point paths.out_dir elsewhere", file=sys.stderr, flush=True)


def exit_user_error(line: str, err: BaseException | None = None) -> NoReturn:
    """Print `error: <line>` on stderr (and the traceback with HYDRA_FULL_ERROR=1), exit with code 2."""
    if err is not None and env.hydra_full_error():
        traceback.print_exception(err)
    print(f"error: {line}", file=sys.stderr, flush=True)
    raise SystemExit(EXIT_USER_ERROR)


def exit_interrupted(job_dir: Path, err: BaseException) -> NoReturn:
    """Ctrl-C on a job: one line saying what was kept of the job in `job_dir` and how to resume, exit 130
    (128 + SIGINT)."""
    from training.app.lifecycle import PROGRESS_FILE, SavedProgress

    try:
        saved = SavedProgress.read(job_dir / PROGRESS_FILE)
    except (OSError, ValueError):
        saved = None
    blocks = 0 if saved is None else len(saved.blocks)
    kept = (f"{blocks} finished MDL block model{'s' if blocks != 1 else ''} kept in {job_dir / PROGRESS_FILE}"
            if blocks else f"no finished MDL block to keep ({job_dir})")
    line = f"interrupted (Ctrl-C): {kept}; rerun the same command to resume"
    to_run_log(logging.WARNING, line)
    if env.hydra_full_error():
        traceback.print_exception(err)
    print(line, file=sys.stderr, flush=True)
    raise SystemExit(EXIT_INTERRUPTED)


_made_from: Path | None = None  # the topmost directory `make_run_dir` created (None: none)


def make_run_dir(run_dir: Path) -> None:
    """Make a single run's directory (before Hydra does), noting the topmost directory this creates."""
    global _made_from
    missing = [p for p in [run_dir.resolve(), *run_dir.resolve().parents] if not p.exists()]
    run_dir.mkdir(parents=True, exist_ok=True)
    _made_from = missing[-1] if missing else None


def remove_if_unused(run_dir: Path, stop: Path) -> bool:
    """Remove `run_dir` when it holds nothing but Hydra's empty log (a run refused before it did anything), and
    its parents up to `stop` that are left empty; `stop` too, and the directories above it, where this run made them
    (`make_run_dir`). True when removed."""
    try:
        entries = list(run_dir.iterdir())
    except OSError:
        return False
    if any(p.is_dir() or p.suffix != ".log" or p.stat().st_size > 0 for p in entries):
        return False
    for p in entries:
        p.unlink(missing_ok=True)
    d = run_dir
    stop = stop.resolve()
    if _made_from is not None and (_made_from == stop or _made_from in stop.parents):
        stop = _made_from.parent
    while d.resolve() != stop and stop in d.resolve().parents:
        try:
            d.rmdir()
        except OSError:
            break
        d = d.parent
    return True
