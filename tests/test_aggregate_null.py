"""The aggregate's side of the fit modes: eraser.fit_on is part of the eraser's identity, the repeats of a
repeated-holdout cell are one cell (eraser.repeat; eraser.fold in older results), a permuted-label run is the null
of its cell (bias = null MDL − label entropy, flagged against the null's own SE with a floor: a detector of label
injection, never a correction), the certificate's out-of-sample probes, brackets [holdout, self] at equal n_coded,
the fit and the training budget per cell, and the claims on them.

Fixtures are hand-written result.json files (no training).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from scripts import aggregate
from tests.helpers import fixture_job_dir
from tests.test_aggregate_faults import _write as write_result
from training.analysis.tables import groups_in
from training.app.tasks import decode_result
from training.tasks.mdl import aggregate_collect, aggregate_render, aggregate_summary, claims
from training.tasks.mdl.result import MdlRecord, MdlResult

LOG2_10 = math.log2(10)


def _cfg(eraser: str, seed: int, *, fit_on: str | None = "all", fold: int = 0, null: bool | None = False,
         net: str = "mlp_relu", width: int = 128, repeat: bool = False) -> dict[str, Any]:
    """A stored config; fit_on=None / null=None: written before eraser.fit_on / dataset.permute_labels existed;
    repeat: the result's keys (eraser.repeat, fit_source; `fold` is the repeat) instead of eraser.fold."""
    cfg: dict[str, Any] = {"task": "mdl", "seed": seed, "dataset": {"name": "mnist5k", "tag": "mnist5k"},
                           "eraser": {"name": eraser, "options": {}},
                           "arch": {"name": net.split("_")[0], "tag": net, "width": width, "depth": 2},
                           "mdl": {"protocol": "prequential"}}
    if fit_on is not None and repeat:
        cfg["eraser"].update(fit_on=fit_on, fit_source="split", fit_fraction=0.2, repeat=fold, n_fit=None,
                             after_augment=False)
    elif fit_on is not None:
        cfg["eraser"].update(fit_on=fit_on, fit_fraction=0.2, fold=fold, after_augment=False)
    if null is not None:
        cfg["dataset"]["permute_labels"] = null
    return cfg


def _write(root: Path, cfg: dict[str, Any], bits: float, cert: dict[str, Any] | None = None,
           dataset: dict[str, Any] | None = None, blocks: list[dict[str, Any]] | None = None,
           report: dict[str, Any] | None = None) -> Path:
    """A result.json as jobs on main write it (mdl.num_classes, eraser.fit, dataset.permuted_labels); a config
    without the new keys gets a result without the new sections (an old result). With `repeat` in the config:
    eraser.fit as result.json gives it ({fit_on, fit_source, n_fit, n_coded, fit_fraction, repeat})."""
    top: dict[str, Any] = {"certificate": None if cert is None else {"before": {}, "after": cert}}
    if "fit_on" in cfg["eraser"]:
        fit_on = cfg["eraser"]["fit_on"]
        split = fit_on in ("holdout", "self")
        fit = {"fit_on": fit_on, "n_fit": 5000 if fit_on == "all" else 1000, "n_coded": 5000 if fit_on == "all"
               else 4000}
        if "repeat" in cfg["eraser"]:
            fit.update(fit_source="split" if split else None, fit_fraction=0.2 if split else None,
                       repeat=cfg["eraser"]["repeat"] if split else None)
        elif fit_on == "holdout":
            fit.update(fold=cfg["eraser"]["fold"], folds=5)
        mdl = {"protocol": "prequential", "bits_per_sample": bits, "legacy": bits * 3, "num_classes": 10,
               "n_coded": fit["n_coded"], **({} if blocks is None else {"blocks": blocks})}
        permuted = {"permuted_labels": True} if cfg["dataset"].get("permute_labels") else {}
        top.update(mdl=mdl, eraser={"name": cfg["eraser"]["name"], "fit": fit, "report": report or {}},
                   dataset={"name": "mnist5k", "n": 5000, "num_classes": 10, **(dataset or {}), **permuted})
    return write_result(root, cfg, bits, **top)


def _run(root: Path, tmp_path: Path, *args: str) -> str:
    out = tmp_path / "tables"
    assert aggregate.main([str(root), "--out", str(out), "--name", "t", *args]) == 0
    return (out / "t.md").read_text()


# --- the null belongs to its cell ------------------------------------------------------------------------------

def test_null_runs_are_the_null_of_their_cell_not_a_group_or_an_eraser(tmp_path: Path) -> None:
    """control and QLEACE with their permuted-label runs: one group, two cells, the nulls in the Null control
    table of their own cell (never averaged into the cell, never paired as a seed)."""
    root = tmp_path / "runs"
    for seed in range(3):
        _write(root, _cfg("control", seed), 1.0 + 0.1 * seed)
        _write(root, _cfg("qleace", seed), 2.0 + 0.1 * seed)
        _write(root, _cfg("control", seed, null=True), (3.33, 3.34, 3.32)[seed])
        _write(root, _cfg("qleace", seed, null=True), (3.10, 3.12, 3.08)[seed])
    df, _ = aggregate_collect.collect_dir(root)
    assert groups_in(df) == ["{}"] and set(df.variant) == {""}
    assert sorted(df[df["null"]].eraser) == ["control"] * 3 + ["qleace"] * 3
    summary = aggregate_summary.summarize(df)
    assert len(summary) == 2
    assert aggregate_render.pivot(summary, "bits_per_sample") == (
        ["dataset", "arch", "w", "d", "control", "qleace"],
        [["mnist5k", "mlp_relu", "128", "2", "1.100 ± 0.100", "2.100 ± 0.100"]])
    inc = aggregate_summary.increase_over_control(df)
    assert inc[["eraser", "mean", "n"]].values.tolist() == [["qleace", pytest.approx(1.0), 3]]
    header, rows = aggregate_render.null_rows(summary)
    assert header == ["dataset", "arch", "w", "d", "eraser", "fit on", "MDL", "null MDL", "label entropy", "bias",
                      "noise", "flag", "n seeds (true / null)"]
    assert rows == [
        ["mnist5k", "mlp_relu", "128", "2", "control", "all", "1.100 ± 0.100", "3.330 ± 0.010", "3.322 (log2 K)",
         "+0.008", "0.012 (2 SE)", "ok", "3 / 3"],
        ["mnist5k", "mlp_relu", "128", "2", "qleace", "all", "2.100 ± 0.100", "3.100 ± 0.020", "3.322 (log2 K)",
         "-0.222", "0.023 (2 SE)", "⚠ injection", "3 / 3"]]
    md = _run(root, tmp_path)
    assert "## Null control (permuted labels, bits/sample)\n" in md and "Group" not in md
    table = list(csv.DictReader((tmp_path / "tables" / "t.csv").open()))
    q = next(r for r in table if r["eraser"] == "qleace")
    assert float(q["bias"]) == pytest.approx(3.10 - LOG2_10) and q["bias_flag"] == "⚠ injection"
    assert float(q["bias_noise"]) == pytest.approx(2 * 0.02 / math.sqrt(3)) and q["bias_noise_of"] == "2 SE"
    assert "does not correct an MDL" in md and "BELOW the label entropy" in md and "after the bias" not in md


def test_bias_flag_on_the_nulls_own_se_with_a_floor_and_a_null_that_does_not_match_its_cell(tmp_path: Path) -> None:
    """Control's null 0.0005 bits above log2 10 on 3 seeds (SE 0: censored) is within the 0.01-bit floor
    (was `+0.000 ⚠`); LEACE's null 0.278 above on 3 seeds is `⚠ excess`; QLEACE's null of one seed has no SE
    (`?`) and says its seeds differ from the cell's; ALF-QLEACE has no null (– with how to run it)."""
    root = tmp_path / "runs"
    for seed in range(3):
        _write(root, _cfg("control", seed, net="lenet"), 1.0 + 0.1 * seed)
        _write(root, _cfg("leace", seed, net="lenet"), 1.5 + 0.1 * seed)
        _write(root, _cfg("qleace", seed, net="lenet"), 2.5)
        _write(root, _cfg("alf_qleace", seed, net="lenet"), 2.0)
        _write(root, _cfg("control", seed, net="lenet", null=True), LOG2_10 + 0.0005)
        _write(root, _cfg("leace", seed, net="lenet", null=True), (3.60, 3.59, 3.61)[seed])
    _write(root, _cfg("qleace", 0, net="lenet", null=True), 3.00)
    df, _ = aggregate_collect.collect_dir(root)
    _, rows = aggregate_render.null_rows(aggregate_summary.summarize(df))
    by = {r[4]: r[7:] for r in rows}
    assert by["control"] == ["3.322 ± 0.000", "3.322 (log2 K)", "+0.001", "0.010 (floor)", "ok", "3 / 3"]
    assert by["leace"] == ["3.600 ± 0.010", "3.322 (log2 K)", "+0.278", "0.012 (2 SE)", "⚠ excess", "3 / 3"]
    assert by["qleace"] == ["3.000", "3.322 (log2 K)", "-0.322", "n/a (< 2 null seeds)", "?",
                            "3 / 1 (null seeds {0} vs the cell's {0, 1, 2})"]
    assert by["alf_qleace"] == ["–", "–", "–", "–", "", "3 / 0"]
    md = _run(root, tmp_path)
    assert aggregate_render.NULL_HOWTO in md and "`dataset.permute_labels=true`" in md


def test_an_unfinished_null_run_is_listed_as_one_and_is_no_missing_seed_of_its_cell(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for seed in range(2):
        _write(root, _cfg("control", seed), 1.0 + 0.1 * seed)
        _write(root, _cfg("control", seed, null=True), 3.3)
    partial = fixture_job_dir(root, _cfg("control", 2, null=True))  # the null sweep's third seed, killed
    partial.mkdir(parents=True)
    (partial / "progress.json").write_text(json.dumps({"config_hash": "x", "blocks": [{}]}))
    md = _run(root, tmp_path)
    assert "| mnist5k | mlp_relu | 128 | 2 | 1.050 ± 0.071 |" in md  # not (2/3): seed 2 is the null's
    assert f"| partial (null) | 2 | {partial} | 1 block models finished |" in md
    _, rows = aggregate_render.null_rows(aggregate_summary.summarize(aggregate_collect.collect_dir(root)[0]))
    assert rows[0][7] == "3.300 ± 0.000" and rows[0][-1] == "2 / 2"  # the unfinished null seed is no mismatch


def test_label_entropy_is_the_class_prior_where_the_result_gives_it(tmp_path: Path) -> None:
    counts = [50] * 5 + [150] * 5
    h = -sum(c / 1000 * math.log2(c / 1000) for c in counts)
    def entropy(result: dict[str, Any], mdl: dict[str, Any]) -> tuple[float, str]:
        decoded = decode_result({"config": {}, **result})
        assert isinstance(decoded, MdlResult)
        return aggregate_collect._label_entropy(decoded, MdlRecord.of(mdl))

    assert entropy({"dataset": {"class_counts": counts}}, {"num_classes": 10}) == (pytest.approx(h), "H(prior)")
    assert entropy({"certificate": {"after": {"chance_loss_bits": 3.2}}}, {"num_classes": 10}) == (3.2, "H(prior)")
    assert entropy({"dataset": {"num_classes": 4}}, {}) == (2.0, "log2 K")
    assert entropy({"dataset": {"class_counts": [1, -1]}}, {"num_classes": 8}) == (3.0, "log2 K")  # not counts
    root = tmp_path / "runs"
    for seed in range(2):
        _write(root, _cfg("control", seed), 1.0)
        _write(root, _cfg("control", seed, null=True), 3.2, dataset={"class_counts": counts})
    _, rows = aggregate_render.null_rows(aggregate_summary.summarize(aggregate_collect.collect_dir(root)[0]))
    assert rows[0][8:10] == [f"{h:.3f} (H(prior))", f"{3.2 - h:+.3f}"]


# --- folds and fit_on -------------------------------------------------------------------------------------------

def test_folds_of_a_cell_are_combined_and_listed(tmp_path: Path) -> None:
    """Cross-fitting: 5 folds × 2 seeds of control and QLEACE fitted on a holdout (control's seed 1 never ran
    fold 3), next to both fitted on all: one group, no variant; per cell the mean over folds × seeds, sd over
    seeds of the per-seed means, the folds listed; increase over control paired by seed (each seed's fold mean)
    and only with the control fitted the same way; a null over folds."""
    root = tmp_path / "runs"
    for seed in range(2):
        _write(root, _cfg("control", seed), 0.9 + 0.1 * seed)
        _write(root, _cfg("qleace", seed), 1.9 + 0.1 * seed)
        for fold in range(5):
            if (seed, fold) != (1, 3):
                _write(root, _cfg("control", seed, fit_on="holdout", fold=fold), 1.0 + 0.1 * seed + 0.01 * fold)
            _write(root, _cfg("qleace", seed, fit_on="holdout", fold=fold), 2.0 + 0.1 * seed + 0.01 * fold)
    for fold in range(5):
        _write(root, _cfg("qleace", 0, fit_on="holdout", fold=fold, null=True), 3.40)
    df, _ = aggregate_collect.collect_dir(root)
    assert groups_in(df) == ["{}"] and set(df.variant) == {""}
    summary = aggregate_summary.summarize(df)
    assert len(summary) == 4
    header, rows = aggregate_render.pivot(summary, "bits_per_sample")
    control_mean = (5.10 + 4.47) / 9  # seed 0: folds 0-4; seed 1: folds 0, 1, 2, 4
    control_sd = abs(5.10 / 5 - 4.47 / 4) / math.sqrt(2)
    assert header == ["dataset", "arch", "w", "d", "fit on", "control", "qleace"]
    assert rows == [
        ["mnist5k", "mlp_relu", "128", "2", "all", "0.950 ± 0.071", "1.950 ± 0.071"],
        ["mnist5k", "mlp_relu", "128", "2", "holdout",
         f"{control_mean:.3f} ± {control_sd:.3f} (9/10) [repeats 0–4]", "2.070 ± 0.071 [repeats 0–4]"]]
    cell = summary[(summary.eraser == "control") & (summary.fit_on == "holdout")].iloc[0]
    assert (cell.n, cell.n_expected, cell.n_seeds, cell.missing_seeds) == (9, 10, 2, "1r3:missing")
    inc = aggregate_summary.increase_over_control(df).set_index("fit_on")
    assert inc.loc["all", "mean"] == pytest.approx(1.0)
    assert inc.loc["holdout", "mean"] == pytest.approx(((2.02 - 1.02) + (2.12 - 4.47 / 4)) / 2)
    assert list(inc.n) == [2, 2]
    _, nulls = aggregate_render.null_rows(summary)
    q = next(r for r in nulls if r[4:6] == ["qleace", "holdout"])
    assert q[7:] == ["3.400 [repeats 0–4]", "3.322 (log2 K)", f"{3.40 - LOG2_10:+.3f}", "n/a (< 2 null seeds)", "?",
                     "2 / 1 (null seeds {0} vs the cell's {0, 1})"]
    assert not any(r[4:6] == ["qleace", "all"] and r[7] != "–" for r in nulls)  # the holdout null stays there
    md = _run(root, tmp_path)
    assert "| mnist5k | mlp_relu | 128 | 2 | holdout | +1.001 ± 0.002 |" in md


def test_fit_on_is_a_variant_of_the_eraser_shown_separately(tmp_path: Path) -> None:
    """LEACE fitted on all and on a holdout (one fold), control on all only: one group, two rows told apart by
    `fit on`; the holdout row has no control to pair with (never the control of the other row); the claim is
    tested on the row that has both; the certificate table has a `fit on` column."""
    root = tmp_path / "runs"
    cert = {"max_mean_gap": 0.0, "max_cov_gap": 0.1, "linear_probe_acc": 0.1, "quadratic_probe_acc": 0.2,
            "chance": 0.1}
    for seed in range(5):
        _write(root, _cfg("control", seed), 1.0 + 0.1 * seed)
        _write(root, _cfg("leace", seed), 1.5 + 0.1 * seed, cert=cert)
        _write(root, _cfg("leace", seed, fit_on="holdout"), 1.2 + 0.1 * seed, cert=cert)
    df, _ = aggregate_collect.collect_dir(root)
    assert groups_in(df) == ["{}"] and set(df.variant) == {""} and set(df.fit_on) == {"all", "holdout"}
    summary = aggregate_summary.summarize(df)
    header, rows = aggregate_render.pivot(summary, "bits_per_sample")
    assert header == ["dataset", "arch", "w", "d", "fit on", "control", "leace"]
    assert rows == [["mnist5k", "mlp_relu", "128", "2", "all", "1.200 ± 0.158", "1.700 ± 0.158"],
                    ["mnist5k", "mlp_relu", "128", "2", "holdout", "missing", "1.400 ± 0.158 [repeat 0 of 5]"]]
    inc = aggregate_summary.increase_over_control(df)
    assert inc[["fit_on", "eraser", "mean"]].values.tolist() == [["all", "leace", pytest.approx(0.5)]]
    (claim, tests, verdict), = claims.evaluate(df, ["leace_raises_mdl"])
    assert [t.row for t in tests] == ["mnist5k mlp_relu w128 d2"] and verdict == "uncontrolled"  # no shuffled fit
    header, rows = aggregate_render.certificate_rows(summary)
    assert header[:3] == ["dataset", "fit on", "eraser"]
    assert sorted(r[:3] for r in rows) == [["mnist5k", "all", "control"], ["mnist5k", "all", "leace"],
                                           ["mnist5k", "holdout", "leace"]]


def test_old_results_without_the_new_keys_aggregate_with_new_ones_as_before(tmp_path: Path) -> None:
    """Results written before eraser.fit_on/fold/fit_fraction/after_augment and dataset.permute_labels ran exactly
    like their defaults: next to new results at those defaults they are one group, one cell per eraser, and the
    tables look as they did (no `fit on` column, no variant)."""
    root = tmp_path / "runs"
    for seed in range(3):
        _write(root, _cfg("control", seed, fit_on=None, null=None), 1.0 + 0.1 * seed)  # old
        _write(root, _cfg("leace", seed, fit_on=None, null=None), 1.4 + 0.1 * seed)  # old
        _write(root, _cfg("leace", seed + 3), 1.8 + 0.1 * seed)  # new, at the defaults, seeds 3-5
    df, _ = aggregate_collect.collect_dir(root)
    assert groups_in(df) == ["{}"] and set(df.variant) == {""} and not df["null"].any()
    summary = aggregate_summary.summarize(df)
    assert aggregate_render.pivot(summary, "bits_per_sample") == (
        ["dataset", "arch", "w", "d", "control", "leace"],
        [["mnist5k", "mlp_relu", "128", "2", "1.100 ± 0.100 (3/6)", "1.700 ± 0.237"]])
    md = _run(root, tmp_path)
    assert "| mnist5k | mlp_relu | 128 | 2 | +0.400 ± 0.000 |" in md
    assert aggregate_render.NO_NULL in md and "fit on" not in md


# --- the certificate's out-of-sample probes -------------------------------------------------------------------

def _probe(acc: float, acc_z: float, loss: float, loss_z: float, verdict: str | None) -> dict[str, Any]:
    out: dict[str, Any] = {"acc": acc, "acc_se": 0.004, "acc_z": acc_z, "loss_bits": loss, "loss_se": 0.005,
                           "loss_z": loss_z}
    if verdict is not None:
        out.update(below_chance=verdict == "dependence artefact", verdict=verdict)
    return out


def _cert(linear: dict[str, Any], quadratic: dict[str, Any]) -> dict[str, Any]:
    cert: dict[str, Any] = {"max_mean_gap": 1e-12, "max_cov_gap": 0.2, "chance": 0.1, "chance_loss_bits": LOG2_10}
    for name, scores in (("linear", linear), ("quadratic", quadratic)):
        cert.update({f"{name}_probe_{k}": v for k, v in scores.items()})
    return cert


def test_certificate_table_shows_out_of_sample_and_mlp_probes_and_a_below_chance_probe_as_an_artefact(
        tmp_path: Path) -> None:
    """LEACE: the linear probe below chance by 7 SE in seed 0 (an in-sample fit's dependence artefact), not in
    seed 1; QLEACE: no stored verdict, its z-scores say below chance by > 3 SE; control: information."""
    root = tmp_path / "runs"
    nothing = _probe(0.1, 0.1, 3.322, -0.2, "no information detected")
    _write(root, _cfg("leace", 0), 1.5, cert=_cert(_probe(0.07, -7.2, 3.36, -7.6, "dependence artefact"), nothing))
    _write(root, _cfg("leace", 1), 1.6, cert=_cert(_probe(0.09, -1.0, 3.34, -1.0, "no information detected"),
                                                   nothing))
    _write(root, _cfg("qleace", 0), 2.5, cert=_cert(nothing, _probe(0.085, -3.5, 3.35, -2.0, None)))
    _write(root, _cfg("control", 0), 1.0, cert=_cert(_probe(0.8, 50.0, 1.0, 60.0, "information"), nothing))
    df, _ = aggregate_collect.collect_dir(root)
    header, rows = aggregate_render.certificate_rows(aggregate_summary.summarize(df))
    assert header[:12] == ["dataset", "eraser", "mean gap", "cov gap", "linear probe acc ± SE",
                           "linear probe loss ± SE (bits)", "quadratic probe acc ± SE",
                           "quadratic probe loss ± SE (bits)", "chance acc / loss (bits)", "probe verdict",
                           "working rank", "variance dropped"]
    by = {r[1]: r[2:10] for r in rows}
    assert by["leace"] == ["1e-12", "0.2", "0.080 ± 0.004", "3.350 ± 0.005", "0.100 ± 0.004", "3.322 ± 0.005",
                           "0.100 / 3.322", "dependence artefact (linear; 1/2 runs)"]
    assert by["qleace"][-1] == "dependence artefact (quadratic)"
    assert by["control"][-1] == "information (linear)"
    md = _run(root, tmp_path)
    assert "✓" not in md
    # the MLP probe (newer than the others) gets its columns once a result has it; its below-chance flag makes the
    # cell a dependence artefact like the others'
    root = tmp_path / "mlp"
    cert = _cert(nothing, nothing)
    cert.update({f"mlp_probe_{k}": v for k, v in _probe(0.05, -9.0, 3.5, -8.0, "dependence artefact").items()})
    _write(root, _cfg("qleace", 0), 2.5, cert=cert)
    _write(root, _cfg("control", 0), 1.0, cert=_cert(nothing, nothing))
    summary = aggregate_summary.summarize(aggregate_collect.collect_dir(root)[0])
    header, rows = aggregate_render.certificate_rows(summary)
    assert header[8:12] == ["mlp probe acc ± SE", "mlp probe loss ± SE (bits)", "chance acc / loss (bits)",
                            "probe verdict"]
    by = {r[1]: r[2:12] for r in rows}
    assert by["qleace"][6:] == ["0.050 ± 0.004", "3.500 ± 0.005", "0.100 / 3.322", "dependence artefact (mlp)"]
    assert by["control"][6] == "n/a" and by["control"][-1] == "no information detected"


# --- brackets, fit and budget (result.json keys), claims on them ----------------------------------------------------

def _blocks(at_cap: int, total: int = 4) -> list[dict[str, Any]]:
    """Block models: `at_cap` stopped by max_epochs with their best epoch at the end, the rest by patience."""
    return [{"block": i + 2, "epochs": 60, "best_epoch": 59 if i < at_cap else 20,
             "stop_reason": "max_epochs" if i < at_cap else "patience"} for i in range(total)]


def _bracket_root(root: Path, qleace_holdout: float = 0.5, qleace_cap: int = 0) -> None:
    """5 seeds × 2 repeats: control on a holdout split; LEACE and QLEACE fitted on a holdout and on the coded rows
    (self), the same 4000 coded rows; QLEACE's holdout null injects the label (codes at 0.34)."""
    rank = {"holdout": {"working_rank": 99, "d": 595, "variance_dropped_fraction": 0.093},
            "self": {"working_rank": 499, "d": 595, "variance_dropped_fraction": 0.0007}}
    for seed in range(5):
        for rep in range(2):
            w = 0.01 * seed + 0.002 * rep - 0.001  # the mean over repeats: 0.01 · seed
            _write(root, _cfg("control", seed, fit_on="holdout", fold=rep, repeat=True), 0.83 + w, blocks=_blocks(0))
            for fit_on, leace, qleace in (("holdout", 1.92, qleace_holdout), ("self", 2.10, 3.33)):
                _write(root, _cfg("leace", seed, fit_on=fit_on, fold=rep, repeat=True), leace + w, blocks=_blocks(0))
                _write(root, _cfg("qleace", seed, fit_on=fit_on, fold=rep, repeat=True), qleace + w,
                       blocks=_blocks(qleace_cap), report=rank[fit_on])
            _write(root, _cfg("qleace", seed, fit_on="holdout", fold=rep, repeat=True, null=True), 0.34 + w)


def test_interface_keys_give_brackets_fit_budget_and_claims_per_cell(tmp_path: Path) -> None:
    """eraser.repeat is the repeat (averaged like folds were), fit_source/n_fit do not split a cell; the bracket
    table pairs holdout with self at n coded 4000; the fit and budget table shows n fit, n coded, working rank,
    variance dropped, block stop reasons and the at-cap share (QLEACE: 3 of 4 block models at the cap in every
    run: budget-bound; the others: none). The claims (aggregate.py --claims): LEACE over control separates on its
    bracket but, without its shuffled fit, is uncontrolled; QLEACE over LEACE is inconclusive (its bracket contains
    LEACE's); with QLEACE's holdout at 2.5 its bracket separates from LEACE's, but QLEACE is budget-bound; without
    the block models at the cap it is supported."""
    root = tmp_path / "runs"
    _bracket_root(root, qleace_cap=3)
    df, _ = aggregate_collect.collect_dir(root)
    assert groups_in(df) == ["{}"] and set(df.variant) == {""} and sorted(set(df.fold)) == [0, 1]
    summary = aggregate_summary.summarize(df)
    bracket = aggregate_render.bracket_rows(summary)
    assert bracket is not None
    header, rows = bracket
    assert header == ["dataset", "arch", "w", "d", "n coded", "control", "leace", "qleace"]
    assert rows == [["mnist5k", "mlp_relu", "128", "2", "4000", "0.850 (holdout only)", "[1.940, 2.120]",
                     "[0.520, 3.350]"]]
    header, rows = aggregate_render.fit_budget_rows(summary)
    assert header == ["dataset", "arch", "w", "d", "fit on", "eraser", "MDL", "n fit", "rows/class/d", "n coded",
                      "rank-irregular", "working rank", "variance dropped", "block stops", "at cap", "budget"]
    by = {(r[5], r[4]): r[6:] for r in rows}
    assert by[("qleace", "holdout")][1:] == ["as fitted on 1000 rows", "n/a", "4000", "n/a", "99/595", "9.30%",
                                             "patience 10, max_epochs 30", "75% of 40",
                                             "budget-bound: 75% at cap (no validation trend recorded)"]
    assert by[("qleace", "self")][5:] == ["499/595", "0.07%", "patience 10, max_epochs 30", "75% of 40",
                                          "budget-bound: 75% at cap (no validation trend recorded)"]
    assert by[("leace", "self")][7:] == ["patience 40", "0% of 40", ""]
    md = _run(root, tmp_path)
    assert "## Brackets at equal n coded (bits/sample)" in md and "## Fit and training budget" in md
    assert "[repeats 0–1]" in md
    # the claims on them, QLEACE not at the cap
    root = tmp_path / "uncapped"
    _bracket_root(root)
    df, _ = aggregate_collect.collect_dir(root)
    results = {c.key: (tests, verdict) for c, tests, verdict in claims.evaluate(df)}
    (leace,), verdict = results["leace_raises_mdl"]
    assert (leace.row, leace.verdict, verdict) == ("mnist5k mlp_relu w128 d2 (fit on [holdout, self])",
                                                   "uncontrolled", "uncontrolled")
    assert 'ARGS="eraser=leace eraser.fit_on=holdout,self eraser.fit_labels=shuffled"' in leace.why
    assert leace.margins == pytest.approx({s: 1.92 - 0.83 for s in range(5)})
    assert results["qleace_above_leace"][1] == "inconclusive"  # brackets [0.5, 3.33] and [1.92, 2.10] overlap
    for cap, expected in ((3, "budget-bound"), (0, "supported")):
        other = tmp_path / f"cap{cap}"
        _bracket_root(other, qleace_holdout=2.5, qleace_cap=cap)
        (_, tests, verdict), = claims.evaluate(aggregate_collect.collect_dir(other)[0], ["qleace_above_leace"])
        assert verdict == expected and tests[0].bracket
    _run(root, tmp_path / "claims", "--claims")
    report = (tmp_path / "claims" / "tables" / "t_claims.md").read_text()
    assert f"- {claims.CLAIMS['leace_raises_mdl'].text}: **uncontrolled**" in report
    assert "after the bias" not in report and "Holm" in report

