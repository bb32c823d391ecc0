"""Data identity, code identity and where a job writes:

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

from tests.helpers import ENV, TINY, job_config, result_of
from training.app.lifecycle import Outcome
from training.app.schema import ConfigError
from training.app.tasks import load_job
from training.common.provenance import code_provenance, head_from_files
from training.tasks.mdl import refusals as precheck
from training.tasks.mdl.job import run_job


# --- the commit of a checkout another user owns -----------------------------------------------------------------------
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


def test_3_commit_read_from_files_loose_packed_and_worktree_or_why_not(tmp_path: Path,
                                                                        caplog: pytest.LogCaptureFixture) -> None:
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
    (repo / ".git" / "HEAD").write_text("ref: refs/heads/nowhere\n")  # unreadable: says why
    with caplog.at_level(logging.WARNING, logger="training.common.provenance"):
        code = code_provenance.__wrapped__(repo)
    assert code["commit"] is None
    assert "refs/heads/nowhere has no commit" in caplog.text


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
    with caplog.at_level(logging.WARNING, logger="training.common.provenance"):
        code = code_provenance.__wrapped__(repo)
    assert code["commit"] == sha
    assert code["dirty"] is None  # git status is refused: not guessed
    warning = " ".join(r.getMessage() for r in caplog.records)
    assert "dubious ownership" in warning and "safe.directory" in warning, warning
    assert "missing, failing or slow" not in warning


# --- data swapped under the same file names ---------------------------------------------------------------------------
def _idx(path: Path, arr: np.ndarray) -> None:
    head = bytes([0, 0, 8, arr.ndim]) + b"".join(int(d).to_bytes(4, "big") for d in arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(head + arr.astype(np.uint8).tobytes())


def _fashion_fixture(root: Path, n: int = 300) -> None:
    rng = np.random.default_rng(0)
    root.mkdir(parents=True)
    y = np.arange(n) % 10
    x = rng.integers(0, 60, size=(n, 28, 28)) + (y[:, None, None] * 15)  # learnable: brightness says the class
    _idx(root / "train-images-idx3-ubyte.gz", x)
    _idx(root / "train-labels-idx1-ubyte.gz", y)


SMALL = [*TINY, "dataset=fashion_mnist", "dataset.download=false", "mdl.num_blocks=2", "mdl.val_size=64"]


def _run(out: Path, *overrides: str) -> Outcome:
    return run_job(job_config(out, [*SMALL, *overrides]))


def _shuffle_labels(labels: Path) -> None:
    """The same label bytes in another order, under the same file name (an IDX label file, gzipped)."""
    with gzip.open(labels, "rb") as f:
        raw = bytearray(f.read())
    body = np.frombuffer(bytes(raw[8:]), dtype=np.uint8).copy()
    np.random.default_rng(1).shuffle(body)
    raw[8:] = body.tobytes()
    with gzip.open(labels, "wb") as f:
        f.write(bytes(raw))


def test_2_swapped_labels_under_the_same_names_rerun_the_job_and_unreadable_data_is_reused(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    root = tmp_path / "data"
    _fashion_fixture(root)
    first = result_of(_run(tmp_path / "out", f"dataset.root={root}"))
    again = _run(tmp_path / "out", f"dataset.root={root}")
    assert again.status == "skipped" and result_of(again)["provenance"] == first["provenance"]  # unchanged: SKIP
    images = root / "train-images-idx3-ubyte.gz"
    readable = images.read_bytes()
    images.write_bytes(b"not gzip")  # unreadable now: nothing to compare, the result is reused with a warning
    with caplog.at_level(logging.WARNING):
        again = _run(tmp_path / "out", f"dataset.root={root}")
    assert again.status == "skipped" and result_of(again)["provenance"] == first["provenance"]
    assert "cannot check the data" in caplog.text
    images.write_bytes(readable)
    caplog.clear()
    _shuffle_labels(root / "train-labels-idx1-ubyte.gz")
    with caplog.at_level(logging.WARNING):
        outcome = _run(tmp_path / "out", f"dataset.root={root}")
    swapped = result_of(outcome)
    assert outcome.status == "done"
    assert swapped["dataset"]["fingerprint"] != first["dataset"]["fingerprint"]
    assert swapped["mdl"]["bits_per_sample"] != first["mdl"]["bits_per_sample"]
    lines = [r.getMessage() for r in caplog.records if "not reusing" in r.getMessage()]
    assert len(lines) == 1 and "data fingerprint" in lines[0] and str(root) in lines[0], lines


def test_2_another_copy_of_the_data_is_reused_only_when_identical(tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    _fashion_fixture(a)
    shutil.copytree(a, b)  # the same files elsewhere: the same data, reused
    _fashion_fixture(c, n=310)  # other data under the same names
    assert _run(tmp_path / "out", f"dataset.root={a}").status == "done"
    assert _run(tmp_path / "out", f"dataset.root={b}").status == "skipped"
    with caplog.at_level(logging.WARNING):
        other = _run(tmp_path / "out", f"dataset.root={c}")
    assert other.status == "done" and result_of(other)["dataset"]["n"] == 310
    assert "data fingerprint" in caplog.text


# --- ugly: a result.json with a valid hash but no mdl section -----------------------------------------------------
def test_6_result_without_mdl_section_is_rerun_with_one_line_after_the_checks_a_new_job_gets(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished result found stale (here incomplete; likewise other data) runs the job again: the data checks
    (blocks, storage, memory) run on it as on any job that runs, though the precheck first took it for finished."""
    cfg = job_config(tmp_path, TINY)
    done = result_of(run_job(cfg))
    path = Path(done["job_dir"]) / "result.json"
    stored = json.loads(path.read_text())
    del stored["mdl"]
    path.write_text(json.dumps(stored))

    def refuse(*_: object) -> None:
        raise ConfigError("memory check ran")

    with monkeypatch.context() as m, pytest.raises(ConfigError, match="memory check ran"):
        m.setattr(precheck, "check_memory", refuse)
        run_job(cfg)
    assert "mdl" not in json.loads(path.read_text())  # refused: nothing rewritten
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        outcome = run_job(cfg)
    again = result_of(outcome)
    assert outcome.status == "done"
    assert again["mdl"]["bits_per_sample"] == done["mdl"]["bits_per_sample"]
    assert "mdl" in json.loads(path.read_text())
    lines = [r.getMessage() for r in caplog.records if "not reusing" in r.getMessage()]
    assert len(lines) == 1 and "no mdl section (incomplete)" in lines[0], lines


# --- no path part built from config leaves paths.out_dir --------------------------------------------------------------
ESCAPES = [  # (override, the key the refusal names)
    ("paths.cell=../../../../../../esc_cell", "paths.cell"),
    ("paths.cell=a/b", "paths.cell"),
    ("paths.job_subdir=../../esc_sub", "paths.job_subdir"),
    ("paths.job_subdir=/tmp/esc_abs", "paths.job_subdir"),
    ("paths.job_subdir=a//b", "paths.job_subdir"),
    ("+paths.by_task.mdl=../../esc_task", "paths.by_task"),
    ("dataset.tag=../esc_tag", "dataset.tag"),
    ("arch.tag=x/../../esc_arch", "arch.tag"),
]


def _tree(root: Path) -> set[Path]:
    return {p for p in root.rglob("*")}


@pytest.mark.parametrize(("override", "key"), ESCAPES)
def test_4_each_path_part_is_refused_in_one_line(tmp_path: Path, override: str, key: str) -> None:
    out = tmp_path / "deep" / "er" / "out"
    out.mkdir(parents=True)
    before = _tree(tmp_path)
    with pytest.raises(ConfigError) as err:
        run_job(job_config(out, [*TINY, override]))
    line = str(err.value)
    assert "\n" not in line and line.startswith(f"{key}=") and "is not allowed" in line, line
    assert _tree(tmp_path) == before  # nothing written, inside or outside out_dir
    assert not Path("/tmp/esc_abs").exists()


@pytest.mark.parametrize("override", ["paths.job_subdir=mine/sub", "paths.cell=c_mine", "dataset.tag=my.tag",
                                      "paths.out_dir=../relative_is_fine"])
def test_4_ordinary_path_parts_are_accepted(tmp_path: Path, override: str) -> None:
    cfg = job_config(tmp_path, [*TINY, override])
    if override.startswith("paths.out_dir"):
        cfg = {**cfg, "paths": {**cfg["paths"], "out_dir": "../relative_is_fine",
                                "job_dir": "../relative_is_fine/runs/x/seed0"}}
    load_job(cfg)  # no refusal


def test_4_cli_refuses_the_issue_repro_and_writes_nothing(tmp_path: Path) -> None:
    start = tmp_path / "a" / "b" / "c"
    start.mkdir(parents=True)
    proc = subprocess.run([sys.executable, "-m", "training.run", "paths.out_dir=out", "logger=none", "progress=false",
                           "paths.cell=../../../../../../esc_cell", *TINY], cwd=start, env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().count("\n") == 0 and "paths.cell=" in proc.stderr, proc.stderr
    assert list(tmp_path.rglob("*")) == [tmp_path / "a", start.parent, start]  # no directory anywhere


# --- hydra.job.chdir=true with a relative paths.out_dir ---------------------------------------------------------------
def test_5_chdir_with_relative_out_dir_writes_where_the_command_started(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "training.run", "hydra.job.chdir=true", "paths.out_dir=rel",
                           "logger=none", "progress=false", *TINY], cwd=tmp_path, env=ENV, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = sorted(tmp_path.rglob("result.json"))
    assert len(results) == 1, results
    rel = results[0].relative_to(tmp_path)
    assert rel.parts[:2] == ("rel", "runs") and rel.parts.count("rel") == 1, rel  # not nested in the job dir
    stored = json.loads(results[0].read_text())
    assert Path(stored["job_dir"]) == results[0].parent


# --- the aggregate never averages two data fingerprints in a cell -----------------------------------------------------
def test_2_aggregate_marks_a_cell_on_two_data_and_strict_refuses(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from tests.test_aggregate_faults import COMMIT_A, _cfg, _run, _write

    root = tmp_path / "runs"
    for seed, data in ((0, "real"), (1, "real"), (2, "shuffled")):  # control: seed 2 on swapped labels
        fingerprint = {"content": f"{data:0<16}"[:16], "files": []}
        _write(root, _cfg("control", seed), 1.0 + seed, commit=COMMIT_A, dataset={"fingerprint": fingerprint})
        _write(root, _cfg("leace", seed), 2.0 + seed, commit=COMMIT_A,
               dataset={"fingerprint": {"content": "real000000000000", "files": []}})
    rc, md = _run(root, tmp_path)
    assert rc == 0
    assert "| mnist5k | mlp_relu | 128 | 2 | different data ‡ | 3.000 ± 1.000 |" in md, md  # leace: one data, averaged
    assert ("‡ runs on different data (dataset.fingerprint), not averaged: mnist5k mlp_relu w128 d2 control: "
            "real000000: seeds 0 1; shuffled00: seed 2\n") in md
    capsys.readouterr()
    rc, _ = _run(root, tmp_path / "strict", "--strict")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and "1 cell(s) with runs on different data" in err[0], err
    for seed in (0, 1):  # one data in every cell: accepted under --strict, no mark
        _write(root, _cfg("control", seed), 1.0 + seed, commit=COMMIT_A,
               dataset={"fingerprint": {"content": "shuffled00000000", "files": []}})
    rc, md = _run(root, tmp_path / "ok", "--strict")
    assert rc == 0 and "‡" not in md and "| 2.000 ± 1.000 | 3.000 ± 1.000 |" in md
