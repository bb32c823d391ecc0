"""The MDL task's tables (`Mdl.rows`, __init__.py): the job table aggregate_collect.py made, summarised and
rendered (Markdown, CSV, LaTeX, plots) by aggregate_summary.py, aggregate_render.py (here) and
training/analysis/aggregate_plots.py; and the ERM-vs-SD table of MDL jobs that ran with a regularizer (below)."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from training.analysis.aggregate_plots import plot_all
from training.analysis.tables import eraser_order, grouped, is_identity, md_table, mean_sd, method_of_stored
from training.app.result_codec import config_view
from training.app.result_types import Result
from training.app.tasks import Collected
from training.tasks.mdl.aggregate_render import latex, markdown, plot_stems
from training.tasks.mdl.aggregate_summary import increase_over_control, summarize
from training.tasks.mdl.result import MdlResult


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
