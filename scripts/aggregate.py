#!/usr/bin/env python
"""Aggregate result.json files into tables (Markdown, CSV, LaTeX) and plots (PNG).

    python scripts/aggregate.py outputs/runs --name all          # everything under a directory
    python scripts/aggregate.py --experiment demo --name demo    # exactly the jobs of a preset
    python scripts/aggregate.py --experiment paper_table_c --override paths.out_dir=/scratch/out

Every cell (dataset, arch, width, depth, eraser) reports mean ± sd over its finished seeds. Jobs that did not
finish are listed as missing, failed (a multirun's job-status ledger says so) or partial (progress.json: killed
or still running); they are never filled in. With --experiment a result whose config hash differs from the
preset's job is "other-config", not counted. Results of other tasks (`task != mdl`, e.g. Spectral Decoupling)
go to scripts/aggregate_gs.py when it exists.
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from scripts.tables import eraser_order, md_table

ROOT = Path(__file__).resolve().parents[1]

ROW_KEY = ["dataset", "arch", "width", "depth", "variant"]  # a table row; variant: settings that differ, if any
CELL = [*ROW_KEY, "eraser"]
# Config keys shown by the row/column labels themselves; every other semantic key that differs between results
# of one row splits it into variants (results of different configurations are never averaged together).
SHOWN = {"seed", "dataset.tag", "dataset.name", "arch.tag", "arch.name", "arch.activation", "arch.width",
         "arch.depth", "eraser.name"}
METRICS = ["bits_per_sample", "legacy", "final_val_loss"]
CERT = {"max_mean_gap": "mean gap", "max_cov_gap": "cov gap", "linear_probe_acc": "linear probe",
        "quadratic_probe_acc": "quadratic probe", "chance": "chance"}
# What the eraser's report says it did (result.json "eraser" → "report"): QLEACE's working rank (of d), the
# variance of the dropped directions and the coupling noise's largest share of tr C; gradient erasure's own
# gaps to its targets (relative mean / covariance distance) before and after the optimisation.
REPORT = ["working_rank", "d", "variance_dropped_fraction", "max_noise_share", "max_mean_gap_before",
          "max_cov_gap_before", "max_mean_gap_after", "max_cov_gap_after"]
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
JOB_PATH = re.compile(r"(?P<dataset>[^/]+)/(?P<eraser>[^/]+)/(?P<arch>[^/]+)-w(?P<width>\d+)-d(?P<depth>\d+)"
                      r"(?:/c[0-9a-f]{8})?/seed(?P<seed>\d+)$")  # paths.job_subdir (and the pre-v2 layout)


# --- collecting -------------------------------------------------------------------------------------------
def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (json.JSONDecodeError, UnicodeDecodeError):
        print(f"warning: unreadable {path}", file=sys.stderr)
        return None


def _settings(cfg: dict[str, Any]) -> str:
    from training.app.results import flatten
    from training.app.schema import semantic

    flat = flatten(semantic(cfg))
    return json.dumps({k: v for k, v in flat.items() if k not in SHOWN}, sort_keys=True, default=str)


def _cell_from_config(cfg: dict[str, Any]) -> dict[str, Any]:
    arch = cfg["arch"]
    return {"dataset": cfg["dataset"].get("tag") or cfg["dataset"]["name"], "arch": arch.get("tag") or arch["name"],
            "width": int(arch["width"]), "depth": int(arch["depth"]), "eraser": cfg["eraser"]["name"],
            "seed": int(cfg["seed"]), "protocol": (cfg.get("mdl") or {}).get("protocol", "prequential"),
            "settings": _settings(cfg)}


def _cell_from_path(job_dir: Path) -> dict[str, Any] | None:
    m = JOB_PATH.search(job_dir.as_posix())
    if m is None:
        return None
    d = m.groupdict()
    return {"dataset": d["dataset"], "arch": d["arch"], "width": int(d["width"]), "depth": int(d["depth"]),
            "eraser": d["eraser"], "seed": int(d["seed"]), "protocol": "?", "settings": None}


def assign_variants(df: pd.DataFrame) -> pd.DataFrame:
    """Label each row with the settings that differ from other results of its table row (`variant`, "" when
    all agree), so different configurations land in different rows; drop repeated (cell, seed) entries."""
    if df.empty:
        return df
    df = df.copy()
    df["variant"] = ""
    rows = ["dataset", "arch", "width", "depth"]
    for _, g in df[df.settings.notna()].groupby(rows, sort=False):
        varying: set[str] = set()
        for _, ge in g.groupby("eraser", sort=False):
            flats = [json.loads(s) for s in set(ge.settings)]
            keys = set().union(*flats)
            varying |= {k for k in keys if len({json.dumps(f.get(k, "∅"), default=str) for f in flats}) > 1}
        if varying:
            for i in g.index:
                flat = json.loads(df.at[i, "settings"])
                df.at[i, "variant"] = ", ".join(f"{k}={flat[k]}" for k in sorted(varying) if k in flat)
    order = df.assign(_rank=(df.status != "done").astype(int)).sort_values("_rank", kind="stable")
    dup = order.duplicated([*CELL, "seed"], keep="first")
    if dup.any():
        print(f"warning: {int(dup.sum())} repeated result(s) of the same config and seed ignored: "
              + ", ".join(order[dup].job_dir.astype(str)), file=sys.stderr)
    return df.drop(index=order[dup].index).drop(columns=["settings"])


def _done_row(result: dict[str, Any], job_dir: str) -> dict[str, Any]:
    row = {**_cell_from_config(result["config"]), "job_dir": job_dir, "status": "done"}
    mdl, final = result["mdl"], result.get("final") or {}
    row.update(protocol=mdl.get("protocol", row["protocol"]), bits_per_sample=float(mdl["bits_per_sample"]),
               legacy=float(mdl["legacy"]), final_val_loss=float(final.get("val_loss_bits", math.nan)))
    after = (result.get("certificate") or {}).get("after") or {}
    for key in CERT:
        value = after.get(key)
        row[key] = float(value) if isinstance(value, int | float) else math.nan
    report = (result.get("eraser") or {}).get("report") or {}
    for key in REPORT:
        value = report.get(key)
        row[key] = float(value) if isinstance(value, int | float) and not isinstance(value, bool) else math.nan
    row["curve"] = final.get("val_loss_curve") or []
    return row


def failed_jobs(ledger_roots: Iterable[Path]) -> dict[str, str]:
    """job_dir -> error, from multirun ledgers (training/app/ledger.py); the latest entry per job wins."""
    latest: dict[str, dict[str, Any]] = {}
    for root in ledger_roots:
        for path in sorted(root.glob(".multirun/*/job-*.json")):  # run ids sort by time
            entry = _read(path)
            if entry and "job_dir" in entry:
                latest[str(Path(entry["job_dir"]))] = entry
    return {d: e.get("error", "") for d, e in latest.items() if e.get("status") == "failed"}


def _unfinished_row(cell: dict[str, Any], job_dir: Path, failed: dict[str, str]) -> dict[str, Any]:
    row = {**cell, "job_dir": str(job_dir), "status": "missing"}
    progress = _read(job_dir / "progress.json")
    if str(job_dir) in failed:
        row.update(status="failed", error=failed[str(job_dir)])
    elif progress is not None:
        row.update(status="partial", error=f"{len(progress.get('blocks', []))} block models finished")
    return row


def _is_mdl(result: dict[str, Any]) -> bool:
    return (result.get("config") or {}).get("task", "mdl") == "mdl" and "mdl" in result


def collect_dir(root: Path) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Rows of every MDL result.json under root plus failed/partial jobs found there; and all parsed results."""
    rows, results, seen = [], [], set()
    for path in sorted(root.rglob("result.json")):
        result = _read(path)
        if result is None or "config" not in result:
            continue
        seen.add(str(path.parent))
        results.append(result)
        if _is_mdl(result):
            rows.append(_done_row(result, str(path.parent)))
    failed = failed_jobs([root, root / "runs"])
    unfinished = {str(p.parent) for p in root.rglob("progress.json")} | set(failed)
    for job_dir in sorted(unfinished - seen):
        cell = _cell_from_path(Path(job_dir))
        if cell is not None:
            rows.append(_unfinished_row(cell, Path(job_dir), failed))
    return assign_variants(pd.DataFrame(rows)), results


def collect_experiment(name: str, extra: list[str]) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Exactly the jobs of a preset, in launch order; jobs without a matching result are listed as such."""
    from training.app.schema import config_hash
    from training.app.sweeps import expand

    cfgs = expand(name, extra)
    out_dirs = {Path(c["paths"]["out_dir"]) for c in cfgs}
    failed = failed_jobs([d / "runs" for d in out_dirs])
    rows, results = [], []
    for cfg in cfgs:
        job_dir = Path(cfg["paths"]["job_dir"])
        result = _read(job_dir / "result.json")
        h = config_hash(cfg)  # the stored config is rehashed too: the hash's definition may have changed since
        same = result is not None and h in (result.get("config_hash"), config_hash(result.get("config") or {}))
        if same:
            results.append(result)
        if cfg.get("task", "mdl") != "mdl":
            continue
        if same:
            rows.append(_done_row(result, str(job_dir)))
        elif result is not None:
            rows.append({**_cell_from_config(cfg), "job_dir": str(job_dir), "status": "other-config",
                         "error": f"result.json holds config {result.get('config_hash')}"})
        else:
            rows.append(_unfinished_row(_cell_from_config(cfg), job_dir, failed))
    return assign_variants(pd.DataFrame(rows)), results


# --- summarising ------------------------------------------------------------------------------------------
def _ordered(values: Iterable[str]) -> list[str]:
    return eraser_order(values)


def _mean_sd(values: pd.Series) -> tuple[float, float, int]:
    v = values.astype(float).dropna()
    return (float(v.mean()) if len(v) else math.nan, float(v.std(ddof=1)) if len(v) > 1 else math.nan, len(v))


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: mean/sd/n of each metric over finished seeds; expected seeds = every seed of the
    sweep (--experiment) or every seed seen anywhere under the directory."""
    all_seeds = sorted(set(df.seed))
    out = []
    for key, g in df.groupby(CELL, sort=False):
        done = g[g.status == "done"]
        rec: dict[str, Any] = dict(zip(CELL, key, strict=True))
        rec["protocol"] = ",".join(sorted(set(done.protocol))) if len(done) else ""
        rec["n"], rec["n_expected"] = len(done), len(set(all_seeds) | set(g.seed))
        absent = sorted(set(all_seeds) - set(g.seed))
        rec["missing_seeds"] = " ".join([f"{s}:{st}" for s, st in zip(g[g.status != "done"].seed,
                                                                       g[g.status != "done"].status, strict=True)]
                                        + [f"{s}:missing" for s in absent])
        for col in METRICS + list(CERT) + REPORT:
            mean, sd, _ = _mean_sd(done[col]) if col in done and len(done) else (math.nan, math.nan, 0)
            rec[f"{col}_mean"], rec[f"{col}_sd"] = mean, sd
        out.append(rec)
    return pd.DataFrame(out)


def increase_over_control(df: pd.DataFrame, metric: str = "bits_per_sample") -> pd.DataFrame:
    """Per (row, eraser): mean ± sd over seeds of metric(eraser) - metric(control), paired by seed."""
    done = df[df.status == "done"]
    out = []
    for key, g in done.groupby(ROW_KEY, sort=False):
        control = g[g.eraser == "control"].set_index("seed")[metric]
        for eraser, ge in g[g.eraser != "control"].groupby("eraser", sort=False):
            diff = (ge.set_index("seed")[metric] - control).dropna()
            mean, sd, n = _mean_sd(diff)
            out.append({**dict(zip(ROW_KEY, key, strict=True)), "eraser": eraser, "mean": mean, "sd": sd, "n": n})
    return pd.DataFrame(out, columns=[*ROW_KEY, "eraser", "mean", "sd", "n"])


# --- formatting -------------------------------------------------------------------------------------------
def fmt(mean: float, sd: float, digits: int = 3) -> str:
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.{digits}f} ± {sd:.{digits}f}" if not math.isnan(sd) else f"{mean:.{digits}f}"


def _cell_text(rec: pd.Series | None, metric: str, digits: int = 3) -> str:
    if rec is None:
        return "missing"
    if rec["n"] == 0:
        return "failed" if ":failed" in rec["missing_seeds"] else "missing"
    text = fmt(rec[f"{metric}_mean"], rec[f"{metric}_sd"], digits)
    return text + (f" ({rec['n']}/{rec['n_expected']})" if rec["n"] < rec["n_expected"] else "")


def _row_keys(summary: pd.DataFrame) -> list[tuple[Any, ...]]:
    return list(dict.fromkeys(tuple(r) for r in summary[ROW_KEY].itertuples(index=False)))


def _labels(summary: pd.DataFrame) -> tuple[list[str], int]:
    """Row-label columns; `variant` only when some row has one."""
    shown = 5 if (summary.variant != "").any() else 4
    return ["dataset", "arch", "w", "d", "variant"][:shown], shown


def pivot(summary: pd.DataFrame, metric: str, digits: int = 3) -> tuple[list[str], list[list[str]]]:
    erasers = _ordered(summary.eraser)
    index = {tuple(k): r for k, (_, r) in zip(summary[CELL].itertuples(index=False), summary.iterrows(),
                                               strict=True)}
    labels, shown = _labels(summary)
    rows = [[str(v) for v in key[:shown]] + [_cell_text(index.get((*key, e)), metric, digits) for e in erasers]
            for key in _row_keys(summary)]
    return [*labels, *erasers], rows


def increase_rows(inc: pd.DataFrame, summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    erasers = [e for e in _ordered(summary.eraser) if e != "control"]
    look = {tuple(k): (m, s, n) for k, m, s, n in zip(inc[CELL].itertuples(index=False), inc["mean"], inc["sd"],
                                                       inc["n"], strict=True)}
    labels, shown = _labels(summary)
    rows = []
    for key in _row_keys(summary):
        cells = []
        for e in erasers:
            m, s, n = look.get((*key, e), (math.nan, math.nan, 0))
            cells.append("missing" if n == 0 else (f"{m:+.3f} ± {s:.3f}" if not math.isnan(s) else f"{m:+.3f}"))
        rows.append([str(v) for v in key[:shown]] + cells)
    return [*labels, *erasers], rows


def _first(g: pd.DataFrame, key: str) -> float:
    v = g[f"{key}_mean"].dropna() if f"{key}_mean" in g else pd.Series(dtype=float)
    return float(v.iloc[0]) if len(v) else math.nan


def _report_cells(g: pd.DataFrame) -> list[str]:
    """working rank (of d), variance dropped, max noise share; gradient erasure's own gaps before → after."""
    rank, d = _first(g, "working_rank"), _first(g, "d")
    cells = ["n/a" if math.isnan(rank) else f"{rank:.0f}/{d:.0f}"]
    for key in ("variance_dropped_fraction", "max_noise_share"):
        v = _first(g, key)
        cells.append("n/a" if math.isnan(v) else f"{v:.2%}")
    gaps = [_first(g, k) for k in ("max_mean_gap_before", "max_cov_gap_before", "max_mean_gap_after",
                                   "max_cov_gap_after")]
    cells.append("n/a" if any(math.isnan(v) for v in gaps) else
                 f"{gaps[0]:.3g} / {gaps[1]:.3g} → {gaps[2]:.3g} / {gaps[3]:.3g}")
    return cells


def certificate_rows(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """One row per (dataset, eraser) (and variant, when results differ in settings): the certificate after
    erasure and what the eraser reports it did."""
    with_variant = bool((summary.variant != "").any())
    keys = ["dataset", "variant", "eraser"] if with_variant else ["dataset", "eraser"]
    rows = []
    for key, g in summary.groupby(keys, sort=False):
        vals = [g[f"{k}_mean"].dropna() for k in CERT]
        rows.append([*key] + [f"{v.iloc[0]:.3g}" if len(v) else "n/a" for v in vals] + _report_cells(g))
    order = {e: i for i, e in enumerate(_ordered(summary.eraser))}
    rows.sort(key=lambda r: (r[0], order[r[len(keys) - 1]], r[1]))
    header = [*keys, *CERT.values(), "working rank", "variance dropped", "noise share (max)",
              "gradient gaps mean / cov (before → after)"]
    return header, rows


def paper_rows(summary: pd.DataFrame) -> list[list[str]] | None:
    """Paper Appendix C next to ours (legacy units) for the CIFAR-10 base-size cells, if any exist."""
    index = {tuple(k): r for k, (_, r) in zip(summary[CELL].itertuples(index=False), summary.iterrows(),
                                               strict=True)}
    rows, found = [], False
    for name, (tag, width, depth) in PAPER_ARCHS.items():
        cells = []
        for eraser, (pm, ps) in PAPER_TABLE_C[name].items():
            rec = index.get(("cifar10", tag, width, depth, "", eraser))
            found |= rec is not None
            cells.append(f"{_cell_text(rec, 'legacy', 2)} / {pm:.2f} ± {ps:.2f}")
        rows.append([name, *cells])
    return rows if found else None


def unfinished(df: pd.DataFrame) -> list[list[str]]:
    bad = df[df.status != "done"]
    return [[r.status, str(r.seed), r.job_dir, str(r.get("error", "") or "")] for _, r in bad.iterrows()]


def markdown(df: pd.DataFrame, summary: pd.DataFrame, title: str) -> str:
    done, total = int((df.status == "done").sum()), len(df)
    protocols = ", ".join(sorted({p for p in summary.protocol if p})) or "n/a"
    parts = [f"# {title}\n", f"{done}/{total} jobs finished; MDL protocol: {protocols}. Cells: mean ± sd over "
             "finished seeds, (n/N) when seeds are missing.\n"]
    parts += ["## MDL (bits/sample)\n", md_table(*pivot(summary, "bits_per_sample"))]
    parts += ["## Legacy MDL (the paper code's units)\n", md_table(*pivot(summary, "legacy"))]
    inc = increase_over_control(df)
    if len(inc):
        parts += ["## MDL increase over control (bits/sample, paired by seed)\n",
                  md_table(*increase_rows(inc, summary))]
    parts += ["## Final validation loss (bits, full-data run)\n", md_table(*pivot(summary, "final_val_loss"))]
    parts += ["## Erasure certificate (after erasure)\n", md_table(*certificate_rows(summary))]
    paper = paper_rows(summary)
    if paper is not None:
        header = ["architecture", *[f"{PAPER_ERASER_NAMES[e]} (ours / paper)" for e in PAPER_TABLE_C["MLP"]]]
        parts += ["## Paper Appendix C vs ours (CIFAR-10, legacy units)\n", md_table(header, paper)]
    bad = unfinished(df)
    if bad:
        parts += ["## Jobs without a result\n", md_table(["status", "seed", "job dir", "detail"], bad)]
    return "\n".join(parts)


def _tex_escape(s: str) -> str:
    return s.replace("_", r"\_").replace("±", r"$\pm$")


def latex(summary: pd.DataFrame) -> str:
    out = []
    for metric, caption in (("bits_per_sample", "Prequential MDL (bits/sample)"),
                            ("legacy", "Legacy MDL (paper units)")):
        header, rows = pivot(summary, metric)
        shown = _labels(summary)[1]
        out += [r"\begin{table}[t]", r"\centering",
                r"\begin{tabular}{" + "l" * shown + "r" * (len(header) - shown) + "}",
                r"\toprule", " & ".join(_tex_escape(h) for h in header) + r" \\", r"\midrule"]
        out += [" & ".join(_tex_escape(c) for c in r) + r" \\" for r in rows]
        out += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{caption}; mean $\pm$ sd over seeds.}}",
                r"\end{table}", ""]
    return "\n".join(out)


# --- other tasks ------------------------------------------------------------------------------------------
def gs_module() -> Any:
    """scripts/aggregate_gs.py (Spectral Decoupling tables and plots)."""
    from scripts import aggregate_gs

    return aggregate_gs


def other_task_tables(results: list[dict[str, Any]], out: Path | None = None) -> dict[str, str]:
    """Tables (and, with `out`, plots) from scripts/aggregate_gs.py (Spectral Decoupling; it picks the results it
    knows: tasks other than mdl, and MDL runs with a regularizer). Its failure is reported, not fatal."""
    if not results:
        return {}
    others = sum(not _is_mdl(r) for r in results)
    try:
        module = gs_module()
        tables = dict(module.tables(results))
        if others and not tables:
            print(f"note: {others} result(s) of other tasks have no table here (scripts/aggregate_gs.py made none)",
                  file=sys.stderr)
        if out is not None and tables:
            for path in module.plots(results, out):
                print(f"wrote {path}")
        return tables
    except Exception as e:  # noqa: BLE001 - the MDL tables stand on their own
        print(f"warning: aggregate_gs failed ({type(e).__name__}: {e}); its tables are missing", file=sys.stderr)
        return {}


# --- main -------------------------------------------------------------------------------------------------
def write_all(df: pd.DataFrame, results: list[dict[str, Any]], out: Path, name: str, title: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    text = ""
    if len(df):
        summary = summarize(df)
        text = markdown(df, summary, title)
        (out / f"{name}.md").write_text(text)
        summary.to_csv(out / f"{name}.csv", index=False)
        df.drop(columns=["curve"], errors="ignore").to_csv(out / f"{name}_jobs.csv", index=False)
        (out / f"{name}.tex").write_text(latex(summary))
        from scripts.aggregate_plots import plot_all

        plot_all(df, summary, increase_over_control(df), out, name)
    for key, table in other_task_tables(results, out).items():
        fname = key if Path(key).suffix else f"{key}.md"
        (out / f"{name}_{fname}").write_text(table)
        text += f"\n{table}"
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", nargs="?", type=Path, help="directory searched for result.json")
    ap.add_argument("--experiment", help="aggregate exactly the jobs of this preset (missing ones shown)")
    ap.add_argument("--override", action="append", default=[], help="extra Hydra override for --experiment")
    ap.add_argument("--name", default=None, help="table/plot file stem (default: experiment name or 'results')")
    ap.add_argument("--out", type=Path, default=Path("outputs/tables"))
    ap.add_argument("--claims", action="store_true",
                    help="also print the paper's claims report (scripts/claims.py); with --experiment it is "
                         "printed whenever the preset defines `claims`")
    args = ap.parse_args(argv)
    if args.experiment:
        df, results = collect_experiment(args.experiment, args.override)
        title = f"Experiment {args.experiment}"
    elif args.root:
        df, results = collect_dir(args.root)
        title = f"Results under {args.root}"
    else:
        ap.error("give a directory or --experiment")
    if df.empty and not results:
        print("no results found", file=sys.stderr)
        return 1
    name = args.name or args.experiment or "results"
    print(write_all(df, results, args.out, name, title))
    print(f"wrote {args.out}/{name}.md, .csv, _jobs.csv, .tex and PNG plots", file=sys.stderr)
    keys = preset_claims(args.experiment, args.override) if args.experiment else None
    if (args.claims or keys) and not df.empty:
        import claims

        report = claims.markdown(claims.evaluate(df, keys))
        print(report)
        (args.out / f"{name}_claims.md").write_text(report)
    return 0


def preset_claims(experiment: str, extra: list[str]) -> list[str] | None:
    """The claims a preset defines (its `claims` key), or None."""
    from training.app.sweeps import expand

    cfgs = expand(experiment, extra)
    keys = cfgs[0].get("claims") if cfgs else None
    return [str(k) for k in keys] if keys else None


if __name__ == "__main__":
    sys.exit(main())
