"""How `python -m training.run` reports a user error: one line on stderr, the same line in the job's run.log,
exit code 2; `HYDRA_FULL_ERROR=1` shows the traceback as well."""

from __future__ import annotations

import difflib
import functools
import logging
import re
import sys
import traceback
from pathlib import Path
from typing import NoReturn

from hydra.errors import (
    CompactHydraException,
    ConfigCompositionException,
    MissingConfigException,
    OverrideParseException,
)
from omegaconf import DictConfig, ValueNode
from omegaconf.errors import InterpolationKeyError, OmegaConfBaseException

from training.app.schema import CONF_DIR, ConfigError
from training.common import env
from training.errors import UserError, first_line
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


def hydra_error_line(err: BaseException) -> str | None:
    """One line, naming the key and what to write, for a mistake on the command line that Hydra or OmegaConf found
    before any job ran: an option of a config group or a key that does not exist, a sweep without -m, an override
    that does not parse or merge, an interpolation that does not resolve. None for anything else (a traceback)."""
    chain = [err]
    while (cause := chain[-1].__cause__ or chain[-1].__context__) is not None and len(chain) < 10:
        chain.append(cause)
    if (said := next((user_error_line(e) for e in chain if isinstance(e, UserError)), None)) is not None:
        return said  # the harness's refusal, raised while Hydra resolved the config (an unknown task, a bad seeds)
    first = first_line(err)
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options is not None:
        group, _, name = err.missing_cfg_file.rpartition("/")
        close = difflib.get_close_matches(name, err.options, n=1)
        return (f"{group}={name} is not an option{f' (did you mean {close[0]}?)' if close else ''}: {group} is one "
                f"of {', '.join(err.options)}")
    if isinstance(err, ConfigCompositionException):
        if (swept := re.match(r"(?:Ambiguous value for argument|Sweep parameters) '(.+?)=(.*?)'", first)) is not None:
            key, value = swept.groups()
            list_form = "seeds=[0,1] for one job training those seeds" if key == "seed" else f"{key}=[a,b] for a list"
            return (f"{key}={value} sweeps over several values, which only a multirun does: add -m (one job per "
                    f"value), give {key} one value, or write {list_form}")
        cause = err.__cause__
        if isinstance(cause, OmegaConfBaseException) and cause.full_key:
            parent, key = cause.parent_node, str(cause.key)
            if "not in" in str(cause) and isinstance(parent, DictConfig):  # Key 'widht' is not in struct
                where = cause.full_key.rpartition(".")[0]
                close = difflib.get_close_matches(key, [str(k) for k in parent], n=1)
                keys = ", ".join(str(k) for k in parent if where or k != "hydra")
                value = str(err).rpartition(f"+{cause.full_key}=")[2].strip()  # Hydra: "...use +arch.widht=64"
                return f"{cause.full_key} is not a config key: " + (
                    f"did you mean {where + '.' if where else ''}{close[0]}? (write {where + '.' if where else ''}"
                    f"{close[0]}={value})" if close
                    else f"the keys of {where or 'the config'} are {keys} (+{cause.full_key}=... adds a new key)")
            node = parent._get_node(key) if isinstance(parent, DictConfig) else None
            kind = {"BooleanNode": "true or false", "IntegerNode": "an integer", "FloatNode": "a number"}.get(
                type(node).__name__, "a value of its type") if isinstance(node, ValueNode) else "a value of its type"
            given = first.removeprefix("Error merging override ")
            return f"{given} is not allowed ({str(cause).splitlines()[0]}): give {cause.full_key} {kind}"
    if isinstance(err, OverrideParseException):
        given, why = first.removeprefix("Error parsing override "), str(err).strip().splitlines()[1:2]
        return (f"{given} cannot be parsed ({'; '.join(why)}): write it as "
                "https://hydra.cc/docs/advanced/override_grammar/basic shows")
    if isinstance(err, CompactHydraException):  # Hydra's own one-message errors (a sweep over hydra.*, ...)
        return first + (f": {str(err.__cause__).splitlines()[0]}" if err.__cause__ is not None else "")
    raised = next((e for e in chain if not isinstance(e, OmegaConfBaseException)), None)  # by a resolver
    frames = [f for f, _ in traceback.walk_tb(raised.__traceback__)] if raised is not None else []
    if isinstance(err, OmegaConfBaseException) and err.full_key and \
            all(str(f.f_globals.get("__name__")).startswith("omegaconf") for f in frames[-1:]):  # not a bug here
        if isinstance(err, InterpolationKeyError):
            missing = (re.findall(r"'(.+?)'", first) or [""])[0]
            top = missing.split(".")[0]
            if top and (CONF_DIR / top).is_dir():  # ~dataset: a group the job needs removed
                options = ", ".join(sorted(p.stem for p in (CONF_DIR / top).glob("*.yaml")))
                return f"the config has no {top} ({err.full_key} needs {missing}): choose one of its " \
                       f"options ({options}) rather than removing it: {top}=<option>"
        env_var = re.search(r"Environment variable '(.+?)' not found", first)
        fix = (f"set {env_var.group(1)}, or give a default: ${{oc.env:{env_var.group(1)},<default>}}" if env_var
               else "write a value, or an interpolation of a key the config has")
        return f"{err.full_key} cannot be resolved ({first}): {fix}"
    return None


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
