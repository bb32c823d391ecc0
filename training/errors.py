"""User errors: mistakes a user fixes (a missing or corrupt data file, a bad config value, an unwritable path, a
directory holding another configuration's result). `python -m training.run` reports one of these as ONE line on
stderr (and in the job's run.log) with exit code 2, not as a traceback (`HYDRA_FULL_ERROR=1` shows it). Every message
names the file or key and says what to do. A leaf module: any layer of training/ may import it.
"""

from __future__ import annotations

import errno


class UserError(Exception):
    """Base class: the message is the whole report (one line: what is wrong, where, and what to do)."""


class ConfigError(UserError, ValueError):
    """A config value that is not allowed; the message is one line: key, value, what is allowed."""


class DataCorruptError(UserError):
    """A data file exists but cannot be read as the expected format."""


class NonFiniteError(UserError):
    """A NaN or infinity where a job needs a number (a training or validation loss, a code length, input or erased
    data, a result's MDL numbers): the job fails, nothing is written as a result. The line says where it happened."""


class Refused(UserError):
    """The job was refused before it made or changed anything (a device that is not there, a job that cannot fit
    in memory, more MDL blocks than samples): nothing ran, so a single run leaves no directory behind."""


# a path of the wrong kind: a directory where a file belongs, or a file where a directory does
WRONG_KIND = {errno.EISDIR: "{} is a directory where a file belongs", errno.EEXIST: "{} is a file where a directory "
              "belongs", errno.ENOTDIR: "a file sits where a directory of {} belongs"}
# OSErrors that are about the user's files or disk, not a bug: reported as one line like a UserError.
USER_ERRNOS = frozenset({errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT, *WRONG_KIND})


def os_error_line(err: OSError) -> str | None:
    """One line for an OSError on a named path that the user can fix (None when it is not one)."""
    if err.errno not in USER_ERRNOS or not err.filename:
        return None
    if err.errno in (errno.ENOSPC, errno.EDQUOT):
        quota = "disk quota exceeded" if err.errno == errno.EDQUOT else "no space left on device"
        return f"{quota} writing {err.filename}: free space or point paths.out_dir elsewhere"
    if err.errno in WRONG_KIND:
        return f"{WRONG_KIND[err.errno].format(err.filename)}: move it away, or choose another paths.out_dir"
    if err.errno == errno.EROFS:
        what, fix = "cannot write", "use a writable file system"
    else:
        what, fix = "no permission for", "fix its permissions"
    return f"{what} {err.filename}: {err.strerror}; {fix} or choose another paths.out_dir / paths.data_dir"


def first_line(err: BaseException) -> str:
    """The first line of `err`'s message, or its type's name when the message is empty."""
    return (str(err).strip().splitlines() or [type(err).__name__])[0]


def user_error_line(err: BaseException, extra: tuple[type[BaseException], ...] = ()) -> str | None:
    """The one line to report for a user error (`UserError`, an `extra` type, or an OSError on a path the user
    can fix), or None for anything else (a bug: shown as a traceback)."""
    if isinstance(err, (UserError, *extra)):
        return str(err).strip().replace("\n", " ")
    return os_error_line(err) if isinstance(err, OSError) else None
