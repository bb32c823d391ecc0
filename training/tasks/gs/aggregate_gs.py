"""Tables and plots of the Gradient Starvation tasks (gs_two_moons, gs_colored_mnist, gs_erased_eval): `TABLES`, by
task, which their `rows` (training/tasks/gs/base.py) calls; scripts/aggregate.py asks every task for its tables. (The
ERM-vs-SD table of MDL jobs that ran with a regularizer is the MDL task's: training/tasks/mdl/aggregate_render.py.)
"""

from __future__ import annotations

import functools
import math
import operator
from pathlib import Path
from typing import Any, cast

import numpy as np

from training.analysis.tables import grouped, md_table, mean_sd, method_of_stored
from training.app.result_codec import config_view
from training.app.result_types import at

PAPER_CMNIST = {"ERM (paper, 60k MNIST)": (91.1, 23.7), "SD (paper, 60k MNIST)": (70.0, 68.4)}
FIG3 = ("grayscale_digit", "colored_digit", "grayscale_blank", "colored_blank")


def _method(r: dict[str, Any]) -> str:
    return method_of_stored(r["config"])  # from the config, so renaming methods needs no re-run


def _col(rs: list[dict[str, Any]], *path: str, s: float = 1.0, d: int = 1) -> str:
    """mean ± std over the runs `rs` of the value at `path`, times s, with d decimals."""
    return mean_sd((cast(float, functools.reduce(operator.getitem, path, r)) for r in rs), s, d)


def two_moons_tables(results: list[dict[str, Any]], out: Path) -> dict[str, str]:
    two_moons_boundaries(results, out / "gs_two_moons_boundaries.png")
    rows = []
    for (margin, method), rs in grouped(results, lambda r: (r["config"]["dataset"]["margin"], _method(r))).items():
        rows.append([f"{margin:+g}", method, str(len(rs)), _col(rs, "train", "acc", s=100),
                     _col(rs, "test", "acc", s=100), _col(rs, "geometry", "min_margin", d=3),
                     _col(rs, "geometry", "mean_margin", d=3), _col(rs, "geometry", "boundary_turning", d=2),
                     _col(rs, "geometry", "boundary_line_rms", d=3)])
    return {"gs_two_moons": md_table(["data margin", "method", "seeds", "train acc %", "test acc %", "min margin",
                                      "mean margin", "boundary turning (rad)", "boundary line RMS"], rows)}


def colored_mnist_tables(results: list[dict[str, Any]], out: Path) -> dict[str, str]:
    cmnist_curves(results, out / "gs_colored_mnist_curves.png")
    rows, fig3 = [], []
    for (method,), rs in grouped(results, lambda r: (_method(r),)).items():
        rows.append([method, str(len(rs)), _col(rs, "train", "acc", s=100), _col(rs, "test", "acc", s=100),
                     _col(rs, "environments", "train1", "acc", s=100),
                     _col(rs, "environments", "train2", "acc", s=100)])
        fig3.append([method, *(_col(rs, "fig3", v, "acc", s=100) for v in FIG3),
                     *(_col(rs, "fig3", v, "entropy", d=3) for v in FIG3)])
    rows += [[name, "10", f"{tr}", f"{te}", "", ""] for name, (tr, te) in PAPER_CMNIST.items()]
    header = ["method", "seeds", "train acc %", "test acc %", "env1 acc %", "env2 acc %"]
    return {"gs_colored_mnist": md_table(header, rows),
            "gs_colored_mnist_fig3": md_table(["method", *(f"{v} acc %" for v in FIG3),
                                                *(f"{v} entropy" for v in FIG3)], fig3)}


def erased_eval_tables(results: list[dict[str, Any]], out: Path) -> dict[str, str]:
    def key(r: dict[str, Any]) -> tuple[Any, ...]:
        c = config_view(r["config"])
        return c["dataset.tag"], c["eraser.name"], c["arch.tag"], _method(r)

    rows = []
    for (ds, eraser, arch, method), rs in grouped(results, key).items():
        rows.append([ds, arch, eraser, method, str(len(rs)), _col(rs, "eval", "test", "acc", s=100),
                     _col(rs, "eval", "test_erased", "acc", s=100), _col(rs, "gap_erased_minus_original", "acc", s=100),
                     _col(rs, "eval", "test", "ce_bits_calibrated", d=3),
                     _col(rs, "eval", "test_erased", "ce_bits_calibrated", d=3),
                     _col(rs, "gap_erased_minus_original", "ce_bits_calibrated", d=3)])
    return {"gs_erased_eval": md_table(["dataset", "arch", "eraser", "method", "seeds", "test acc %",
                                        "erased test acc %", "gap (pp)", "test CE bits (T-cal.)",
                                        "erased CE bits (T-cal.)", "CE gap"], rows)}


def two_moons_boundaries(results: list[dict[str, Any]], path: Path) -> Path | None:
    """The mean decision boundary per (data margin, method), one panel each, in `path` (None: no boundary files)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = []
    for (margin, method), rs in grouped(results, lambda r: (-r["config"]["dataset"]["margin"], _method(r))).items():
        files = [(r, at(r, "files", "boundary")) for r in rs]  # result.json `files`: a run's own files (optional)
        pairs = [(r, np.load(Path(r["job_dir"]) / f)) for r, f in files
                 if f is not None and (Path(r["job_dir"]) / f).exists()]
        if pairs := [(r, g) for r, g in pairs if g["z"].shape == pairs[0][1]["z"].shape]:
            first = min(pairs, key=lambda p: p[0]["config"]["seed"])[1]
            panels.append((-margin, method, np.mean([g["z"] for _, g in pairs], axis=0), first, len(pairs)))
    if not panels:
        return None
    cols = len({p[1] for p in panels})
    rows = math.ceil(len(panels) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(2.8 * cols, 2.9 * rows), squeeze=False)
    for ax in axes.ravel():
        ax.axis("off")
    for ax, (margin, method, z, g, n) in zip(axes.ravel(), panels, strict=False):
        lim = float(np.abs(z).max()) or 1.0
        ax.contourf(g["xs"], g["ys"], z, 20, cmap="RdBu", vmin=-lim, vmax=lim, alpha=0.8)
        ax.contour(g["xs"], g["ys"], z, [0.0], colors="k", linewidths=1.2)
        ax.scatter(g["x"][:, 0], g["x"][:, 1], c=g["y"], cmap="bwr_r", edgecolors="k", s=8, linewidths=0.3)
        ax.set_title(f"margin {margin:+g}: {method}\n(mean logit of {n} seeds)", fontsize=8)
        ax.axis("on")
        ax.set_xticks([])
        ax.set_yticks([])
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


def cmnist_curves(results: list[dict[str, Any]], path: Path) -> Path | None:
    """Train and test accuracy over training steps per method, in `path` (None: no curves)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = grouped([r for r in results if at(r, "curve")], lambda r: (_method(r),))
    if not groups:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(9, 3.4))
    for (method,), rs in groups.items():
        steps = [c["step"] for c in rs[0]["curve"]]
        for ax, key in zip(axes, ("train_acc", "test_acc"), strict=True):
            vals = np.mean([[c[key] for c in r["curve"]] for r in rs if len(r["curve"]) == len(steps)], axis=0)
            ax.plot(steps, 100 * vals, label=method)
    for ax, title in zip(axes, ("train accuracy %", "test accuracy % (colour flipped)"), strict=True):
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=130)
    plt.close(fig)
    return path


TABLES = {"gs_two_moons": two_moons_tables, "gs_colored_mnist": colored_mnist_tables,
          "gs_erased_eval": erased_eval_tables}  # task -> its tables (and plots) of its results as written
