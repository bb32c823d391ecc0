"""Issue 21 (requirements 2 and 3), the aggregate's side: eraser.fit_on is part of the eraser's identity, the folds
of a cross-fitted cell are one cell, a permuted-label run is the null of its cell (bias = null MDL − label entropy,
flagged against seed noise), the certificate's out-of-sample probes, and claims once the bias is accounted for.

Fixtures are hand-written result.json files (no training).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

import pytest

from scripts import aggregate, aggregate_collect, aggregate_render, aggregate_summary, claims
from scripts.tables import groups_in
from tests.helpers import fixture_job_dir

LOG2_10 = math.log2(10)


def _cfg(eraser: str, seed: int, *, fit_on: str | None = "all", fold: int = 0, null: bool | None = False,
         net: str = "mlp_relu", width: int = 128) -> dict[str, Any]:
    """A stored config; fit_on=None / null=None: written before eraser.fit_on / dataset.permute_labels existed."""
    cfg: dict[str, Any] = {"task": "mdl", "seed": seed, "dataset": {"name": "mnist5k", "tag": "mnist5k"},
                           "eraser": {"name": eraser, "options": {}},
                           "arch": {"name": net.split("_")[0], "tag": net, "width": width, "depth": 2},
                           "mdl": {"protocol": "prequential"}}
    if fit_on is not None:
        cfg["eraser"].update(fit_on=fit_on, fit_fraction=0.2, fold=fold, after_augment=False)
    if null is not None:
        cfg["dataset"]["permute_labels"] = null
    return cfg


def _write(root: Path, cfg: dict[str, Any], bits: float, cert: dict[str, Any] | None = None,
           dataset: dict[str, Any] | None = None) -> Path:
    """A result.json as jobs on main write it (mdl.num_classes, eraser.fit, dataset.permuted_labels); a config
    without the new keys gets a result without the new sections (an old result)."""
    new = "fit_on" in cfg["eraser"]
    result: dict[str, Any] = {
        "config_hash": "fixture", "hash_version": 2, "config": cfg,
        "mdl": {"protocol": "prequential", "bits_per_sample": bits, "legacy": bits * 3},
        "final": {"val_loss_bits": 0.5, "val_loss_curve": [[10, 0.3], [20, 0.2]]},
        "certificate": None if cert is None else {"before": {}, "after": cert}}
    if new:
        fit_on = cfg["eraser"]["fit_on"]
        fit = {"fit_on": fit_on, "n_fit": 5000 if fit_on == "all" else 1000, "n_coded": 5000 if fit_on == "all"
               else 4000}
        if fit_on == "holdout":
            fit.update(fold=cfg["eraser"]["fold"], folds=5)
        result["mdl"].update(num_classes=10, n_coded=fit["n_coded"])
        result["eraser"] = {"name": cfg["eraser"]["name"], "fit": fit, "report": {}}
        result["dataset"] = {"name": "mnist5k", "n": 5000, "num_classes": 10, **(dataset or {})}
        if cfg["dataset"].get("permute_labels"):
            result["dataset"]["permuted_labels"] = True
    job_dir = fixture_job_dir(root, cfg)
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / "result.json").write_text(json.dumps(result))
    return job_dir


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
                      "noise (2 SE)", "flag", "n seeds (true / null)"]
    assert rows == [
        ["mnist5k", "mlp_relu", "128", "2", "control", "all", "1.100 ± 0.100", "3.330 ± 0.010", "3.322 (log2 K)",
         "+0.008", "0.115 (true)", "ok", "3 / 3"],
        ["mnist5k", "mlp_relu", "128", "2", "qleace", "all", "2.100 ± 0.100", "3.100 ± 0.020", "3.322 (log2 K)",
         "-0.222", "0.115 (true)", "⚠", "3 / 3"]]
    md = _run(root, tmp_path)
    assert "## Null control (permuted labels, bits/sample)\n" in md and "Group" not in md
    table = list(csv.DictReader((tmp_path / "tables" / "t.csv").open()))
    q = next(r for r in table if r["eraser"] == "qleace")
    assert float(q["bias"]) == pytest.approx(3.10 - LOG2_10) and q["bias_flag"] == "⚠"
    assert float(q["bias_noise"]) == pytest.approx(2 * 0.1 / math.sqrt(3)) and q["bias_noise_of"] == "true"


def test_bias_flag_above_and_below_the_noise_and_where_the_noise_comes_from(tmp_path: Path) -> None:
    """One null seed: the noise is 2 SE of the cell's true-label MDL over seeds (said: `true`); the bias of
    control (+0.278) is above it, LEACE's (+0.078) below; a missing null reads – with how to run it."""
    root = tmp_path / "runs"
    for seed in range(3):
        _write(root, _cfg("control", seed, net="lenet"), 1.0 + 0.1 * seed)
        _write(root, _cfg("leace", seed, net="lenet"), 1.5 + 0.1 * seed)
        _write(root, _cfg("qleace", seed, net="lenet"), 2.5)
    _write(root, _cfg("control", 0, net="lenet", null=True), 3.60)
    _write(root, _cfg("leace", 0, net="lenet", null=True), 3.40)
    df, _ = aggregate_collect.collect_dir(root)
    _, rows = aggregate_render.null_rows(aggregate_summary.summarize(df))
    noise = 2 * 0.1 / math.sqrt(3)  # sd 0.1 over 3 seeds
    assert [r[4:] for r in rows] == [
        ["control", "all", "1.100 ± 0.100", "3.600", "3.322 (log2 K)", f"{3.60 - LOG2_10:+.3f}", f"{noise:.3f} (true)",
         "⚠", "3 / 1"],
        ["leace", "all", "1.600 ± 0.100", "3.400", "3.322 (log2 K)", f"{3.40 - LOG2_10:+.3f}", f"{noise:.3f} (true)",
         "ok", "3 / 1"],
        ["qleace", "all", "2.500 ± 0.000", "–", "–", "–", "–", "", "3 / 0"]]
    md = _run(root, tmp_path)
    assert aggregate_render.NULL_HOWTO in md and "`dataset.permute_labels=true`" in md
    # The rule itself: 2 × the larger SE of the null and the true-label MDL (each with ≥ 2 seeds), else unknown
    # ("?"): a null coding at exactly the uniform code every seed (SE 0) does not make every bias significant.
    from scripts.tables import bias_flag, bias_noise

    assert bias_noise([3.0, 3.2], [1.0, 1.01]) == (pytest.approx(2 * math.sqrt(0.02) / math.sqrt(2)), "null")
    assert bias_noise([3.3219, 3.3219], [1.0, 2.0]) == (pytest.approx(2 * math.sqrt(0.5) / math.sqrt(2)), "true")
    assert bias_noise([3.0], [1.0, 1.2]) == (pytest.approx(2 * math.sqrt(0.02) / math.sqrt(2)), "true")
    assert math.isnan(bias_noise([3.0], [1.0])[0]) and bias_flag(0.5, math.nan) == "?"
    assert (bias_flag(0.2, 0.1), bias_flag(-0.2, 0.1), bias_flag(0.05, 0.1)) == ("⚠", "⚠", "ok")


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
    assert rows[0][7] == "3.300 ± 0.000" and rows[0][-1] == "2 / 2"


def test_label_entropy_is_the_class_prior_where_the_result_gives_it(tmp_path: Path) -> None:
    counts = [50] * 5 + [150] * 5
    h = -sum(c / 1000 * math.log2(c / 1000) for c in counts)
    assert aggregate_collect._label_entropy({"dataset": {"class_counts": counts}}, {"num_classes": 10}) == \
        (pytest.approx(h), "H(prior)")
    cert = {"after": {"chance_loss_bits": 3.2}}
    assert aggregate_collect._label_entropy({"certificate": cert}, {"num_classes": 10}) == (3.2, "H(prior)")
    assert aggregate_collect._label_entropy({"dataset": {"num_classes": 4}}, {}) == (2.0, "log2 K")
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
        ["mnist5k", "mlp_relu", "128", "2", "holdout", f"{control_mean:.3f} ± {control_sd:.3f} (9/10) [folds 0–4]",
         "2.070 ± 0.071 [folds 0–4]"]]
    cell = summary[(summary.eraser == "control") & (summary.fit_on == "holdout")].iloc[0]
    assert (cell.n, cell.n_expected, cell.n_seeds, cell.missing_seeds) == (9, 10, 2, "1f3:missing")
    inc = aggregate_summary.increase_over_control(df).set_index("fit_on")
    assert inc.loc["all", "mean"] == pytest.approx(1.0)
    assert inc.loc["holdout", "mean"] == pytest.approx(((2.02 - 1.02) + (2.12 - 4.47 / 4)) / 2)
    assert list(inc.n) == [2, 2]
    _, nulls = aggregate_render.null_rows(summary)
    q = next(r for r in nulls if r[4:6] == ["qleace", "holdout"])
    assert q[7:] == ["3.400 [folds 0–4]", "3.322 (log2 K)", f"{3.40 - LOG2_10:+.3f}", "0.100 (true)", "ok", "2 / 1"]
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
    for seed in range(3):
        _write(root, _cfg("control", seed), 1.0 + 0.1 * seed)
        _write(root, _cfg("leace", seed), 1.5 + 0.1 * seed, cert=cert)
        _write(root, _cfg("leace", seed, fit_on="holdout"), 1.2 + 0.1 * seed, cert=cert)
    df, _ = aggregate_collect.collect_dir(root)
    assert groups_in(df) == ["{}"] and set(df.variant) == {""} and set(df.fit_on) == {"all", "holdout"}
    summary = aggregate_summary.summarize(df)
    header, rows = aggregate_render.pivot(summary, "bits_per_sample")
    assert header == ["dataset", "arch", "w", "d", "fit on", "control", "leace"]
    assert rows == [["mnist5k", "mlp_relu", "128", "2", "all", "1.100 ± 0.100", "1.600 ± 0.100"],
                            ["mnist5k", "mlp_relu", "128", "2", "holdout", "missing", "1.300 ± 0.100 [fold 0 of 5]"]]
    inc = aggregate_summary.increase_over_control(df)
    assert inc[["fit_on", "eraser", "mean"]].values.tolist() == [["all", "leace", pytest.approx(0.5)]]
    (claim, tests, verdict), = claims.evaluate(df, ["leace_raises_mdl"])
    assert [t.row for t in tests] == ["mnist5k mlp_relu w128 d2"] and verdict == "holds"
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
    out = {"acc": acc, "acc_se": 0.004, "acc_z": acc_z, "loss_bits": loss, "loss_se": 0.005, "loss_z": loss_z}
    if verdict is not None:
        out.update(below_chance=verdict == "dependence artefact", verdict=verdict)
    return out


def _cert(linear: dict[str, Any], quadratic: dict[str, Any]) -> dict[str, Any]:
    cert: dict[str, Any] = {"max_mean_gap": 1e-12, "max_cov_gap": 0.2, "chance": 0.1, "chance_loss_bits": LOG2_10}
    for name, scores in (("linear", linear), ("quadratic", quadratic)):
        cert.update({f"{name}_probe_{k}": v for k, v in scores.items()})
    return cert


def test_certificate_table_shows_out_of_sample_probes_and_a_below_chance_probe_as_an_artefact(
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


# --- claims once the bias is accounted for ----------------------------------------------------------------------

def test_claims_report_which_claims_survive_the_bias(tmp_path: Path) -> None:
    """LEACE raises MDL over control by 0.1 on the MLP, but its null's bias is 0.3 above control's: the claim holds
    only before the bias there; on LeNet (+0.5, bias difference 0.1) it holds; on ConvNeXt there is no null."""
    root = tmp_path / "runs"
    cases = {"mlp_relu": (0.1, 3.32, 3.62), "lenet": (0.5, 3.32, 3.42), "convnext": (0.3, None, None)}
    for net, (gain, control_null, leace_null) in cases.items():
        for seed in range(3):
            _write(root, _cfg("control", seed, net=net), 1.0 + 0.1 * seed)
            _write(root, _cfg("leace", seed, net=net), 1.0 + gain + 0.1 * seed)
            if control_null is not None:
                _write(root, _cfg("control", seed, net=net, null=True), control_null)
                _write(root, _cfg("leace", seed, net=net, null=True), leace_null)
    df, _ = aggregate_collect.collect_dir(root)
    (claim, tests, verdict), = claims.evaluate(df, ["leace_raises_mdl"])
    got = {t.row.split()[1]: (t.verdict, t.bias_verdict) for t in tests}
    assert got == {"mlp_relu": ("holds", "holds only before the bias"), "lenet": ("holds", "holds"),
                   "convnext": ("holds", "bias unknown (no null run)")}
    mlp = next(t for t in tests if "mlp_relu" in t.row)
    assert mlp.diffs == pytest.approx({0: 0.1, 1: 0.1, 2: 0.1})  # the null runs are no seeds of the cell
    assert mlp.bias_a - mlp.bias_b == pytest.approx(0.3)
    assert verdict == "holds" and claims.overall_after_bias(tests) == "holds only before the bias"
    only_convnext = df[df.arch == "convnext"]
    (_, tests, _), = claims.evaluate(only_convnext, ["leace_raises_mdl"])
    assert claims.overall_after_bias(tests) == "bias unknown (no null run)"
    _run(root, tmp_path, "--claims")
    report = (tmp_path / "tables" / "t_claims.md").read_text()
    assert ("- LEACE raises MDL for every architecture (MDL(leace) - MDL(control) > 0): **holds**; after the bias: "
            "**holds only before the bias**") in report
    assert "| +0.300 | holds only before the bias |" in report


def test_a_claim_that_fails_before_and_after_the_bias_does_not_hold() -> None:
    """Hand-built job table: LEACE lower than control on every seed, and its bias makes it no better."""
    import pandas as pd

    rows = []
    for seed in range(3):
        for eraser, bits, null in (("control", 1.2, 3.3), ("leace", 1.0, 3.4)):
            rows.append({"dataset": "d", "arch": "mlp_relu", "width": 128, "depth": 2, "variant": "", "fit_on": "all",
                         "eraser": eraser, "seed": seed, "status": "done", "bits_per_sample": bits, "null": False,
                         "ref_bits": LOG2_10})
            rows.append({**rows[-1], "bits_per_sample": null, "null": True})
    (_, tests, verdict), = claims.evaluate(pd.DataFrame(rows), ["leace_raises_mdl"])
    assert (verdict, tests[0].bias_verdict) == ("does not hold", "does not hold")
