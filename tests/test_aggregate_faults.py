"""The aggregate's faults: what it compares, where results come from, and what it survives.

1. erasers are compared only where everything else is equal: one table (and plots, claims verdict) per group of
   results that differ in nothing but eraser and seed; a comparison across groups is refused with one line
2. provenance: a cell whose seeds come from different commits is marked and listed; --strict refuses it, and
   results without a recorded commit ("unknown")
10. bad files are warnings naming them; a result without an mdl section is incomplete; a non-finite MDL is a
    failed seed; `|` in a value keeps the markdown table intact; a job that found its result written by a
    concurrent identical job is skipped ("done by another run"), not done

Fixtures are hand-written result.json files (no training).
"""

from __future__ import annotations

import copy
import csv
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from hydra.core.utils import JobReturn, JobStatus
from omegaconf import OmegaConf

from scripts import aggregate
from tests.helpers import fixture_job_dir
from training.analysis import aggregate_plots
from training.analysis.tables import MixedGroupsError
from training.app.lifecycle import Outcome
from training.app.result_codec import encode
from training.app.results import JobDir
from training.app.tasks import decode_result, spec_of
from training.cli.ledger import LEDGER_ENV, JobStatusCallback, job_outcomes, summary_line
from training.common.ledger_entry import read_ledger
from training.tasks.mdl import aggregate_collect, aggregate_render, aggregate_summary, claims
from training.tasks.mdl.claims import CLAIMS

COMMIT_A, COMMIT_B = "a" * 40, "b" * 40


def _cfg(eraser_name: str = "control", seed: int = 0, lr: float | None = 0.001, net: str = "mlp_relu",
         width: int = 128, depth: int = 2, **groups: dict[str, Any]) -> dict[str, Any]:
    """A job config as result.json stores it; `groups` are merged into its groups (arch={...}, mdl={...})."""
    cfg: dict[str, Any] = {"task": "mdl", "seed": seed, "dataset": {"name": "mnist5k", "tag": "mnist5k"},
                           "eraser": {"name": eraser_name, "options": {}},
                           "arch": {"name": net.split("_")[0], "tag": net, "width": width, "depth": depth},
                           "optim": {"lr": lr}, "mdl": {"protocol": "prequential"}}
    for key, value in groups.items():
        cfg[key] = {**cfg.get(key, {}), **value}
    return cfg


def _write(root: Path, cfg: dict[str, Any], bits: float, commit: str | None = None, **top: Any) -> Path:
    result: dict[str, Any] = {
        "config_hash": "fixture", "hash_version": 2, "config": cfg,
        "mdl": {"protocol": "prequential", "bits_per_sample": bits, "legacy": bits * 3},
        "final": {"val_loss_bits": 0.5, "val_loss_curve": [[10, 0.3], [20, 0.2]]}, "certificate": None, **top}
    if commit is not None:
        result["provenance"] = {"code": {"commit": commit, "dirty": False, "version": "0.1.0"}, "python": "3.11",
                                "torch": "2.3", "numpy": "1.26", "device_name": "cpu", "host": "h",
                                "started": "2026-01-01T00:00:00", "ended": "2026-01-01T00:01:00"}
    job_dir = fixture_job_dir(root, cfg)
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "result.json").write_text(json.dumps(result))
    return job_dir


def _run(root: Path, tmp_path: Path, *args: str) -> tuple[int, str]:
    """aggregate.main on root; (exit code, the markdown written)."""
    out = tmp_path / "tables"
    rc = aggregate.main([str(root), "--out", str(out), "--name", "t", *args])
    md = out / "t.md"
    return rc, md.read_text() if md.exists() else ""


def _table_lines_intact(md: str) -> None:
    """Every markdown table has as many cells in each line as in its header (an unescaped `|` would add one)."""
    for block in re.findall(r"(?:^\|.*\|\n)+", md, flags=re.M):
        widths = {len(re.split(r"(?<!\\)\|", line)) for line in block.splitlines()}
        assert len(widths) == 1, block


# --- 1. erasers compared only where everything else is equal ---------------------------------------------------

def test_1_erasers_at_different_learning_rates_get_a_table_each_no_verdict_and_no_comparison(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """control at lr 1e-3, LEACE at 1e-2: before, one row compared them (increase over control, claim "holds")."""
    root = tmp_path / "runs"
    for seed in range(3):
        _write(root, _cfg("control", seed, lr=0.001), 1.0 + 0.1 * seed)
        _write(root, _cfg("leace", seed, lr=0.01), 2.0 + 0.1 * seed)
    rc, md = _run(root, tmp_path, "--claims")
    assert rc == 0
    assert "## Group 1: optim.lr=0.001\n" in md and "## Group 2: optim.lr=0.01\n" in md
    assert "These results differ in optim.lr besides the eraser and the seed" in md
    assert "MDL increase over control" not in md  # nothing to pair: control and LEACE are in different groups
    assert md.count("| dataset | arch | w | d | control |\n") == 3  # group 1's MDL, legacy, final-loss tables
    report = (tmp_path / "tables" / "t_claims.md").read_text()
    assert "### Group 1: optim.lr=0.001" in report and "### Group 2: optim.lr=0.01" in report
    leace = CLAIMS["leace_raises_mdl"].text
    assert "**supported**" not in report and report.count(f"{leace}: **not testable here**") == 2
    summary = list(csv.DictReader((tmp_path / "tables" / "t.csv").open()))
    assert {r["eraser"]: json.loads(r["group"]) for r in summary} == {"control": {"optim.lr": 0.001},
                                                                       "leace": {"optim.lr": 0.01}}
    assert (tmp_path / "tables" / "t-g1.png").exists() and (tmp_path / "tables" / "t-g2.png").exists()
    # a comparison across the groups is refused with one line
    df, _ = aggregate_collect.collect_dir(root)
    summary = aggregate_summary.summarize(df)
    for compare in (lambda: claims.evaluate(df, ["leace_raises_mdl"]),
                    lambda: aggregate_plots.plot_bars(summary, tmp_path / "x.png"),
                    lambda: aggregate_render.pivot(summary, "bits_per_sample")):
        with pytest.raises(MixedGroupsError) as err:
            compare()
        line = str(err.value)
        assert "\n" not in line and line.startswith("refused: ") and "optim.lr (0.001 vs 0.01)" in line
    assert not (tmp_path / "x.png").exists()
    per_group = claims.evaluate_groups(df, ["leace_raises_mdl"])  # what --claims does: a verdict per group
    assert [verdict for _, results in per_group for _, _, verdict in results] == ["not testable here"] * 2


def test_1_a_result_that_did_not_record_a_key_is_not_compared_with_one_that_did(tmp_path: Path) -> None:
    """A result written before mdl.min_steps existed (so before the step-aware stopping) next to one with it:
    defaults are not assumed for what a result did not record."""
    root = tmp_path / "runs"
    for seed in range(3):
        _write(root, _cfg("control", seed), 1.0)
        _write(root, _cfg("leace", seed, mdl={"min_steps": 300}), 2.0)
    df, _ = aggregate_collect.collect_dir(root)
    groups = {e: json.loads(g) for e, g in zip(df.eraser, df.group, strict=True)}
    assert groups == {"control": {"mdl.min_steps": "?"}, "leace": {"mdl.min_steps": 300}}
    assert aggregate_summary.increase_over_control(df).empty


def test_1_what_stays_comparable_paper_rates_pre_v2_results_eraser_options(tmp_path: Path) -> None:
    """Regression guards: erasers at the paper's rate for their family (ConvNeXt: control 5e-5, LEACE 1e-4) are
    one group; a pre-v2 result (lr null = the paper's rate, dead eraser.cache) joins it; eraser options stay
    variants of the eraser, in the same group."""
    root = tmp_path / "runs"
    paper = {"paper_optim": {"lr": {"control": 5e-5, "linear": 1e-4, "quadratic": 1e-3}}}
    for seed in range(3):
        _write(root, _cfg("control", seed, lr=5e-5, net="convnext", width=40, arch=paper), 1.0 + seed)
        _write(root, _cfg("leace", seed, lr=1e-4, net="convnext", width=40, arch=paper), 1.5 + seed)
        old = _cfg("leace", seed, lr=None, net="convnext", width=40, arch=paper, eraser={"cache": True})
        old["arch"]["depth"] = 3
        result = _write(root, old, 2.0) / "result.json"
        stored = json.loads(result.read_text())
        del stored["hash_version"]  # written before hash v2
        result.write_text(json.dumps(stored))
        for mode, bits in (("coupling", 3.0), ("truncate", 3.2)):
            q = _cfg("qleace", seed, lr=1e-3, net="convnext", width=40, arch=paper,
                     eraser={"options": {"rank_deficient": mode}})
            _write(root, q, bits + seed)
    df, _ = aggregate_collect.collect_dir(root)
    assert set(df.group) == {"{}"} and set(df.status) == {"done"}
    assert set(df[df.eraser == "qleace"].variant) == {"eraser.options.rank_deficient=coupling",
                                                      "eraser.options.rank_deficient=truncate"}
    assert set(df[df.eraser != "qleace"].variant) == {""}
    inc = aggregate_summary.increase_over_control(df)
    assert inc[(inc.eraser == "leace") & (inc.n > 0)]["mean"].tolist() == [pytest.approx(0.5)]


# --- 2. provenance -------------------------------------------------------------------------------------------

def test_2_seeds_from_different_commits_or_none_are_marked_and_refused_under_strict(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "runs"
    for seed, commit in ((0, COMMIT_A), (1, COMMIT_A), (2, COMMIT_B)):
        _write(root, _cfg("control", seed), 1.0 + 0.1 * seed, commit=commit)
        _write(root, _cfg("leace", seed), 2.0, commit=COMMIT_A)
    rc, md = _run(root, tmp_path)
    assert rc == 0
    assert "| mnist5k | mlp_relu | 128 | 2 | 1.100 ± 0.100 † | 2.000 ± 0.000 |" in md
    assert ("† seeds from different commits: mnist5k mlp_relu w128 d2 control: aaaaaaaaaa: seeds 0 1; "
            "bbbbbbbbbb: seed 2\n") in md
    assert "Code versions (commit: finished results): aaaaaaaaaa (5), bbbbbbbbbb (1)." in md
    capsys.readouterr()
    rc, _ = _run(root, tmp_path / "strict", "--strict")
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and len(err) == 1 and err[0].startswith("error: --strict: 1 cell(s) with seeds from different "
                                                           "commits (first: mnist5k mlp_relu w128 d2 control:")
    assert not (tmp_path / "strict" / "tables").exists()  # refused: nothing written
    # results without provenance are unknown, and refused under --strict
    other = tmp_path / "unknown"
    root = other / "runs"
    for seed in range(2):
        _write(root, _cfg("control", seed), 1.0, commit=COMMIT_A)
    old = _write(root, _cfg("leace", 0), 2.0)  # written before results carried provenance
    rc, md = _run(root, other)
    assert rc == 0 and "aaaaaaaaaa (2), unknown (1); unknown: no commit recorded" in md
    capsys.readouterr()
    assert _run(root, other / "s", "--strict")[0] == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"1 result(s) without a recorded commit (first: {old})" in line
    (old / "result.json").unlink()
    assert _run(root, other / "ok", "--strict")[0] == 0  # one known commit everywhere: accepted


# --- 10. bad files, non-finite results, table text, honest counts -----------------------------------------------

def _bad_config(content: dict[str, Any]) -> str:
    cfg = _cfg("leace", 0)
    return json.dumps({"config_hash": "x", "config": cfg, "mdl": {"bits_per_sample": 1.0}, **content})


MALFORMED = {
    "invalid JSON": "{broken",
    "a list": "[]",
    "no config": json.dumps({"config_hash": "x", "mdl": {"bits_per_sample": 1.0, "legacy": 2.0}}),
    "config without arch": json.dumps({"config_hash": "x", "config": {"seed": 0, "dataset": {"name": "d"},
                                                                       "eraser": {"name": "leace"}},
                                       "mdl": {"bits_per_sample": 1.0, "legacy": 2.0}}),
    "config as a list": json.dumps({"config_hash": "x", "config": [1, 2], "mdl": {"bits_per_sample": 1.0}}),
    "bits not a number": _bad_config({"mdl": {"bits_per_sample": "1.2", "legacy": 2.0}}),
    "final as a list": _bad_config({"mdl": {"bits_per_sample": 1.0, "legacy": 2.0}, "final": [1]}),
}


@pytest.mark.parametrize("content", MALFORMED.values(), ids=MALFORMED.keys())
def test_10_a_malformed_result_file_is_a_warning_naming_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                           content: str) -> None:
    root = tmp_path / "runs"
    for seed in range(2):
        _write(root, _cfg("control", seed), 1.0 + seed)
    bad = fixture_job_dir(root, _cfg("leace", 0)) / "result.json"
    bad.parent.mkdir(parents=True)
    bad.write_text(content)
    rc, md = _run(root, tmp_path)
    err = capsys.readouterr().err
    assert rc == 0 and f"warning: skipped {bad}: " in err and "Traceback" not in err
    assert "| mnist5k | mlp_relu | 128 | 2 | 1.500 ± 0.707 |" in md  # the good results are all there
    assert f"| malformed | 0 | {bad.parent} | " in md  # and the bad one is listed, not dropped


@pytest.mark.parametrize("unreadable", [False, True], ids=["invalid JSON", "not a file"])
def test_10_a_malformed_result_beside_another_configs_is_listed_not_a_repeat(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], unreadable: bool) -> None:
    """The same cell and seed at another learning rate (its own c<hash> directory): a file there that cannot be
    read is that job's malformed result, never a repeat of the finished one."""
    root = tmp_path / "runs"
    _write(root, _cfg("control", 0), 1.0)
    bad = fixture_job_dir(root, _cfg("control", 0, lr=0.01)) / "result.json"
    if unreadable:  # read fails with an OSError (IsADirectoryError), as for a file without read permission
        bad.mkdir(parents=True)
    else:
        bad.parent.mkdir(parents=True)
        bad.write_text("{broken")
    rc, md = _run(root, tmp_path)
    err = capsys.readouterr().err
    assert rc == 0 and f"warning: skipped {bad}: not readable JSON" in err and "repeated" not in err
    assert "| mnist5k | mlp_relu | 128 | 2 | 1.000 |" in md and f"| malformed | 0 | {bad.parent} | " in md


def test_10_a_result_without_an_mdl_section_is_listed_as_incomplete(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    _write(root, _cfg("control", 0), 1.0)
    job = _write(root, _cfg("control", 1), 1.0)
    stored = json.loads((job / "result.json").read_text())
    del stored["mdl"]
    (job / "result.json").write_text(json.dumps(stored))
    rc, md = _run(root, tmp_path)
    assert rc == 0 and "| mnist5k | mlp_relu | 128 | 2 | 1.000 (1/2) |" in md
    assert f"| incomplete | 1 | {job} | result.json has no mdl section |" in md


def test_10_a_non_finite_mdl_is_a_failed_seed_never_averaged(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for seed, bits in enumerate((1.0, 1.2, math.nan)):
        _write(root, _cfg("control", seed), bits)
    for seed, bits in enumerate((2.0, math.inf, 2.2)):
        _write(root, _cfg("leace", seed), bits)
    rc, md = _run(root, tmp_path)
    assert rc == 0
    assert "| mnist5k | mlp_relu | 128 | 2 | 1.100 ± 0.141 (2/3) | 2.100 ± 0.141 (2/3) |" in md
    assert "| mnist5k | mlp_relu | 128 | 2 | +1.000 |" in md  # paired over the one seed both finished (0)
    assert md.count("| failed | ") == 2 and "non-finite MDL (bits_per_sample=nan" in md and "nan ±" not in md
    summary = list(csv.DictReader((tmp_path / "tables" / "t.csv").open()))
    assert sorted((r["eraser"], r["n"], r["missing_seeds"]) for r in summary) == [("control", "2", "2:failed"),
                                                                                 ("leace", "2", "1:failed")]


def test_10_a_pipe_in_a_value_does_not_break_the_markdown_table(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for mode in ("a|b", "c"):
        _write(root, _cfg("qleace", 0, eraser={"options": {"rank_deficient": mode}}), 1.0)
    failed = fixture_job_dir(root, _cfg("qleace", 1, eraser={"options": {"rank_deficient": "c"}}))
    ledger = root / ".multirun" / "20260101-000000-1"
    ledger.mkdir(parents=True)
    (ledger / "job-00001.json").write_text(json.dumps({"num": 1, "job_dir": str(failed), "status": "failed",
                                                       "error": "ValueError: x | y\nsecond line"}))
    rc, md = _run(root, tmp_path)
    assert rc == 0 and r"eraser.options.rank_deficient=a\|b" in md and r"ValueError: x \| y second line" in md
    _table_lines_intact(md)


def test_10_a_job_finished_meanwhile_by_an_identical_job_counts_as_skipped(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """Two identical sweeps at once: the job that waited on the directory's lock and found the other's result
    is skipped ("done by another run"), not a second "done"."""
    MDL = spec_of("mdl")

    ledger = tmp_path / "ledger"
    ledger.mkdir()
    monkeypatch.setenv(LEDGER_ENV, str(ledger))
    h = "0123456789abcdef"
    result = {"config_hash": h, "config": {}, "mdl": {"bits_per_sample": 1.0}}
    callback = JobStatusCallback()
    dirs = [tmp_path / f"job{n}" for n in range(5)]
    for d in dirs:
        d.mkdir()

    def run(n: int, body: Any) -> None:  # what Hydra does around a job, in the job's process
        config = OmegaConf.create({"paths": {"job_dir": str(dirs[n])}, "hydra": {"job": {"num": n}}})
        callback.on_job_start(config)
        returned = body()
        failed = isinstance(returned, BaseException)
        status = JobStatus.FAILED if failed else JobStatus.COMPLETED  # a one-seed cell: an Outcome in a list
        callback.on_job_end(config, JobReturn(status=status, _return_value=returned if failed else [returned]))

    def computes() -> Outcome:
        JobDir(dirs[0], h, MDL).write_result(decode_result(result))
        return Outcome("done", dirs[0], result)

    run(0, computes)

    def waits_then_finds() -> Outcome:
        JobDir(dirs[1], h, MDL).write_result(decode_result(copy.deepcopy(result)))  # the other sweep's job, meanwhile
        done = JobDir(dirs[1], h, MDL).finished()  # this job, once it has the lock: SKIP
        assert done is not None
        return Outcome("skipped", dirs[1], encode(done))

    run(1, waits_then_finds)
    JobDir(dirs[2], h, MDL).write_result(decode_result(result))  # finished before this sweep started

    def finds() -> Outcome:
        done = JobDir(dirs[2], h, MDL).finished()
        assert done is not None
        return Outcome("skipped", dirs[2], encode(done))

    run(2, finds)
    run(3, lambda: Outcome("reused", dirs[3], result))  # the same configuration's result in its pre-v2 directory
    run(4, lambda: ValueError("bad"))
    entries = read_ledger(ledger)
    assert [(e.status, e.reason) for e in entries] == [("done", None), ("skipped", "done by another run"),
                                                       ("skipped", None), ("skipped", None), ("failed", None)]
    assert entries[4].error == "ValueError: bad"
    assert "5/5 jobs ran: 1 done, 3 skipped (1 done by another run), 1 failed" in summary_line(entries, 5)


def test_the_ledger_refuses_a_task_that_returns_no_outcome(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match="not a list of Outcomes"):
        job_outcomes([tmp_path], JobReturn(status=JobStatus.COMPLETED, _return_value={"mdl": {}}))
