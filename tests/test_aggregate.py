"""scripts/aggregate.py on fixture directories: exact tables, missing seeds, failed and partial jobs, other tasks."""

from __future__ import annotations

import csv
import errno
import json
import math
import os
import shutil
from pathlib import Path
from typing import Any

import pandas as pd
import pytest

from scripts import aggregate
from training.analysis.tables import MixedGroupsError, group_label, groups_in
from training.app.schema import numerics_of
from training.app.tasks import Collected, decode_result, get_task, job_hash, spec_of
from training.common.sweeps import expand
from training.tasks.mdl import aggregate_collect, aggregate_render, aggregate_summary
from training.tasks.mdl.job_paths import JobPath


def _config(dataset: str, eraser: str, arch: str, width: int, depth: int, seed: int, task: str = "mdl") -> dict:
    name = arch.split("_")[0]
    return {"task": task, "seed": seed, "dataset": {"name": dataset, "tag": dataset},
            "eraser": {"name": eraser, "options": {}},
            "arch": {"name": name, "tag": arch, "width": width, "depth": depth},
            "mdl": {"protocol": "prequential"}}


def _job_dir(root: Path, cfg: dict) -> Path:  # the pre-v2 layout (no c<hash> part)
    a = cfg["arch"]
    return JobPath(cfg["dataset"]["tag"], cfg["eraser"]["name"], a["tag"], a["width"], a["depth"], None,
                   cfg["seed"]).under(root)


def write_result(root: Path, cfg: dict, bits: float, legacy: float, final: float,
                 cert: dict[str, float] | None = None, report: dict[str, Any] | None = None) -> Path:
    job_dir = _job_dir(root, cfg)
    job_dir.mkdir(parents=True)
    result: dict[str, Any] = {
        "config_hash": "fixture", "config": cfg,
        "mdl": {"protocol": "prequential", "bits_per_sample": bits, "legacy": legacy},
        "final": {"val_loss_bits": final, "val_loss_curve": [[10, final * math.log(2)]]},
        "certificate": None if cert is None else {"before": {}, "after": cert},
    }
    if report is not None:
        result["eraser"] = {"name": cfg["eraser"]["name"], "report": report}
    (job_dir / "result.json").write_text(json.dumps(result))
    return job_dir


CERT_LEACE = {"max_mean_gap": 1e-15, "max_cov_gap": 0.25, "linear_probe_acc": 0.1, "quadratic_probe_acc": 0.8,
              "chance": 0.1}


@pytest.fixture
def fixture_runs(tmp_path: Path) -> Path:
    """mnist5k, MLP w128 d2, control + leace x seeds 0-2. control seed 1 failed (multirun ledger), leace seed 2
    never ran, control has no certificate; one partial job (progress.json) and one result of another task."""
    root = tmp_path / "runs"
    for seed, bits, legacy, final in [(0, 1.0, 3.0, 0.5), (2, 1.2, 3.4, 0.7)]:
        write_result(root, _config("mnist5k", "control", "mlp_relu", 128, 2, seed), bits, legacy, final)
    for seed, bits, legacy, final in [(0, 1.5, 4.0, 0.9), (1, 1.7, 4.2, 1.1)]:
        write_result(root, _config("mnist5k", "leace", "mlp_relu", 128, 2, seed), bits, legacy, final, CERT_LEACE)
    failed = _job_dir(root, _config("mnist5k", "control", "mlp_relu", 128, 2, 1))
    ledger = root / ".multirun" / "20260101-000000-1"
    ledger.mkdir(parents=True)
    (ledger / "job-00001.json").write_text(json.dumps(
        {"num": 1, "job_dir": str(failed), "status": "failed", "error": "ValueError: boom"}))
    partial = _job_dir(root, _config("mnist5k", "leace", "lenet", 128, 2, 0))
    partial.mkdir(parents=True)
    (partial / "progress.json").write_text(json.dumps({"config_hash": "x", "blocks": [{}, {}]}))
    other = root / "colored_mnist" / "sd" / "seed0"
    other.mkdir(parents=True)
    (other / "result.json").write_text(json.dumps({"config": {"task": "gs_colored_mnist", "seed": 0}}))
    return root


EXPECTED_MD = """\
# Results under {root}

4/6 jobs finished; MDL protocol: prequential. Cells: mean ± sd over finished seeds, (n/N) when seeds are missing, \
† when they come from different commits.

Code versions (commit: finished results): unknown (4); unknown: no commit recorded (older result, or not a git \
checkout).

## MDL (bits/sample)

| dataset | arch | w | d | control | leace |
|---|---|---|---|---|---|
| mnist5k | mlp_relu | 128 | 2 | 1.100 ± 0.141 (2/3) | 1.600 ± 0.141 (2/3) |
| mnist5k | lenet | 128 | 2 | missing | missing |

## Legacy MDL (the paper code's units)

| dataset | arch | w | d | control | leace |
|---|---|---|---|---|---|
| mnist5k | mlp_relu | 128 | 2 | 3.200 ± 0.283 (2/3) | 4.100 ± 0.141 (2/3) |
| mnist5k | lenet | 128 | 2 | missing | missing |

## MDL increase over control (bits/sample, paired by seed)

| dataset | arch | w | d | leace |
|---|---|---|---|---|
| mnist5k | mlp_relu | 128 | 2 | +0.500 |
| mnist5k | lenet | 128 | 2 | missing |

Null control: no permuted-label runs among these results, so label injection by the eraser (null MDL below the \
label entropy) is not checked; rerun the cells with `dataset.permute_labels=true` (same config, seeds and repeats \
otherwise) to check it.

## Final validation loss (bits, full-data run)

| dataset | arch | w | d | control | leace |
|---|---|---|---|---|---|
| mnist5k | mlp_relu | 128 | 2 | 0.600 ± 0.141 (2/3) | 1.000 ± 0.141 (2/3) |
| mnist5k | lenet | 128 | 2 | missing | missing |

## Erasure certificate (after erasure)

| dataset | eraser | mean gap | cov gap | linear probe | quadratic probe | chance | working rank | variance dropped \
| noise share (max) | gradient gaps mean / cov (before → after) |
|---|---|---|---|---|---|---|---|---|---|---|
| mnist5k | control | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a | n/a |
| mnist5k | leace | 1e-15 | 0.25 | 0.1 | 0.8 | 0.1 | n/a | n/a | n/a | n/a |

## Jobs without a result

| status | seed | job dir | detail |
|---|---|---|---|
| failed | 1 | {root}/mnist5k/control/mlp_relu-w128-d2/seed1 | ValueError: boom |
| partial | 0 | {root}/mnist5k/leace/lenet-w128-d2/seed0 | 2 block models finished |
"""


def test_fixture_directory_gives_the_exact_table(fixture_runs: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    given: list[Any] = []

    def record(collected: Collected) -> dict[str, str]:
        given.append(collected.results)
        return {}

    monkeypatch.setattr(get_task("gs_colored_mnist"), "rows", record)
    out = tmp_path / "tables"
    assert aggregate.main([str(fixture_runs), "--out", str(out), "--name", "fx"]) == 0
    md = (out / "fx.md").read_text()
    assert md == EXPECTED_MD.format(root=fixture_runs)
    # the gs result goes to its own task's tables, not mistaken for an MDL row
    assert [[r.config for r in results] for results in given] == [[{"task": "gs_colored_mnist", "seed": 0}]]
    rows = list(csv.DictReader((out / "fx.csv").open()))
    control = next(r for r in rows if r["eraser"] == "control" and r["arch"] == "mlp_relu")
    assert (control["n"], control["n_expected"], control["missing_seeds"]) == ("2", "3", "1:failed")
    assert float(control["bits_per_sample_mean"]) == pytest.approx(1.1)
    leace = next(r for r in rows if r["eraser"] == "leace" and r["arch"] == "mlp_relu")
    assert leace["missing_seeds"] == "2:missing"
    jobs = list(csv.DictReader((out / "fx_jobs.csv").open()))
    assert sorted(j["status"] for j in jobs) == ["done"] * 4 + ["failed", "partial"]
    tex = (out / "fx.tex").read_text()
    assert r"1.100 $\pm$ 0.141 (2/3)" in tex and r"mlp\_relu" in tex and tex.count(r"\begin{tabular}") == 2
    for png in ("fx.png", "fx_val_curves.png", "fx_increase.png"):
        assert (out / png).stat().st_size > 1000


def test_width_and_depth_plots_and_paper_table(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for eraser, base in [("control", 7.0), ("leace", 8.0)]:
        for seed in (0, 1):
            for width in (64, 128, 256):
                write_result(root, _config("cifar10", eraser, "mlp_relu", width, 2, seed), 2.0, base + seed * 0.1, 1.0)
            for depth in (1, 3):
                write_result(root, _config("cifar10", eraser, "mlp_relu", 128, depth, seed), 2.0, base, 1.0)
    out = tmp_path / "tables"
    assert aggregate.main([str(root), "--out", str(out), "--name", "w"]) == 0
    assert (out / "w_mdl_vs_width.png").exists() and (out / "w_mdl_vs_depth.png").exists()
    md = (out / "w.md").read_text()
    # Ours next to the paper's Appendix C (legacy units); cells we did not run say so.
    assert "| MLP | 7.05 ± 0.07 / 7.14 ± 0.05 | 8.05 ± 0.07 / 8.49 ± 0.10 | missing / 8.94 ± 0.14 |" in md
    assert "| LeNet | missing / 5.62 ± 0.02 |" in md


def test_every_task_tables_its_own_results(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """scripts/aggregate.py asks every task (the registry) for the tables of its results; one task's failure is
    reported and the others' tables stand; a result of a task not declared here is named."""
    def tables(collected: Any) -> dict[str, str]:
        return {"gs": f"| gs | {len(collected.results)} results |\n"} if collected.results else {}

    def broken(collected: Any) -> dict[str, str]:
        raise KeyError("train")

    monkeypatch.setattr(get_task("gs_two_moons"), "rows", tables)
    monkeypatch.setattr(get_task("gs_colored_mnist"), "rows", broken)
    results = [decode_result({"config": {"task": "gs_two_moons"}})] * 2 + [decode_result({"config": {"task": "gone"}})]
    text = aggregate.write_all(pd.DataFrame(), results, tmp_path, "x", "title")
    assert text == "| gs | 2 results |\n" and (tmp_path / "x_gs.md").read_text() == text
    err = capsys.readouterr().err
    assert "tables of task gs_colored_mnist failed (KeyError: 'train')" in err
    assert "1 result(s) of tasks not declared here (gone)" in err


@pytest.mark.parametrize(("root", "why"), [("empty", ": "), ("nope", " (it does not exist): "),
                                           ("afile", " (a file, not a directory): ")])
def test_no_results_is_a_refusal_naming_the_directory(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                      root: str, why: str) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "afile").touch()
    assert aggregate.main([str(tmp_path / root), "--out", str(tmp_path / "t")]) == 2
    assert capsys.readouterr().err == (f"error: no result.json under {tmp_path / root}{why}run a sweep first, or give "
                                       "the directory that holds the results (e.g. outputs/runs)\n")
    assert not (tmp_path / "t").exists()


def test_a_full_disk_is_a_refusal_and_leaves_no_table(fixture_runs: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A table that cannot be written (no space left) fails the aggregate in one line; the tables written before it
    are not left in --out (nor an older run's tables replaced by half of a new set)."""
    def full(df: Any, summary: Any, inc: Any, out: Path, stem: str) -> None:
        (out / f"{stem}_mdl.png").write_bytes(b"\x89PNG")  # half a plot
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    shutil.rmtree(fixture_runs / "colored_mnist")  # a result of another task, whose tables warn
    out = fixture_runs.parent / "t"
    out.mkdir()
    (out / "t.md").write_text("older tables")
    monkeypatch.setattr(aggregate_render, "plot_all", full)
    assert aggregate.main([str(fixture_runs), "--out", str(out), "--name", "t"]) == 2
    captured = capsys.readouterr()
    assert captured.err == (f"error: --out {out}: the tables could not be written ({os.strerror(errno.ENOSPC)}): "
                            "nothing was written; free space there or choose another --out\n")
    assert captured.out == "" and [p.name for p in out.iterdir()] == ["t.md"] and (out / "t.md").read_text() == (
        "older tables")


def test_experiment_mode_counts_only_results_of_the_presets_config(tmp_path: Path) -> None:
    """--experiment: a result of the job's config is done (also when its stored hash predates a change of the
    hash's definition); another config's result in the job's directory is not counted."""
    jobs = expand("smoke", [f"paths.out_dir={tmp_path}"])
    for k, cfg in enumerate(jobs[:3]):
        job_dir = Path(cfg["paths"]["job_dir"])
        job_dir.mkdir(parents=True)
        stored = {**cfg, "optim": {**cfg["optim"], "lr": 0.1}} if k == 2 else cfg
        result = {"config_hash": job_hash(cfg) if k == 0 else "old-definition", "config": stored,
                  "numerics_version": numerics_of(spec_of("mdl")),
                  "mdl": {"protocol": "prequential", "bits_per_sample": 1.0 + k, "legacy": 2.0 + k},
                  "final": None, "certificate": None}
        (job_dir / "result.json").write_text(json.dumps(result))
    df, results = aggregate_collect.collect_experiment(expand("smoke", [f"paths.out_dir={tmp_path}"]))
    assert list(df.status) == ["done", "done", "other-config", "missing"]
    assert len(results) == 2
    header, rows = aggregate_render.pivot(aggregate_summary.summarize(df), "bits_per_sample")
    assert header[4:] == ["control", "leace"] and rows == [["digits", "mlp_relu", "32", "2", "1.500 ± 0.707",
                                                             "missing"]]


def test_different_configurations_are_never_averaged_together(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """Same cell and seeds, two regularizers (e.g. `make demo` next to an SD sweep): two groups, a table each
    (one table over both is refused). The same result found twice (two copies of a run) counts once."""
    root = tmp_path / "runs"
    for reg, bits in (("none", 1.0), ("sd", 2.0)):
        for seed in (0, 1):
            cfg = {**_config("mnist5k", "control", "mlp_relu", 128, 2, seed), "regularizer": {"name": reg}}
            write_result(root / reg, cfg, bits + seed, 3.0, 0.5)
    copy = root / "copy" / "mnist5k/control/mlp_relu-w128-d2/seed0"
    copy.mkdir(parents=True)
    (copy / "result.json").write_text((root / "none/mnist5k/control/mlp_relu-w128-d2/seed0/result.json").read_text())
    df, _ = aggregate_collect.collect_dir(root)
    assert "repeated result" in capsys.readouterr().err
    summary = aggregate_summary.summarize(df)
    with pytest.raises(MixedGroupsError, match=r"differ in regularizer.name \(none vs sd\)"):
        aggregate_render.pivot(summary, "bits_per_sample")
    tables = {group_label(g): aggregate_render.pivot(summary[summary.group == g], "bits_per_sample")
              for g in groups_in(summary)}
    assert tables == {"regularizer.name=none": (["dataset", "arch", "w", "d", "control"],
                                                [["mnist5k", "mlp_relu", "128", "2", "1.500 ± 0.707"]]),
                      "regularizer.name=sd": (["dataset", "arch", "w", "d", "control"],
                                              [["mnist5k", "mlp_relu", "128", "2", "2.500 ± 0.707"]])}
    out = tmp_path / "tables"
    assert aggregate.main([str(root), "--out", str(out), "--name", "v"]) == 0
    for stem in ("v-g1", "v-g2"):  # a set of plots per group
        assert (out / f"{stem}.png").exists() and (out / f"{stem}_val_curves.png").exists()


def test_certificate_table_shows_what_the_erasers_report(tmp_path: Path) -> None:
    """QLEACE's working rank, dropped variance and noise share; gradient erasure's own gaps before → after;
    QLEACE results that differ in their options get one row per variant."""
    root = tmp_path / "runs"
    for mode, rank, dropped, noise in (("coupling", 784, 0.0, 0.0407), ("truncate", 387, 0.0123, 0.0)):
        cfg = _config("fmnist", "qleace", "mlp_relu", 128, 2, 0)
        cfg["eraser"]["options"] = {"rank_deficient": mode}
        write_result(root / mode, cfg, 1.0, 2.0, 0.5, CERT_LEACE,
                     report={"working_rank": rank, "d": 784, "variance_dropped_fraction": dropped,
                             "max_noise_share": noise, "warnings": []})
    write_result(root, _config("fmnist", "gradient", "mlp_relu", 128, 2, 0), 1.0, 2.0, 0.5, CERT_LEACE,
                 report={"max_mean_gap_before": 0.66, "max_cov_gap_before": 1.2, "max_mean_gap_after": 0.25,
                         "max_cov_gap_after": 0.14, "quantized": False})
    df, _ = aggregate_collect.collect_dir(root)
    header, rows = aggregate_render.certificate_rows(aggregate_summary.summarize(df))
    assert header[:3] == ["dataset", "variant", "eraser"] and header[-4:] == [
        "working rank", "variance dropped", "noise share (max)", "gradient gaps mean / cov (before → after)"]
    cells = {(r[1], r[2]): r[-4:] for r in rows}
    assert cells[("eraser.options.rank_deficient=coupling", "qleace")] == ["784/784", "0.00%", "4.07%", "n/a"]
    assert cells[("eraser.options.rank_deficient=truncate", "qleace")] == ["387/784", "1.23%", "0.00%", "n/a"]
    assert cells[("", "gradient")] == ["n/a", "n/a", "n/a", "0.66 / 1.2 → 0.25 / 0.14"]


@pytest.mark.parametrize(("args", "line"), [
    (["--experiment", "nonexist"], "error: --experiment 'nonexist' is not a preset; the presets "
                                   "(conf/experiment/*.yaml) are: "),
    (["--experiment", "demo", "--override", "nokey=1"], "error: --experiment demo with --override nokey=1: nokey "
     "is not a key of the preset's config; check its spelling, or write +nokey=... to add a new key"),
    (["--experiment", "demo", "--override", "arch.widht=3"], "error: --experiment demo with --override "
     "arch.widht=3: arch.widht is not a key of the preset's config (did you mean arch.width"),
    (["runs", "--override", "arch.width=32"], "error: --override arch.width=32 needs --experiment <preset>"),
])
def test_an_unknown_preset_or_override_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   args: list[str], line: str) -> None:
    assert aggregate.main([str(tmp_path) if a == "runs" else a for a in args] + ["--out", str(tmp_path / "t")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(line), err
    if "nonexist" in line:
        assert all(p in err[0] for p in ("demo", "smoke", "paper_table_c", "calibrate"))
    assert not (tmp_path / "t").exists()
