"""The calibration table (issue 29, `make calibrate`): MDL of erased generator data against the known truth.

    python scripts/calibrate.py [outputs/runs] [--experiment calibrate]

Reads the result.json files of the preset's jobs (conf/experiment/calibrate.yaml and the extra sweeps of `make
calibrate`) and prints one row per (dataset, covariance gap, rows per class / d, eraser): the truth, then per
eraser.fit_on (oracle, all, holdout) the MDL in bits/sample, mean ± sd over seeds (n), and its error against the
truth. Truth: H(Y) = log2 K where the population eraser leaves x independent of y (Gaussians: QLEACE always, LEACE and
ALF-QLEACE with equal covariances); otherwise only a bound is known (< H: information survives the population
eraser), and no error is printed.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

FIT_ON = ("oracle", "all", "holdout")


def truth(dataset: str, eraser: str, cov_gap: float, k: int) -> tuple[float | None, str]:
    """(the true code length in bits/sample or None, how it reads in the table)."""
    h = math.log2(k)
    if dataset == "gaussian" and (eraser == "qleace" or cov_gap == 0):
        return h, f"{h:.3f} = H(Y)"
    return None, f"< {h:.3f} (below H(Y))"


def collect(root: Path, experiment: str) -> dict[tuple[Any, ...], dict[str, list[float]]]:
    from training.app.schema import NUMERICS

    cells: dict[tuple[Any, ...], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for path in sorted(root.rglob("result.json")):
        try:
            result = json.loads(path.read_text())
            cfg = result["config"]
            bits = float(result["mdl"]["bits_per_sample"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if cfg.get("experiment_name") != experiment or result.get("numerics_version") != NUMERICS:
            continue
        d, e = cfg["dataset"], cfg["eraser"]
        key = (d["name"], float(d.get("cov_gap", 0.0)), float(d["rows_per_dim"]), e["name"], int(d["num_classes"]))
        cells[key][e["fit_on"]].append(bits)
    return cells


def _cell(values: list[float], true: float | None) -> list[str]:
    if not values:
        return ["–", "–"]
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return [f"{mean:.3f} ± {sd:.3f} ({len(values)})", "–" if true is None else f"{mean - true:+.3f}"]


def table(cells: dict[tuple[Any, ...], dict[str, list[float]]]) -> str:
    head = ["dataset", "cov gap", "rows/class ÷ d", "eraser", "truth"]
    for f in FIT_ON:
        head += [f"{f}", "error"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (dataset, cov_gap, rows, eraser, k), by_fit in sorted(cells.items()):
        true, shown = truth(dataset, eraser, cov_gap, k)
        row = [dataset, f"{cov_gap:g}", f"{rows:g}", eraser, shown]
        for f in FIT_ON:
            row += _cell(by_fit.get(f, []), true)
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="outputs/runs", type=Path)
    parser.add_argument("--experiment", default="calibrate")
    args = parser.parse_args(argv)
    cells = collect(args.root, args.experiment)
    if not cells:
        print(f"error: no results of experiment {args.experiment} under {args.root}: run `make calibrate` first",
              file=sys.stderr)
        return 1
    print(table(cells))
    print("\nMDL in bits/sample, mean ± sd over seeds (n); error = MDL − truth. oracle: fitted on 200·d fresh rows per "
          "class; all: on the coded rows (in sample); holdout: on half of the training rows, applied to the other "
          "half.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
