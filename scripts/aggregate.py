#!/usr/bin/env python
"""Aggregate result.json files into tables (Markdown, CSV, LaTeX) and plots.

    python scripts/aggregate.py outputs/runs --name all        # everything under a directory
    python scripts/aggregate.py --experiment demo --name demo  # exactly the jobs of a preset; missing cells shown
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

CELL = ["dataset", "arch", "width", "depth", "eraser"]


def _row(result: dict[str, Any] | None, cfg: dict[str, Any], job_dir: str) -> dict[str, Any]:
    arch = cfg["arch"]
    row: dict[str, Any] = {
        "dataset": cfg["dataset"].get("tag", cfg["dataset"]["name"]), "eraser": cfg["eraser"]["name"],
        "arch": arch.get("tag", arch["name"]), "width": arch.get("width"), "depth": arch.get("depth"),
        "seed": cfg["seed"], "job_dir": job_dir, "status": "missing" if result is None else "done",
    }
    if result is not None:
        mdl, final = result["mdl"], result.get("final") or {}
        row.update(protocol=mdl["protocol"], bits_per_sample=mdl["bits_per_sample"], legacy=mdl["legacy"],
                   final_val_loss=final.get("val_loss_bits", math.nan))
        cert = ((result.get("certificate") or {}).get("after")) or {}
        row.update(cert_mean_gap=cert.get("max_mean_gap"), cert_linear_acc=cert.get("linear_probe_acc"))
    return row


def collect_dir(root: Path) -> pd.DataFrame:
    rows = []
    for path in sorted(root.rglob("result.json")):
        try:
            result = json.loads(path.read_text())
        except json.JSONDecodeError:
            print(f"warning: unreadable {path}", file=sys.stderr)
            continue
        rows.append(_row(result, result["config"], str(path.parent)))
    return pd.DataFrame(rows)


def collect_experiment(name: str, extra: list[str]) -> pd.DataFrame:
    from training.sweeps import expand

    rows = []
    for cfg in expand(name, extra):
        job_dir = Path(cfg["paths"]["job_dir"])
        path = job_dir / "result.json"
        result = json.loads(path.read_text()) if path.exists() else None
        rows.append(_row(result, cfg, str(job_dir)))
    return pd.DataFrame(rows)


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """Mean ± sd over seeds per cell; n counts finished seeds, missing ones are listed."""
    out = []
    for key, g in df.groupby(CELL, sort=False, dropna=False):
        done = g[g.status == "done"]
        rec = dict(zip(CELL, key, strict=True))
        rec["n"] = len(done)
        rec["missing_seeds"] = ",".join(str(s) for s in g[g.status != "done"].seed) or ""
        for col in ("bits_per_sample", "legacy", "final_val_loss", "cert_linear_acc"):
            vals = done[col].astype(float) if col in done else pd.Series(dtype=float)
            rec[f"{col}_mean"] = vals.mean() if len(vals) else math.nan
            rec[f"{col}_sd"] = vals.std(ddof=1) if len(vals) > 1 else math.nan
        out.append(rec)
    return pd.DataFrame(out)


def _pm(mean: float, sd: float) -> str:
    if math.isnan(mean):
        return "missing"
    return f"{mean:.3f} ± {sd:.3f}" if not math.isnan(sd) else f"{mean:.3f}"


def markdown(summary: pd.DataFrame) -> str:
    head = "| dataset | arch | w | d | eraser | seeds | bits/sample | legacy MDL | final val loss (bits) |"
    lines = [head, "|" + "---|" * 9]
    for r in summary.itertuples():
        seeds = f"{r.n}" + (f" (missing {r.missing_seeds})" if r.missing_seeds else "")
        lines.append(f"| {r.dataset} | {r.arch} | {r.width} | {r.depth} | {r.eraser} | {seeds} | "
                     f"{_pm(r.bits_per_sample_mean, r.bits_per_sample_sd)} | {_pm(r.legacy_mean, r.legacy_sd)} | "
                     f"{_pm(r.final_val_loss_mean, r.final_val_loss_sd)} |")
    return "\n".join(lines) + "\n"


def plot_bars(summary: pd.DataFrame, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [f"{r.eraser}\n{r.arch}-w{r.width}-d{r.depth}" if summary.arch.nunique() > 1 else r.eraser
              for r in summary.itertuples()]
    fig, ax = plt.subplots(figsize=(max(4, 0.9 * len(labels)), 3.2))
    ax.bar(range(len(labels)), summary.bits_per_sample_mean, yerr=summary.bits_per_sample_sd.fillna(0),
           capsize=3, color="tab:blue")
    ax.set_xticks(range(len(labels)), labels, fontsize=8)
    ax.set_ylabel("prequential MDL (bits/sample)")
    ax.set_title(", ".join(sorted(set(summary.dataset))))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", nargs="?", type=Path, help="directory searched for result.json")
    ap.add_argument("--experiment", help="aggregate exactly the jobs of this preset (missing ones shown)")
    ap.add_argument("--override", action="append", default=[], help="extra Hydra override for --experiment")
    ap.add_argument("--name", default="results", help="table/plot file stem")
    ap.add_argument("--out", type=Path, default=Path("outputs/tables"))
    args = ap.parse_args(argv)
    if args.experiment:
        df = collect_experiment(args.experiment, args.override)
    elif args.root:
        df = collect_dir(args.root)
    else:
        ap.error("give a directory or --experiment")
    if df.empty:
        print("no results found", file=sys.stderr)
        return 1
    summary = summarize(df)
    args.out.mkdir(parents=True, exist_ok=True)
    md = markdown(summary)
    (args.out / f"{args.name}.md").write_text(md)
    summary.to_csv(args.out / f"{args.name}.csv", index=False)
    plot_bars(summary, args.out / f"{args.name}.png")
    print(md)
    print(f"wrote {args.out / (args.name + '.md')}, .csv, .png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
