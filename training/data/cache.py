"""On-disk cache of erased datasets (`<root>/erased/<hash>/{data.pt, report.json, manifest.json}`) and fitted
erasers (`<root>/erasers/<hash>.pt`); the harness decides where the eraser library's results are kept.

hash = sha256 of the canonical JSON of the caller's key plus `code_version()` (a hash of the erasure/ sources, so
editing an eraser invalidates old entries). A file lock makes concurrent jobs fit once (the second waits, logging on
which lock and who holds it, then hits). Files are written to temporary names and renamed; the manifest (the key,
the code version, sha256 checksums of both files) is written last. An entry is served only if its manifest names the
key and code version asked for and both files match their checksums: another key's entry under this name (a hand
copy, a rename), a partial or a corrupt one (a checksum mismatch, NaN or Inf in the data) is set aside under a name
of its own (`<hash>.set-aside-<n>`, never deleted), with one warning line, and rebuilt.

The cache is only an optimisation: when it cannot be written (a full disk, a read-only directory) one warning says
why, the partial entry is removed and the job goes on in memory. An entry it may not read (another user's, in a
shared output directory) is not corrupt: one warning names the file and its owner, and it is left as it is.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import pwd
import shutil
import stat
from collections.abc import Callable, Mapping
from contextlib import ExitStack
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import torch
from torch import Tensor

import erasure
import training.data.shared as shared
from training.common import interrupt
from training.common.files import atomic_write, atomic_write_text
from training.common.locks import waiting_lock

log = logging.getLogger(__name__)
CACHE_FORMAT = 1
T = TypeVar("T")


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """sha256 (16 hex digits) of every erasure/*.py file, by name and content."""
    h = hashlib.sha256()
    for path in sorted(Path(erasure.__file__).parent.glob("*.py")):
        h.update(path.name.encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:16]


def canonical(obj: Any) -> Any:
    """JSON-compatible, order-independent form of a key (mappings sorted, tuples → lists, numpy → python)."""
    if isinstance(obj, Mapping):
        return {str(k): canonical(v) for k, v in sorted(obj.items(), key=lambda kv: str(kv[0]))}
    if isinstance(obj, list | tuple):
        return [canonical(v) for v in obj]
    if isinstance(obj, np.generic):
        return obj.item()
    if obj is None or isinstance(obj, bool | int | float | str):
        return obj
    if hasattr(obj, "items"):  # e.g. OmegaConf DictConfig
        return canonical(dict(obj.items()))
    return [canonical(v) for v in obj] if hasattr(obj, "__iter__") else str(obj)


def key_hash(key: Mapping[str, Any]) -> str:
    text = json.dumps({"key": canonical(key), "code": code_version(), "format": CACHE_FORMAT},
                      sort_keys=True, separators=(",", ":"), allow_nan=True)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _cached(path: Path, done: Path, kind: str, doing: str, memo: shared.Memo | None, build: Callable[[], T],
            read: Callable[[], T], store: Callable[[T], T], own: Callable[[T], T],
            tensors: Callable[[T], list[Tensor]]) -> tuple[T, bool]:
    """(value, hit): the `kind` cache entry `path` (complete when `done` is a file) as `read()` gives it, or `build()`
    once under the entry's lock, then written by `store(value)` (which returns what a later job would load); a cache
    that fails is a warning (hit False). `memo` (a cell's store's) keeps what was loaded or stored, its `tensors`, for
    its later seeds, each job getting `own(value)`."""
    root, memo_key = path.parent, str(path.resolve())
    # another seed of the cell loaded or stored it, while the entry is still complete on disk
    if memo is not None and (found := memo.get(memo_key)) is not None and done.is_file():
        log.info("cache hit (shared in this process): %s", path)
        return own(found), True
    with ExitStack() as stack:
        try:
            root.mkdir(parents=True, exist_ok=True)
            stack.enter_context(waiting_lock(root / f"{path.name}.lock",
                                             f"the {kind} cache entry {path} (another job is fitting it)"))
        except OSError as err:
            log.warning("%s cache not used: cannot write %s (%s); %s in memory", kind, root, why(err, root), doing)
            return build(), False
        # another user's entry, or one that cannot be set aside: left as it is, in memory
        if (loaded := _load(path, read, kind, doing)) is UNREADABLE:
            return build(), False
        if loaded is not None:
            log.info("cache hit: %s", path)
            if memo is None:
                return loaded, True
            memo.put(memo_key, loaded, tensors(loaded))
            return own(loaded), True
        log.info("cache miss: %s (fitting)", path)
        value = build()
        try:
            stored = store(value)
        except (OSError, RuntimeError) as err:  # torch.save reports a full disk as RuntimeError
            interrupt.stop_behind(err)  # a signal's stop arriving during the write: not a failed write
            log.warning("could not write the cache entry %s (%s); going on %s in memory", path, why(err, root), doing)
        else:
            if memo is not None:
                memo.put(memo_key, stored, tensors(stored))
        return value, False


def cached_erase(cache_root: str | os.PathLike[str], key: Mapping[str, Any],
                 build: Callable[[], tuple[Tensor, dict[str, Any]]], memo: shared.Memo | None = None
                 ) -> tuple[Tensor, dict[str, Any], bool]:
    """(erased x, report, hit): `<cache_root>/erased/<hash>/` loaded, or `build()` once and stored (`_cached`)."""
    entry = Path(cache_root) / "erased" / key_hash(key)

    def store(value: tuple[Tensor, dict[str, Any]]) -> tuple[Tensor, dict[str, Any]]:
        try:
            _store(entry, key, *value)
        except (OSError, RuntimeError):
            shutil.rmtree(entry, ignore_errors=True)  # a partial entry is removed
            raise
        # what a later job would load from the entry: the stored tensor and the report as report.json has it
        return value[0].detach().cpu().contiguous(), json.loads(_report_text(value[1]))

    (x, report), hit = _cached(entry, entry / "manifest.json", "erased-data", "erasing", memo, build,
                               lambda: _read(entry, key), store, lambda v: (v[0], shared.fresh(v[1])),
                               lambda v: [v[0]])
    return x, report, hit


def cached_eraser(cache_root: str | os.PathLike[str], key: Mapping[str, Any],
                  build: Callable[[], erasure.Eraser], memo: shared.Memo | None = None) -> tuple[erasure.Eraser, bool]:
    """(fitted eraser, hit): `<cache_root>/erasers/<hash>.pt` (written by `Eraser.save`: one rename) or `build()`
    once, then stored (`_cached`; `eraser.after_augment` needs the object itself)."""
    path = Path(cache_root) / "erasers" / f"{key_hash(key)}.pt"

    def read() -> erasure.Eraser:
        eraser = erasure.load(path)
        if eraser.name != key.get("eraser", eraser.name):
            raise ValueError(f"holds a {eraser.name} eraser, not {key.get('eraser')}")
        return eraser

    def store(eraser: erasure.Eraser) -> erasure.Eraser:
        eraser.save(path)  # what a later job would load from the file: its state on the CPU
        return type(eraser)({k: v.detach().cpu() for k, v in eraser.state.items()}, shared.fresh(eraser.info))

    # a job's own eraser object on the shared one's tensors (its own state and info dicts)
    return _cached(path, path, "fitted-eraser", "fitting", memo, build, read, store,
                   lambda e: type(e)(dict(e.state), shared.fresh(e.info)), lambda e: list(e.state.values()))


def _report_text(report: dict[str, Any]) -> str:
    return json.dumps(report, indent=1, default=str)


def why(err: BaseException, where: Path) -> str:
    """What went wrong with a write, naming the cause (torch.save reports a full disk as `unexpected pos 704 vs 598`):
    an OSError in the exception's chain, else the free space when it is nearly none."""
    text = f"{type(err).__name__}: {err}"
    cause: BaseException | None = err
    while cause is not None:
        if isinstance(cause, OSError) and cause.errno is not None:
            return text if cause is err else f"{cause.strerror} ({text})"
        cause = cause.__cause__ or cause.__context__
    try:
        free = shutil.disk_usage(where).free
    except OSError:
        return text
    if free < 64 << 20:
        return f"No space left on device: {free / 2**20:.1f} MiB free on {where} ({text})"
    return text


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def _save_tensor(x: Tensor, tmp: str) -> None:
    # Through a Python file object: a full disk then raises OSError(ENOSPC) ("No space left on device"), where
    # torch.save(x, path) only says "unexpected pos 704 vs 598".
    with open(tmp, "wb") as f:
        torch.save(x, f)
        f.flush()
        os.fsync(f.fileno())


def _store(entry: Path, key: Mapping[str, Any], x: Tensor, report: dict[str, Any]) -> None:
    if entry.exists():
        shutil.rmtree(entry)
    entry.mkdir(parents=True)
    atomic_write(entry / "data.pt", functools.partial(_save_tensor, x.detach().cpu().contiguous()))
    atomic_write_text(entry / "report.json", _report_text(report))
    manifest = {"format": CACHE_FORMAT, "code_version": code_version(), "key": canonical(key),
                "shape": list(x.shape), "dtype": str(x.dtype).replace("torch.", ""),
                "sha256": {"data.pt": _sha256(entry / "data.pt"), "report.json": _sha256(entry / "report.json")}}
    atomic_write_text(entry / "manifest.json", json.dumps(manifest, indent=1))


def owner(path: Path) -> str:
    """The user name owning `path` (its uid when the name is unknown here), or "?" when it cannot be stat'ed."""
    try:
        uid = path.stat().st_uid
    except OSError:
        return "?"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def unreadable_line(entry: Path, err: OSError, what: str, instead: str) -> str:
    """One line for a cache entry this process may not read: which file, its mode and owner, and what to do."""
    path = Path(err.filename) if err.filename else entry
    try:
        mode = f"mode {stat.filemode(path.stat().st_mode)}, "
    except OSError:
        mode = ""
    return (f"{what} {path} is not readable ({err.strerror or err}; {mode}owner {owner(path)}): left as it is, "
            f"{instead}; to share it, its owner runs `chmod -R g+rX {entry}` (and works with `umask 002`), or "
            "point paths.cache_dir at a directory of your own")


UNREADABLE: Any = object()  # `_load`: the entry exists but this process may not read it


def _key_text(key: Any) -> str:
    return json.dumps(key, sort_keys=True, separators=(",", ":"), allow_nan=True)


def set_aside(path: Path) -> Path | None:
    """Rename a cache entry that is not served (another key's, another code version's, damaged) to a name of its own
    beside it, `<name>.set-aside-<n>`, never over another; None (nothing renamed) when it cannot be renamed."""
    for n in range(1, 1000):
        aside = path.with_name(f"{path.name}.set-aside-{n}")
        if aside.exists() or aside.is_symlink():
            continue
        try:
            path.rename(aside)
        except OSError:
            return None
        return aside
    return None


def _read(entry: Path, key: Mapping[str, Any]) -> tuple[Tensor, dict[str, Any]]:
    """The stored erased-data entry of `key`; ValueError unless it is that entry, whole: its manifest of this format,
    this code version, `key`, and the sha256 of both its files (a copy or rename of another key's entry, or a damaged
    file, is never served)."""
    manifest = json.loads((entry / "manifest.json").read_text())
    if manifest.get("format") != CACHE_FORMAT or manifest.get("code_version") != code_version():
        raise ValueError(f"written by format {manifest.get('format')!r}, code version "
                         f"{manifest.get('code_version')!r}, not {CACHE_FORMAT}, {code_version()!r}")
    if _key_text(manifest.get("key")) != _key_text(canonical(key)):
        raise ValueError(f"it holds the entry of another key ({_key_text(manifest.get('key'))[:200]})")
    for name in ("data.pt", "report.json"):
        if _sha256(entry / name) != manifest["sha256"][name]:
            raise ValueError(f"checksum mismatch for {name}")
    x = torch.load(entry / "data.pt", map_location="cpu", weights_only=True)
    report = json.loads((entry / "report.json").read_text())
    if list(x.shape) != manifest["shape"] or str(x.dtype).replace("torch.", "") != manifest["dtype"]:
        raise ValueError("stored tensor does not match the manifest")
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ValueError("stored data holds NaN or Inf")  # e.g. cached by a version that did not check
    return x, report


def _load(path: Path, read: Callable[[], T], kind: str, doing: str) -> T | None:
    """`read()` of the entry at `path`; None when absent or not that entry whole (logged and set aside); UNREADABLE
    when it may not be read (a permission, an I/O error) or could not be set aside (logged, left as it is)."""
    unreadable = functools.partial(unreadable_line, what=f"{kind} cache entry", instead=f"{doing} in memory")
    try:
        if not path.exists():
            return None
    except OSError as err:  # the cache directory itself is not searchable
        log.warning("%s", unreadable(path, err))
        return UNREADABLE
    try:
        return read()
    except Exception as err:  # noqa: BLE001 - any failure to parse means the entry cannot be trusted
        if isinstance(err, OSError) and not isinstance(err, FileNotFoundError | IsADirectoryError |
                                                           NotADirectoryError):
            log.warning("%s", unreadable(path, err))  # unreadable is not corrupt: never delete it
            return UNREADABLE
        aside = set_aside(path)
        if aside is None:
            log.warning("cache entry %s is partial or corrupt (%s: %s) and cannot be set aside: left as it is, "
                        "%s in memory", path, type(err).__name__, err, doing)
            return UNREADABLE
        log.warning("cache entry %s is partial or corrupt (%s: %s): set aside as %s, rebuilding", path,
                    type(err).__name__, err, aside.name)
        return None
