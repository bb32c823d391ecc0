"""The MDL task's tables (`Mdl.rows`, __init__.py: `mdl_tables`) for scripts/aggregate.py: the job table
aggregate_collect.py made, summarised by aggregate_summary.py, written here as Markdown (one section per comparison
group), CSV, LaTeX and plots (training/analysis/aggregate_plots.py); and the ERM-vs-SD table of MDL jobs that ran
with a regularizer. The tables of other tasks: their packages (training/tasks/gs/aggregate_gs.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import pandas as pd

from training.analysis.aggregate_plots import plot_all
from training.analysis.tables import (
    BUDGET_BITS,
    BUDGET_SHARE,
    ESTIMABLE_ROWS_PER_CLASS_DIM,
    INJECTION,
    MISSING_KEY,
    NOISE_SE,
    NULL_FLOOR,
    PROBES,
    CellRow,
    differing_keys,
    eraser_order,
    group_label,
    group_labels,
    grouped,
    groups_in,
    is_identity,
    md_table,
    mean_sd,
    method_of_stored,
    require_one_group,
)
from training.app.result_codec import config_view
from training.app.result_types import Result
from training.app.tasks import Collected
from training.tasks.mdl.aggregate_collect import (
    CAP_TAIL,
    CELL,
    CERT,
    PAPER_RULE,
    ROW_KEY,
    UNKNOWN_COMMIT,
)
from training.tasks.mdl.aggregate_summary import ARTEFACT, cell_name, increase_over_control, summarize
from training.tasks.mdl.result import MdlResult

LABEL_NAMES = {"dataset": "dataset", "arch": "arch", "width": "w", "depth": "d", "fit_on": "fit on",
               "variant": "variant"}  # the row label columns of a table (fit on, variant: only when they vary)
MIXED = "†"  # a cell whose seeds come from different commits
MIXED_NUMERICS = "§"  # a cell whose seeds ran under different numerics signatures (training/engine/numerics.py)
MIXED_DATA = "‡"  # a cell whose runs were computed on different data (dataset.fingerprint): not averaged
# Paper Appendix C (CIFAR-10, legacy MDL units, 5 seeds; Quirke & Belrose 2025, App. C): (mean, sd).
PAPER_TABLE_C: dict[str, dict[str, tuple[float, float]]] = {
    "MLP": {"control": (7.14, 0.05), "leace": (8.49, 0.10), "alf_qleace": (8.94, 0.14),
            "gradient": (10.02, 0.08), "qleace": (11.41, 0.00)},
    "LeNet": {"control": (5.62, 0.02), "leace": (6.59, 0.28), "alf_qleace": (6.83, 0.11),
              "gradient": (8.71, 0.09), "qleace": (8.68, 0.24)},
    "ConvNeXtV2": {"control": (5.09, 0.09), "leace": (5.20, 0.15), "alf_qleace": (4.92, 0.05),
                   "gradient": (5.37, 0.02), "qleace": (1.67, 0.20)},
    "Swin V2": {"control": (8.18, 0.03), "leace": (9.00, 0.13), "alf_qleace": (8.67, 1.20),
                "gradient": (9.29, 0.06), "qleace": (9.08, 0.13)},
}
PAPER_ARCHS = {"MLP": ("mlp_relu", 128, 2), "LeNet": ("lenet", 128, 2), "ConvNeXtV2": ("convnext", 40, 2),
               "Swin V2": ("swin", 40, 2)}
PAPER_ERASER_NAMES = {"control": "Control", "leace": "LEACE", "alf_qleace": "ALF-QLEACE",
                      "gradient": "Gradient Quadratic", "qleace": "QLEACE"}


def fmt(mean: float, sd: float, digits: int = 3) -> str:
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.{digits}f} ± {sd:.{digits}f}" if not math.isnan(sd) else f"{mean:.{digits}f}"


def _na(v: float, spec: str) -> str:
    return "n/a" if math.isnan(v) else format(v, spec)


def _cell_text(rec: pd.Series | None, metric: str, digits: int = 3) -> str:
    if rec is None:
        return "missing"
    if rec["n"] == 0:
        states = {s.split(":", 1)[1] for s in str(rec["missing_seeds"]).split()}
        return "failed" if "failed" in states else "incomplete" if states & {"incomplete", "malformed"} \
            else "missing"
    cell = CellRow.of(rec)
    if cell.mixed_data:
        return f"different data {MIXED_DATA}"
    text = fmt(rec[f"{metric}_mean"], rec[f"{metric}_sd"], digits)
    text += f" ({rec['n']}/{rec['n_expected']})" if rec["n"] < rec["n_expected"] else ""
    text += f" [{cell.folds}]" if cell.folds else ""
    return text + (f" {MIXED}" if cell.mixed_commits else "") + (f" {MIXED_NUMERICS}" if cell.mixed_numerics else "")


def _row_keys(summary: pd.DataFrame) -> list[tuple[Any, ...]]:
    """Table rows in order of appearance, a row fitted on all before its holdout twin."""
    keys = list(dict.fromkeys(tuple(r) for r in summary[ROW_KEY].itertuples(index=False)))
    at = ROW_KEY.index("fit_on")
    first = {k[:at]: i for i, k in reversed(list(enumerate(keys)))}
    return sorted(keys, key=lambda k: (first[k[:at]], k[at] != "all"))


def _label_columns(summary: pd.DataFrame, fit_on: bool = True) -> list[str]:
    """Row-label columns: dataset, arch, width, depth; `fit_on` when some row was fitted on a holdout, `variant`
    when some row has one."""
    cols = ["dataset", "arch", "width", "depth"]
    if fit_on and "fit_on" in summary and (summary.fit_on != "all").any():
        cols.append("fit_on")
    return cols + (["variant"] if (summary.variant != "").any() else [])


def _by_cell(summary: pd.DataFrame) -> dict[tuple[Any, ...], pd.Series]:
    return {tuple(k): r for k, (_, r) in zip(summary[CELL].itertuples(index=False), summary.iterrows(), strict=True)}


def _table(summary: pd.DataFrame, erasers: list[str], text: Callable[[tuple[Any, ...]], str]) -> tuple[
        list[str], list[list[str]]]:
    """One table (rows × erasers, `text` of each cell's key) of one group; refused over several groups."""
    require_one_group(summary, "a table")
    cols = _label_columns(summary)
    rows = [[str(v) for c, v in zip(ROW_KEY, key, strict=True) if c in cols] + [text((*key, e)) for e in erasers]
            for key in _row_keys(summary)]
    return [*[LABEL_NAMES[c] for c in cols], *erasers], rows


def pivot(summary: pd.DataFrame, metric: str, digits: int = 3) -> tuple[list[str], list[list[str]]]:
    index = _by_cell(summary)
    return _table(summary, eraser_order(summary.eraser), lambda k: _cell_text(index.get(k), metric, digits))


def increase_rows(inc: pd.DataFrame, summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    look = {tuple(k): f"{m:+.3f} ± {s:.3f}" if not math.isnan(s) else f"{m:+.3f}"
            for k, m, s, n in zip(inc[CELL].itertuples(index=False), inc["mean"], inc["sd"], inc["n"], strict=True)
            if n != 0}  # absent: no pair
    erasers = [e for e in eraser_order(summary.eraser) if not is_identity(e)]
    return _table(summary, erasers, lambda k: look.get(k, "missing"))


def _first(g: pd.DataFrame, key: str) -> float:
    v = g[f"{key}_mean"].dropna() if f"{key}_mean" in g else pd.Series(dtype=float)
    return float(v.iloc[0]) if len(v) else math.nan


def _report_cells(g: pd.DataFrame) -> list[str]:
    """working rank (of d), variance dropped, max noise share; gradient erasure's own gaps before → after."""
    rank, d = _first(g, "working_rank"), _first(g, "d")
    gaps = [_first(g, k) for k in ("max_mean_gap_before", "max_cov_gap_before", "max_mean_gap_after",
                                   "max_cov_gap_after")]
    return ["n/a" if math.isnan(rank) else f"{rank:.0f}/{d:.0f}",
            *(_na(_first(g, k), ".2%") for k in ("variance_dropped_fraction", "max_noise_share")),
            "n/a" if any(math.isnan(v) for v in gaps) else
            f"{gaps[0]:.3g} / {gaps[1]:.3g} → {gaps[2]:.3g} / {gaps[3]:.3g}"]


def _probe_cells(g: pd.DataFrame, probes: list[str]) -> list[str]:
    """acc ± SE and log-loss ± SE (bits) per probe, chance (majority accuracy / prior-only code), the verdict."""
    cells = [fmt(_first(g, f"{p}_probe_{score}"), _first(g, f"{p}_probe_{se}")) for p in probes
             for score, se in (("acc", "acc_se"), ("loss_bits", "loss_se"))]
    cells.append(f"{_na(_first(g, 'chance'), '.3f')} / {_na(_first(g, 'chance_loss_bits'), '.3f')}")
    verdicts = [v for v in g.probe_verdict if v != "n/a"] if "probe_verdict" in g else []
    cells.append(next((v for v in verdicts if v.startswith(ARTEFACT)), verdicts[0] if verdicts else "n/a"))
    return cells


def certificate_rows(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """One row per (dataset, eraser) (and fit_on / variant, when some results were fitted on a holdout / differ
    in eraser options) of one group: the certificate after erasure and what the eraser reports it did. With the
    certificate's out-of-sample probes: each probe's accuracy and log-loss (bits) ± SE, chance, and the verdict
    (a probe below chance by > ARTEFACT_Z SE reads "dependence artefact", never a success)."""
    require_one_group(summary, "a table")
    keys = ["dataset", *[c for c in _label_columns(summary) if c in ("fit_on", "variant")], "eraser"]
    # whether some result has the certificate's out-of-sample probe scores (SE, z, verdict); the probes some result
    # has (the MLP probe is newer than the others: older certificates lack it, and their tables keep their columns)
    numbers = [f"{p}_probe_{k}_mean" for p in PROBES for k in ("acc_se", "loss_bits")]
    probes = any(c in summary and summary[c].notna().any() for c in numbers) or \
        ("probe_verdict" in summary and (summary.probe_verdict != "n/a").any())
    shown = [p for p in PROBES if p != "mlp" or any(
        c in summary and summary[c].notna().any() for c in ("mlp_probe_acc_mean", "mlp_probe_acc_se_mean"))]
    cert_keys = [k for k in CERT if not k.endswith("_probe_acc") or k.removesuffix("_probe_acc") in shown]
    rows = []
    for key, g in summary.groupby(keys, sort=False):
        if probes:
            gaps = [g[f"{k}_mean"].dropna() for k in ("max_mean_gap", "max_cov_gap")]
            scores = [f"{v.iloc[0]:.3g}" if len(v) else "n/a" for v in gaps] + _probe_cells(g, shown)
        else:
            scores = [f"{v.iloc[0]:.3g}" if len(v) else "n/a" for v in (g[f"{k}_mean"].dropna() for k in cert_keys)]
        rows.append([*key, *scores, *_report_cells(g)])
    order = {e: i for i, e in enumerate(eraser_order(summary.eraser))}
    rows.sort(key=lambda r: (r[0], order[r[len(keys) - 1]], *r[1:len(keys) - 1]))
    cert = [CERT["max_mean_gap"], CERT["max_cov_gap"], *[f"{p} probe {what}" for p in shown for what in
                                                         ("acc ± SE", "loss ± SE (bits)")],
            "chance acc / loss (bits)", "probe verdict"] if probes else [CERT[k] for k in cert_keys]
    header = [*[k.replace("_", " ") for k in keys], *cert, "working rank", "variance dropped", "noise share (max)",
              "gradient gaps mean / cov (before → after)"]
    return header, rows


NULL_HOWTO = ("–: no null run; run the cell again with `dataset.permute_labels=true` (same config, seeds and "
              "repeats otherwise)")


def _cells_in_table_order(summary: pd.DataFrame) -> list[pd.Series]:
    """The summary's cells in the tables' order: by table row, then the paper's eraser order."""
    order = {e: i for i, e in enumerate(eraser_order(summary.eraser))}
    rows_of = {k: i for i, k in enumerate(_row_keys(summary))}
    return sorted((r for _, r in summary.iterrows()),
                  key=lambda r: (rows_of[tuple(r[k] for k in ROW_KEY)], order[r.eraser]))


def null_rows(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The null control of one group: per cell (eraser × fit_on) its MDL, its null's MDL (permuted labels, mean
    over the null's seeds × repeats), the label entropy, bias = null MDL − label entropy, the noise the bias is
    compared with (tables.bias_noise: the null's own SE, floored) and the flag, seeds (true / null) and
    what of the cell's seeds and repeats the null lacks or adds."""
    require_one_group(summary, "a table")
    cols = _label_columns(summary, fit_on=False)
    rows = []
    for r in _cells_in_table_order(summary):
        label = [str(r[c]) for c in cols] + [r.eraser, r.fit_on, _cell_text(r, "bits_per_sample")]
        if r.null_runs == 0:
            rows.append([*label, "–", "–", "–", "–", "", f"{r.n_seeds} / 0"])
            continue
        null = fmt(r.null_mean, r.null_sd) + (f" [{r.null_folds}]" if r.null_folds else "")
        ref = "n/a" if math.isnan(r.null_ref) else f"{r.null_ref:.3f} ({r.null_ref_kind})"
        bias = "n/a" if math.isnan(r.bias) else f"{r.bias:+.3f}"
        noise = f"{r.bias_noise:.3f} ({r.bias_noise_of})" if r.bias_noise_of else "n/a (< 2 null seeds)"
        mismatch = CellRow.of(r).null_mismatch
        seeds = f"{r.n_seeds} / {r.null_seeds}" + (f" ({mismatch})" if mismatch else "")
        rows.append([*label, null, ref, bias, noise, r.bias_flag, seeds])
    header = [*[LABEL_NAMES[c] for c in cols], "eraser", "fit on", "MDL", "null MDL", "label entropy", "bias",
              "noise", "flag", "n seeds (true / null)"]
    return header, rows


NULL_NOTE = (
    "Null: the cell rerun with `dataset.permute_labels=true` (labels shuffled once per seed, same config "
    "otherwise), mean over its seeds × repeats; bias = null MDL − label entropy (H of the class prior where the "
    "result records it, else log2 K). Random labels carry no information, so the null should code at the label "
    f"entropy. {INJECTION} (bias < −noise): the null codes BELOW the label entropy, so the erased rows carry "
    "label information the images do not: a label-dependent map fitted on other rows injected it (e.g. QLEACE "
    "fitted on a holdout). A null fitted in sample is censored at the uniform code and cannot show the "
    "dependence an in-sample fit creates (see the probes), and out of sample it cannot see under-erasure: the "
    "null detects injection, it does not correct an MDL (no number is shifted by it). "
    f"{'⚠ excess'} (bias > noise): the procedure charges more than the label entropy for learning nothing. "
    f"noise = {NOISE_SE:g} × the null's standard error over its seeds (per-seed means over repeats), at least "
    f"{NULL_FLOOR} bits/sample (`floor`); ? with fewer than 2 null seeds. A null whose seeds or repeats differ "
    "from its cell's says so in the last column. " + NULL_HOWTO + ".\n")
NO_NULL = ("Null control: no permuted-label runs among these results, so label injection by the eraser (null MDL "
           "below the label entropy) is not checked; rerun the cells with `dataset.permute_labels=true` (same "
           "config, seeds and repeats otherwise) to check it.\n")


def fit_budget_rows(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """Per cell: MDL, rows fitted on and coded (eraser.fit), QLEACE's working rank and dropped variance, the block
    models' stop reasons (counts over the cell's runs), the share at the cap, and whether it is budget-bound."""
    require_one_group(summary, "a table")
    cols = _label_columns(summary)
    rows = []
    for r in _cells_in_table_order(summary):
        cell = CellRow.of(r)
        rank, share, known, irregular = cell.working_rank_mean, cell.at_cap_share, cell.blocks_known, \
            cell.rank_irregular_mean
        rows.append([*(str(r[c]) for c in cols), r.eraser, _cell_text(r, "bits_per_sample"),
                     "n/a" if math.isnan(cell.n_fit_mean) else f"as fitted on {cell.n_fit_mean:.0f} rows",
                     _na(cell.fit_rows_per_class_dim_mean, ".2g"), _na(cell.n_coded_mean, ".0f"),
                     "n/a" if math.isnan(irregular) else f"{irregular:.0%} of runs" + " ⚠" * (irregular >= 0.5),
                     "n/a" if math.isnan(rank) else f"{rank:.0f}/{cell.d_mean:.0f}",
                     _na(cell.variance_dropped_fraction_mean, ".2%"), cell.stops or "n/a",
                     "n/a" if not known or math.isnan(share) else f"{share:.0%} of {known}",
                     f"budget-bound: {cell.budget_bound}" if cell.budget_bound else ""])
    header = [*[LABEL_NAMES[c] for c in cols], "eraser", "MDL", "n fit", "rows/class/d", "n coded", "rank-irregular",
              "working rank", "variance dropped", "block stops", "at cap", "budget"]
    return header, rows


FIT_BUDGET_NOTE = (
    "n fit / n coded: rows the eraser was fitted on / coded (result.json eraser.fit; mean over runs): every number "
    "is the eraser as fitted on those rows; rows/class/d: fit rows per class per input dimension (the population "
    f"effect of a fitted eraser is estimable from about {ESTIMABLE_ROWS_PER_CLASS_DIM} rows/class/d). "
    "Rank-irregular: the share of runs whose fitted linear eraser removes a direction no more label-aligned than "
    "under shuffled labels (permutation test on the fit rows, result.json eraser.rank_test; ⚠ at half or more: the "
    "edit removes noise-chosen directions). Block stops: why the block models stopped (patience: no new best for "
    "the patience; max_epochs: the cap). At cap: block models stopped by max_epochs with their best epoch in the "
    f"last {CAP_TAIL:.0%} of the epochs they ran (the step floor can run a model past max_epochs); budget-bound: "
    f"the at-cap models' validation losses still fell beyond their noise, by enough that as many more epochs would "
    f"lower the code by more than {BUDGET_BITS} bits/sample (results without validation trends: more than "
    f"{BUDGET_SHARE:.0%} at the cap), so the cell measures learning within the budget, not the data.\n")


def _same_n(a: float, b: float) -> bool:
    """Equal row counts, or both unknown (results written before eraser.fit.n_coded)."""
    return a == b or (a != a and b != b)


def bracket_rows(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]] | None:
    """Per row (without fit on) and n_coded, each eraser's bracket [out of sample, in sample]: holdout with self,
    or holdout with all at equal n_coded; None when no eraser has both ends."""
    require_one_group(summary, "a table")
    cols = _label_columns(summary, fit_on=False)
    erasers = eraser_order(summary.eraser)
    keys = [c for c in ROW_KEY if c != "fit_on"]
    rows, found = [], False
    for key, g in summary.groupby(keys, sort=False):
        values = dict(zip(keys, key, strict=True))
        by: dict[tuple[str, str], pd.Series] = {(r.eraser, r.fit_on): r for _, r in g.iterrows()}
        holdout = g[g.fit_on == "holdout"]
        ns: list[float] = []
        for v in (CellRow.of(r).n_coded_mean for _, r in holdout.iterrows()):
            ns += [] if any(_same_n(v, u) for u in ns) else [v]
        for n in ns:
            cells = []
            for e in erasers:
                out = by.get((e, "holdout"))
                if out is None or not _same_n(CellRow.of(out).n_coded_mean, n):
                    cells.append("–")
                    continue
                partner, alt = by.get((e, "self")), by.get((e, "all"))
                if partner is None and alt is not None and CellRow.of(alt).n_coded_mean == n:  # pool: all codes as many
                    partner = alt
                lo = out.bits_per_sample_mean
                if partner is None:
                    cells.append(f"{lo:.3f} (holdout only)")
                else:
                    found = True
                    cells.append(f"[{lo:.3f}, {partner.bits_per_sample_mean:.3f}]"
                                 + ("" if partner.fit_on == "self" else " (all)"))
            rows.append([*(str(values[c]) for c in cols), _na(n, ".0f"), *cells])
    return ([*[LABEL_NAMES[c] for c in cols], "n coded", *erasers], rows) if found else None


BRACKET_NOTE = ("Brackets [out of sample, in sample] at equal n_coded (bits/sample, mean over seeds × repeats): "
                "holdout (fitted on other rows: under-erasure and label injection read low) and self (fitted on the "
                "coded rows; or all where it codes as many rows: dependence reads high). The ends are not guaranteed "
                "to contain the population eraser's value (make calibrate measures coverage: docs/known-answers.md); "
                "The claims report supports a claim where the lower end of the bracket margin's CI excludes zero.\n")


def paper_rows(summary: pd.DataFrame) -> list[list[str]] | None:
    """Paper Appendix C next to ours (legacy units) for the CIFAR-10 base-size cells of one group, if any."""
    require_one_group(summary, "a table")
    group, index = groups_in(summary)[0] if len(summary) else "{}", _by_cell(summary)
    rows, found = [], False
    for name, (tag, width, depth) in PAPER_ARCHS.items():
        cells = []
        for eraser, (pm, ps) in PAPER_TABLE_C[name].items():
            rec = index.get((group, "cifar10", tag, width, depth, "all", "", eraser))
            found |= rec is not None
            cells.append(f"{_cell_text(rec, 'legacy', 2)} / {pm:.2f} ± {ps:.2f}")
        rows.append([name, *cells])
    return rows if found else None


def unfinished(df: pd.DataFrame, with_group: bool = False) -> list[list[str]]:
    rows = []
    for _, r in df[df.status != "done"].iterrows():  # columns a frame may lack: null, error (all done), group
        null, group = r.get("null"), r.get("group")
        status = f"{r.status} (null)" if pd.api.types.is_bool(null) and null else r.status  # permuted labels
        label = [group_label(group) if isinstance(group, str) else "unknown (no result to tell)"]
        rows.append((label if with_group else []) + [status, str(r.seed), r.job_dir, str(r.get("error", "") or "")])
    return rows


def _mixed_lines(summary: pd.DataFrame) -> str:
    out = []
    for flag, say in (
            ("mixed_commits", f"{MIXED} seeds from different commits: {{name}}: {{r.commits}}"),
            ("mixed_numerics", f"{MIXED_NUMERICS} seeds under different numerics signatures (GPU: equal within "
                               "tolerance, not bitwise): {name}: {r.numerics}"),
            ("mixed_data", f"{MIXED_DATA} runs on different data (dataset.fingerprint), not averaged: {{name}}: "
                           "{r.data}"),
            ("set_aside", "set aside (computed on other data, not in the numbers above): {name}: {r.set_aside}; "
                          "now: {r.data}")):  # every summary has these columns (aggregate_summary.summarize)
        out += [say.format(name=cell_name(r), r=r) + "\n"
                for _, r in summary[summary[flag].fillna("").astype(bool)].iterrows()]
    return "".join(out)


def _group_sections(df: pd.DataFrame, summary: pd.DataFrame, h: str) -> list[str]:
    parts = [f"{h} MDL (bits/sample)\n", md_table(*pivot(summary, "bits_per_sample"))]
    if mixed := _mixed_lines(summary):
        parts.append(mixed)
    parts += [f"{h} Legacy MDL (the paper code's units)\n", md_table(*pivot(summary, "legacy"))]
    if len(inc := increase_over_control(df)):
        parts += [f"{h} MDL increase over control (bits/sample, paired by seed)\n",
                  md_table(*increase_rows(inc, summary))]
    if (brackets := bracket_rows(summary)) is not None:
        parts += [f"{h} Brackets at equal n coded (bits/sample)\n", md_table(*brackets), BRACKET_NOTE]
    # some cell's results say how the eraser was fitted (eraser.fit, its report) or why the block models stopped
    # (results written before these keys do not)
    if any(c in summary and summary[c].notna().any() for c in ["n_fit_mean", "n_coded_mean", "working_rank_mean"]) \
            or ("blocks_known" in summary and (summary.blocks_known > 0).any()):
        parts += [f"{h} Fit and training budget\n", md_table(*fit_budget_rows(summary)), FIT_BUDGET_NOTE]
    if "null_runs" in summary and (summary.null_runs > 0).any():
        parts += [f"{h} Null control (permuted labels, bits/sample)\n", md_table(*null_rows(summary)), NULL_NOTE]
    else:
        parts.append(NO_NULL)
    parts += [f"{h} Final validation loss (bits, full-data run)\n", md_table(*pivot(summary, "final_val_loss"))]
    parts += [f"{h} Erasure certificate (after erasure)\n", md_table(*certificate_rows(summary))]
    if (paper := paper_rows(summary)) is not None:
        header = ["architecture", *[f"{PAPER_ERASER_NAMES[e]} (ours / paper)" for e in PAPER_TABLE_C["MLP"]]]
        parts += [f"{h} Paper Appendix C vs ours (CIFAR-10, legacy units)\n", md_table(header, paper)]
    return parts


def plot_stems(summary: pd.DataFrame, name: str) -> dict[str, str]:
    """group -> file stem of its plots: `name`, or `name-g<i>` with several groups."""
    groups = groups_in(summary)
    return {g: name if len(groups) == 1 else f"{name}-g{i}" for i, g in enumerate(groups, 1)}


def markdown(df: pd.DataFrame, summary: pd.DataFrame, title: str, name: str = "results") -> str:
    done, total = int((df.status == "done").sum()), len(df)
    protocols = ", ".join(sorted({p for p in summary.protocol if p})) or "n/a"
    parts = [f"# {title}\n", f"{done}/{total} jobs finished; MDL protocol: {protocols}. Cells: mean ± sd over "
             f"finished seeds, (n/N) when seeds are missing, {MIXED} when they come from different commits.\n"]
    if not (finished := df[df.status == "done"]).empty and "commit" in finished:
        counts = finished.commit.fillna(UNKNOWN_COMMIT).value_counts(sort=False)
        note = "; unknown: no commit recorded (older result, or not a git checkout)" if UNKNOWN_COMMIT in counts else ""
        parts.append(f"Code versions (commit: finished results): {', '.join(f'{c} ({n})' for c, n in counts.items())}"
                     f"{note}.\n")
    groups = groups_in(summary)
    if len(groups) == 1:
        parts += _group_sections(df, summary, "##")
    else:
        keys = ", ".join(differing_keys(groups))
        parts.append(f"These results differ in {keys} besides the eraser and the seed: one set of tables per "
                     f"group, erasers compared only within a group ({MISSING_KEY}: not recorded in the result; "
                     f"{PAPER_RULE}: the paper's rate for the architecture and eraser family).\n")
        stems, labels = plot_stems(summary, name), group_labels(groups)
        for i, g in enumerate(groups, 1):
            parts.append(f"## Group {i}: {labels[g]}\n\nPlots: {stems[g]}*.png\n")
            parts += _group_sections(df[df.group == g], summary[summary.group == g], "###")
    if bad := unfinished(df, with_group=len(groups) > 1):
        header = ["status", "seed", "job dir", "detail"]
        parts += ["## Jobs without a result\n", md_table(["group", *header] if len(groups) > 1 else header, bad)]
    return "\n".join(parts)


def _tex_escape(s: str) -> str:
    for char in "&%#":
        s = s.replace(char, "\\" + char)
    return s.replace("_", r"\_").replace("±", r"$\pm$").replace(MIXED, r"$\dagger$").replace(MIXED_DATA, r"$\ddagger$")


def latex(summary: pd.DataFrame) -> str:
    out = []
    for g in groups_in(summary):
        part = summary[summary.group == g]
        where = f" ({_tex_escape(group_label(g))})" if group_label(g) else ""
        for metric, caption in (("bits_per_sample", "Prequential MDL (bits/sample)"),
                                ("legacy", "Legacy MDL (paper units)")):
            header, rows = pivot(part, metric)
            shown = len(_label_columns(part))
            out += [r"\begin{table}[t]", r"\centering",
                    r"\begin{tabular}{" + "l" * shown + "r" * (len(header) - shown) + "}",
                    r"\toprule", " & ".join(_tex_escape(h) for h in header) + r" \\", r"\midrule"]
            out += [" & ".join(_tex_escape(c) for c in r) + r" \\" for r in rows]
            out += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{caption}{where}; mean $\pm$ sd over seeds.}}",
                    r"\end{table}", ""]
    return "\n".join(out)


def mdl_tables(collected: Collected) -> dict[str, str]:
    """{"": the MDL tables (also written as <name>.md, .csv, _jobs.csv, .tex and plots), "gs_mdl_regularizer": ...}
    for what was collected."""
    df, out, name = collected.jobs, collected.out, collected.name
    tables: dict[str, str] = {}
    if len(df):
        summary = summarize(df)
        tables[""] = markdown(df, summary, collected.title, name)
        summary.to_csv(out / f"{name}.csv", index=False)
        df.drop(columns=["curve"], errors="ignore").to_csv(out / f"{name}_jobs.csv", index=False)
        (out / f"{name}.tex").write_text(latex(summary))
        inc = increase_over_control(df)
        for group, stem in plot_stems(summary, name).items():  # one set of plots per group: never overlaid
            plot_all(df[df.group == group], summary[summary.group == group], inc[inc.group == group], out, stem)
    regularized = [w for r, w in zip(collected.results, collected.as_written(), strict=True) if is_regularized_mdl(r)]
    if regularized:
        tables["gs_mdl_regularizer"] = mdl_regularizer_table(regularized)
    return tables


def mdl_regularizer_table(results: list[dict[str, Any]]) -> str:
    """MDL (bits/sample) per eraser, ERM vs SD, and the erased-minus-control gap per seed."""
    def cell(r: dict[str, Any]) -> tuple[Any, ...]:
        c = config_view(r["config"])
        return (c["dataset.tag"], c["arch.tag"], c["arch.width"], c["arch.depth"], method_of_stored(r["config"]),
                c["mdl.calibrate_temperature"])

    rows = []
    for (ds, arch, w, d, method, cal), rs in grouped(results, cell).items():
        by: defaultdict[str, dict[int, float]] = defaultdict(dict)
        for r in rs:
            by[r["config"]["eraser"]["name"]][r["config"]["seed"]] = r["mdl"]["bits_per_sample"]
        control = next((by[e] for e in by if is_identity(e)), {})
        for eraser in eraser_order(e for e in by if not is_identity(e)):
            gaps = [v - control[s] for s, v in by[eraser].items() if s in control]
            seeds = sum(isinstance(v, int | float) and math.isfinite(v) for v in by[eraser].values())
            rows.append([ds, f"{arch}-w{w}-d{d}", method, "yes" if cal else "no", eraser, str(seeds),
                         mean_sd(control.values(), digits=4), mean_sd(by[eraser].values(), digits=4),
                         mean_sd(gaps, digits=4)])
    return md_table(["dataset", "arch", "method", "T-calibrated", "eraser", "seeds", "MDL control (bits/sample)",
                      "MDL erased (bits/sample)", "gap (paired by seed)"], rows)


def is_regularized_mdl(r: Result) -> bool:
    """An MDL result with an mdl section, of a GS preset or with a regularizer."""
    if not isinstance(r, MdlResult) or r.config is None or r.body.mdl is None:
        return False
    c = config_view(r.config)
    regularized = "regularizer.name" in c and c["regularizer.name"] != "none"
    return bool(c) and (str(c["experiment_name"] or "").startswith("gs_") or regularized)
