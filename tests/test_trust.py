"""Data identity, code identity and where a job writes (issue 30, bugs 2-6):

- a finished job whose data fingerprint differs from the data now on disk is not reused (and the aggregate never
  averages two fingerprints in a cell; --strict refuses);
- the code's commit is read whoever owns the checkout (git's "dubious ownership");
- every part of a job's path built from config stays inside paths.out_dir;
- hydra.job.chdir=true with a relative paths.out_dir writes where the command was started;
- a result.json without its mdl section is rerun, saying so.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.helpers import ENV, REPO, TINY, job_config
from training.app.provenance import code_provenance, head_from_files


# --- bug 3: the commit of a checkout another user owns ------------------------------------------------------------
def _git(repo: Path, *args: str) -> str:
    env = {**os.environ, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t",
           "GIT_COMMITTER_EMAIL": "t@t"}
    return subprocess.run(["git", "-c", f"safe.directory={repo}", "-C", str(repo), *args], capture_output=True,
                          text=True, check=True, env=env).stdout.strip()


def _repo(path: Path) -> str:
    path.mkdir()
    _git(path, "init", "-q", "-b", "main")
    (path / "a.txt").write_text("a\n")
    _git(path, "add", "a.txt")
    _git(path, "commit", "-q", "-m", "one")
    return _git(path, "rev-parse", "HEAD")


def test_3_commit_read_from_files_loose_packed_and_worktree(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    sha = _repo(repo)
    assert head_from_files(repo) == sha  # a loose ref
    _git(repo, "pack-refs", "--all")
    assert not (repo / ".git/refs/heads/main").exists()
    assert head_from_files(repo) == sha  # packed-refs
    _git(repo, "worktree", "add", "-q", "-b", "side", str(tmp_path / "wt"))
    (tmp_path / "wt" / "b.txt").write_text("b\n")
    _git(tmp_path / "wt", "add", "b.txt")
    _git(tmp_path / "wt", "commit", "-q", "-m", "two")
    side = _git(tmp_path / "wt", "rev-parse", "HEAD")
    assert side != sha and head_from_files(tmp_path / "wt") == side  # a worktree: .git is a file
    _git(repo, "checkout", "-q", "--detach")
    assert head_from_files(repo) == sha  # a detached HEAD


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs root to chown a repo to nobody")
def test_3_checkout_owned_by_another_user_still_gives_the_commit(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    repo = tmp_path / "repo"
    sha = _repo(repo)
    shutil.chown(tmp_path, "nobody")
    for p in [repo, *repo.rglob("*")]:
        os.chown(p, 65534, 65534, follow_symlinks=False)
    env = {k: v for k, v in os.environ.items() if k not in ("SUDO_UID", "GIT_CONFIG_GLOBAL")}
    plain = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True, env=env)
    assert plain.returncode != 0 and "dubious ownership" in plain.stderr  # git itself refuses it
    with caplog.at_level(logging.WARNING, logger="training.app.provenance"):
        code = code_provenance.__wrapped__(repo)
    assert code["commit"] == sha
    assert code["dirty"] is None  # git status is refused: not guessed
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "dubious ownership" in warning and "safe.directory" in warning, warning
    assert "missing, failing or slow" not in warning


def test_3_unreadable_head_says_why(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    repo = tmp_path / "repo"
    _repo(repo)
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/nowhere\n")
    with caplog.at_level(logging.WARNING, logger="training.app.provenance"):
        code = code_provenance.__wrapped__(repo)
    assert code["commit"] is None
    assert "refs/heads/nowhere has no commit" in caplog.text
