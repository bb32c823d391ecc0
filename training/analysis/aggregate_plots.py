"""PNG plots for scripts/aggregate.py: MDL per cell, MDL vs width / depth (paper Figs 4-8), validation-loss
curves per eraser (Figs 9-15) and the MDL increase over control. Missing cells are gaps, never interpolated.
Every plot shows one comparison group (scripts/aggregate.py); one that would overlay several is refused. Rows are
(dataset, arch, width, depth, fit_on, variant): the frames of training/tasks/mdl/aggregate_*.py, which always have
these columns; permuted-label (null) runs are controls, never plotted as a value."""

from __future__ import annotations

import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

from training.analysis.tables import ERASER_ORDER, eraser_order, require_one_group  # noqa: E402

# One colour per eraser in every plot; an eraser the paper's order does not know: None (matplotlib's next).
COLORS = {e: f"C{i}" for i, e in enumerate(ERASER_ORDER)}
MAX_PANELS = 16
LN2 = math.log(2)


def _row_text(fit_on: str, variant: str) -> str:
    return " ".join(t for t in ("" if fit_on == "all" else f"(fit on {fit_on})", variant) if t)


ROW = ["dataset", "arch", "width", "depth", "fit_on", "variant"]


def _grid(n: int) -> tuple[plt.Figure, list[plt.Axes]]:
    cols = min(n, 4)
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.3 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat[:n])


def _save(fig: plt.Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_bars(summary: pd.DataFrame, path: Path) -> None:
    require_one_group(summary, "a plot")
    rank = {e: i for i, e in enumerate(eraser_order(summary.eraser))}
    s = summary.assign(_row=summary.groupby(ROW, sort=False).ngroup(),
                       _rank=summary.eraser.map(rank)).sort_values(["_row", "_rank"]).reset_index(drop=True)
    several = len(s.groupby(ROW)) > 1
    labels = [f"{r.eraser}\n{r.arch}-w{r.width}-d{r.depth}\n{_row_text(r.fit_on, r.variant)}".strip() if several
              else r.eraser for r in s.itertuples()]
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(labels)), 3.4))
    ax.bar(range(len(labels)), s.bits_per_sample_mean, yerr=s.bits_per_sample_sd.fillna(0), capsize=3,
           color=[COLORS.get(e, "gray") for e in s.eraser])
    ax.set_xticks(range(len(labels)), labels, fontsize=7, rotation=30 if several else 0, ha="right" if several
                  else "center")
    ax.set_ylabel("MDL (bits/sample)")
    ax.set_title(", ".join(sorted(set(s.dataset))))
    _save(fig, path)


def plot_mdl_vs(summary: pd.DataFrame, axis: str, path: Path) -> None:
    """MDL against `axis` (width or depth) at the most common value of the other, per (dataset, arch)."""
    require_one_group(summary, "a plot")
    other = "depth" if axis == "width" else "width"
    panels = []
    for (dataset, arch, fit_on, variant), g in summary.groupby(["dataset", "arch", "fit_on", "variant"], sort=False):
        fixed = g[other].mode().iloc[0]
        g = g[g[other] == fixed]
        if g[axis].nunique() >= 2:
            panels.append((f"{dataset} {arch} ({other} {fixed}) {_row_text(fit_on, variant)}".strip(), g))
    if not panels:
        return
    fig, axes = _grid(min(len(panels), MAX_PANELS))
    for ax, (title, g) in zip(axes, panels, strict=False):
        for eraser in eraser_order(g.eraser):
            ge = g[g.eraser == eraser].sort_values(axis)
            ax.errorbar(ge[axis], ge.bits_per_sample_mean, yerr=ge.bits_per_sample_sd.fillna(0), marker="o",
                        ms=3, capsize=2, label=eraser, color=COLORS.get(eraser))
        if axis == "width":
            ax.set_xscale("log", base=2)
        ax.set_xlabel(axis)
        ax.set_ylabel("MDL (bits/sample)")
        ax.set_title(title, fontsize=9)
        ax.legend(fontsize=7)
    _save(fig, path)


def _mean_curve(curves: list[list[list[float]]]) -> tuple[np.ndarray, np.ndarray]:
    """Mean over seeds at each step any seed logged (seeds that stopped early drop out), in bits."""
    table: dict[float, list[float]] = {}
    for curve in curves:
        for step, loss in curve:
            table.setdefault(float(step), []).append(float(loss) / LN2)
    steps = np.array(sorted(table))
    return steps, np.array([np.mean(table[s]) for s in steps])


def plot_curves(df: pd.DataFrame, path: Path) -> None:
    require_one_group(df, "a plot")
    df = df[~df["null"].astype(bool)]  # every collected frame has `null` (aggregate_collect.assign_groups)
    done = df[(df.status == "done") & df.curve.map(lambda c: isinstance(c, list) and len(c) > 0)] \
        if "curve" in df else df.iloc[0:0]
    if done.empty:
        return
    groups = list(done.groupby(ROW, sort=False))[:MAX_PANELS]
    fig, axes = _grid(len(groups))
    for ax, ((dataset, arch, width, depth, fit_on, variant), g) in zip(axes, groups, strict=True):
        for eraser in eraser_order(g.eraser):
            steps, loss = _mean_curve(list(g[g.eraser == eraser].curve))
            ax.plot(steps, loss, label=f"{eraser} ({(g.eraser == eraser).sum()} seeds)", color=COLORS.get(eraser))
        ax.set_xlabel("step")
        ax.set_ylabel("validation loss (bits)")
        ax.set_title(f"{dataset} {arch}-w{width}-d{depth} {_row_text(fit_on, variant)}".strip(), fontsize=8)
        ax.legend(fontsize=7)
    _save(fig, path)


def plot_increase(inc: pd.DataFrame, path: Path) -> None:
    require_one_group(inc, "a plot")
    if inc.empty:
        return
    keys = list(dict.fromkeys(zip(*(inc[c] for c in ROW), strict=True)))
    erasers = eraser_order(inc.eraser)
    width = 0.8 / len(erasers)
    fig, ax = plt.subplots(figsize=(max(4.5, 1.2 * len(keys) * max(1, len(erasers) / 3)), 3.4))
    for j, eraser in enumerate(erasers):
        ge = inc[inc.eraser == eraser]
        look = {tuple(getattr(r, c) for c in ROW): (r.mean, r.sd) for r in ge.itertuples()}
        vals = [look.get(k, (math.nan, math.nan)) for k in keys]  # absent: no bar
        ax.bar(np.arange(len(keys)) + j * width, [v[0] for v in vals], width,
               yerr=[0 if math.isnan(v[1]) else v[1] for v in vals], capsize=2, label=eraser, color=COLORS.get(eraser))
    ax.axhline(0, color="k", lw=0.7)
    ax.set_xticks(np.arange(len(keys)) + 0.4 - width / 2,
                  [f"{d}\n{a}-w{w}-d{dd}\n{_row_text(f, v)}".strip() for d, a, w, dd, f, v in keys], fontsize=7)
    ax.set_ylabel("MDL increase over control (bits/sample)")
    ax.legend(fontsize=7)
    _save(fig, path)


def plot_all(df: pd.DataFrame, summary: pd.DataFrame, inc: pd.DataFrame, out: Path, name: str) -> None:
    """Every plot of one group whose data is there (a plot without data is not written)."""
    done = summary[summary.n > 0]
    if len(done):
        plot_bars(done, out / f"{name}.png")
    for axis in ("width", "depth"):
        plot_mdl_vs(done, axis, out / f"{name}_mdl_vs_{axis}.png")
    plot_curves(df, out / f"{name}_val_curves.png")
    plot_increase(inc, out / f"{name}_increase.png")
