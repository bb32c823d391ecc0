"""The MDL task's tables (training/tasks/mdl.py `rows`): the job table aggregate_collect.py made, summarised and
rendered (Markdown, CSV, LaTeX, plots) by aggregate_summary.py, aggregate_render.py and aggregate_plots.py; and the
ERM-vs-SD table of MDL jobs that ran with a regularizer (aggregate_gs.py), all in training/analysis/."""

from __future__ import annotations

from training.analysis.aggregate_gs import is_regularized_mdl, mdl_regularizer_table
from training.analysis.aggregate_plots import plot_all
from training.analysis.aggregate_render import latex, markdown, plot_stems
from training.analysis.aggregate_summary import increase_over_control, summarize
from training.app.tasks import Collected


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
