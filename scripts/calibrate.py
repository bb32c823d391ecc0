"""The calibration table (issue 29, `make calibrate`): MDL of erased generator data against the known truth.

    python scripts/calibrate.py [outputs/runs] [--experiment calibrate]

Reads the result.json files of the preset's jobs (conf/experiment/calibrate.yaml and the extra sweeps of `make
calibrate`) and prints one row per (dataset, covariance gap, rows per class / d, eraser): the truth, then per
eraser.fit_on (oracle, all, holdout) the MDL in bits/sample, mean ± sd over seeds (n), and its error against the
truth. Truth: H(Y) = log2 K where the population eraser leaves x independent of y (Gaussians: QLEACE always, LEACE and
ALF-QLEACE with equal covariances). For the mixture after QLEACE it is H(Y | X') under the population eraser
(training/data/generators.py `mixture_truth_bits`, Monte Carlo): the per-sample code length a learner approaches with
unlimited data, so a finite-data MDL reads above it by its learning cost. Elsewhere (LEACE/ALF-QLEACE on unequal
covariances) only "below H(Y)" is known and no error is printed.
"""

from __future__ import annotations

import argparse
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


def truth(dataset: str, eraser: str, cov_gap: float, k: int, options: list[dict[str, Any]]
          ) -> tuple[float | None, str]:
    """(the true code length in bits/sample or None, how it reads in the table); `options`: the dataset options of
    the cell's runs (the mixture's truth depends on each data seed's class law: their mean)."""
    h = math.log2(k)
    if dataset == "gaussian" and (eraser == "qleace" or cov_gap == 0):
        return h, f"{h:.3f} = H(Y)"
    if dataset == "mixture" and eraser == "qleace":
        from training.data.generators import MixtureOptions, mixture_truth_bits

        fields = set(MixtureOptions.__dataclass_fields__)
        bound = statistics.fmean(mixture_truth_bits(MixtureOptions(**{f: v for f, v in o.items() if f in fields}))
                                 for o in options)
        return bound, f"{bound:.3f} = H(Y|X') < H(Y) = {h:.3f}"
    return None, f"< {h:.3f} (below H(Y))"


Cells = defaultdict[tuple[Any, ...], defaultdict[str, list[float]]]
Options = dict[tuple[Any, ...], list[dict[str, Any]]]


def collect(root: Path, experiment: str) -> tuple[Cells, Options]:
    """Per cell, the MDL of each fit_on's runs, and the distinct dataset options of its runs (one per data seed)."""
    from training.app.result_codec import MalformedResultError, read
    from training.app.result_types import MdlResult, number
    from training.app.results import stored_config
    from training.app.schema import numerics_of

    cells: Cells = defaultdict(lambda: defaultdict(list))
    options: Options = {}
    for path in sorted(root.rglob("result.json")):
        try:
            result = read(path)
        except (OSError, MalformedResultError):
            continue
        if not isinstance(result, MdlResult) or result.mdl is None or result.config is None:
            continue
        c, bits = stored_config(result.config), number(result.mdl.bits_per_sample)  # as today's schema spells it
        if bits is None or c["experiment_name"] != experiment or result.numerics_version != numerics_of("mdl"):
            continue
        d = result.config["dataset"]  # the generator's options (GaussianOptions / MixtureOptions: cov_gap required)
        key = (c["dataset.name"], float(c["dataset.cov_gap"]), float(c["dataset.rows_per_dim"]), c["eraser.name"],
               int(c["dataset.num_classes"]))
        cells[key][c["eraser.fit_on"]].append(bits)
        if dict(d) not in options.setdefault(key, []):
            options[key].append(dict(d))
    return cells, options


def _cell(values: list[float], true: float | None) -> list[str]:
    if not values:
        return ["–", "–"]
    mean = statistics.fmean(values)
    sd = statistics.stdev(values) if len(values) > 1 else 0.0
    return [f"{mean:.3f} ± {sd:.3f} ({len(values)})", "–" if true is None else f"{mean - true:+.3f}"]


def table(cells: Cells, options: Options) -> str:
    head = ["dataset", "cov gap", "rows/class ÷ d", "eraser", "truth"]
    for f in FIT_ON:
        head += [f"{f}", "error"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for (dataset, cov_gap, rows, eraser, k), by_fit in sorted(cells.items()):
        true, shown = truth(dataset, eraser, cov_gap, k, options[(dataset, cov_gap, rows, eraser, k)])
        row = [dataset, f"{cov_gap:g}", f"{rows:g}", eraser, shown]
        for f in FIT_ON:
            row += _cell(by_fit[f], true)  # a defaultdict: no run of this fit_on, no values
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="outputs/runs", type=Path)
    parser.add_argument("--experiment", default="calibrate")
    args = parser.parse_args(argv)
    cells, options = collect(args.root, args.experiment)
    if not cells:
        print(f"error: no results of experiment {args.experiment} under {args.root}: run `make calibrate` first",
              file=sys.stderr)
        return 1
    print(table(cells, options))
    print("\nMDL in bits/sample, mean ± sd over seeds (n); error = MDL − truth. oracle: fitted on 200·d fresh rows per "
          "class; all: on the coded rows (in sample); holdout: on half of the training rows, applied to the other "
          "half.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
