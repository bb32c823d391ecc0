"""The calibration table (`make calibrate`): MDL of erased generator data against known answers.

    python -m scripts.calibrate [outputs/calibrate] [--experiment calibrate]

Reads the result.json files of the preset's jobs under the given folder (`make calibrate` runs its sweep into
outputs/calibrate and reads only that) and prints one row per cell: every config key that differs between the
results is part of the cell (dataset.dim, permute_labels, the eraser's options ...), except the seed and the fit mode
(eraser.fit_on), which are the columns. Per cell:

- truth: H(Y | X') after the POPULATION eraser (training/data/generators.py `population_truth_bits`, Monte Carlo
  over fresh draws, its standard error below 0.005): the code length a learner approaches with unlimited data;
- floor: the Bayes posterior coded on the cell's own blocks, in expectation: block 1 at log2 K (the uniform code),
  the rest at the truth;
- per fit mode (population, self, holdout, oracle, all; "self shuffled" ...: fitted on shuffled labels,
  `eraser.fit_labels=shuffled`, the non-specific-removal control): the MDL, mean ± sd over seeds (n);
- bias of each fitted mode against the paired population eraser (the same coded rows, split and initialisations:
  `eraser.fit_on=population`), mean ± 95% t CI over seeds;
- coverage: the share of seeds whose population MDL lies inside [min(holdout, self), max(holdout, self)].
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import sys
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Fit modes (columns); "<mode> shuffled": fitted on shuffled labels (eraser.fit_labels=shuffled, the non-specific-
# removal control), applied to the same true-label rows.
SHUFFLED = tuple(f"{m} shuffled" for m in ("self", "holdout", "all"))
FIT_ON = ("population", "self", "holdout", "oracle", "all", *SHUFFLED)
FITTED = ("self", "holdout", "oracle", "all", *SHUFFLED)  # bias against the paired population eraser
# Keys that are not part of a cell: the seed pairs runs, the fit mode is a column, and the fitting keys only say how
# each mode was fitted (each mode reads its own: training/data/eraser_config.fit_keys_used).
NOT_CELL = ("seed", "eraser.fit_on", "eraser.fit_source", "eraser.fit_fraction", "eraser.n_fit", "numerics_version",
            "eraser.fit_labels")


@dataclass
class Cell:
    """One cell's runs: fit mode -> seed -> MDL; the dataset options of its runs (one per data seed); the eraser and
    its options; the first block's share of the coded rows (for the floor)."""

    config: dict[str, Any]
    dataset: str  # what the cell's own code reads of its config, typed once (config_view has every declared key)
    eraser: str
    num_classes: int
    permuted: bool
    runs: defaultdict[str, dict[int, float]] = field(default_factory=lambda: defaultdict(dict))
    options: list[dict[str, Any]] = field(default_factory=list)
    first_share: list[float] = field(default_factory=list)


Cells = dict[str, Cell]


def collect(root: Path, experiment: str) -> Cells:
    """Per cell (its identity as JSON, every differing key), the MDL of each fit mode's runs by seed."""
    from training.app.result_codec import MalformedResultError, config_view, read
    from training.app.result_types import number
    from training.app.schema import numerics_of
    from training.app.tasks import spec_of
    from training.tasks.mdl.aggregate_collect import config_identity
    from training.tasks.mdl.result import MdlResult

    mdl = spec_of("mdl")

    cells: Cells = {}
    for path in sorted(root.rglob("result.json")):
        try:
            result = read(path, mdl)
        except (OSError, MalformedResultError):
            continue
        if not isinstance(result, MdlResult) or result.body.mdl is None or result.config is None:
            continue
        c, bits = config_view(result.config), number(result.body.mdl.bits_per_sample)
        if bits is None or c["experiment_name"] != experiment or result.numerics_version != numerics_of(mdl):
            continue
        identity = {k: v for k, v in config_identity(dict(result.config)).items() if k not in NOT_CELL}
        key = json.dumps(identity, sort_keys=True, default=str)
        cell = cells.setdefault(key, Cell(identity, str(c["dataset.name"]), str(c["eraser.name"]),
                                          int(c["dataset.num_classes"]), bool(c["dataset.permute_labels"])))
        mode = str(c["eraser.fit_on"]) + (" shuffled" if c["eraser.fit_labels"] == "shuffled" else "")
        cell.runs[mode][int(c["seed"])] = float(bits)
        if (d := dict(result.config["dataset"])) not in cell.options:
            cell.options.append(d)
        sizes = result.body.mdl.raw.get("block_sizes")
        if isinstance(sizes, list) and sizes and sum(sizes) > 0:
            cell.first_share.append(sizes[0] / sum(sizes))
    return cells


def truth(cell: Cell, rows_per_class: int = 50_000) -> float | None:
    """H(Y | X') under the population eraser (the mean over the cell's data seeds); None where the data is not a
    generator's or the eraser has no moments fit."""
    from erasure.registry import ERASERS
    from training.data.generators import GaussianOptions, MixtureOptions, population_truth_bits

    eraser = cell.eraser
    kind = {"gaussian": GaussianOptions, "mixture": MixtureOptions}.get(cell.dataset)
    if kind is None or eraser not in ERASERS or "from_moments" not in ERASERS.meta(eraser) or cell.permuted:
        return None
    fields = {f.name for f in dataclasses.fields(kind)}
    options = {k[len("eraser.options."):]: v for k, v in cell.config.items() if k.startswith("eraser.options.")}
    options = {k: v for k, v in options.items() if k not in ("progress", "device")}
    return statistics.fmean(population_truth_bits(kind(**{f: v for f, v in o.items() if f in fields}),
                                                  eraser, options, rows_per_class)[0] for o in cell.options)


def floor(cell: Cell, true: float | None) -> float | None:
    """The Bayes posterior's expected code on the cell's blocks: block 1 at log2 K, the rest at the truth."""
    if true is None or not cell.first_share:
        return None
    share = statistics.fmean(cell.first_share)
    return share * math.log2(cell.num_classes) + (1 - share) * true


def mean_ci(values: list[float]) -> tuple[float, float]:
    """Mean and half-width of the 95% t interval (NaN below 2 values)."""
    from scipy import stats

    if not values:
        return math.nan, math.nan
    mean = statistics.fmean(values)
    if len(values) < 2:
        return mean, math.nan
    return mean, float(stats.t.ppf(0.975, len(values) - 1) * statistics.stdev(values) / math.sqrt(len(values)))


def bias(cell: Cell, mode: str) -> list[float]:
    """Per seed that has both: MDL(mode) − MDL(population) on the same coded rows."""
    pop, fit = cell.runs.get("population", {}), cell.runs.get(mode, {})
    return [fit[s] - pop[s] for s in sorted(set(pop) & set(fit))]


def coverage(cell: Cell) -> tuple[int, int]:
    """(seeds whose population MDL lies inside [min(holdout, self), max(holdout, self)], seeds with all three)."""
    pop, h, s = (cell.runs.get(m, {}) for m in ("population", "holdout", "self"))
    seeds = sorted(set(pop) & set(h) & set(s))
    return sum(min(h[i], s[i]) <= pop[i] <= max(h[i], s[i]) for i in seeds), len(seeds)


def _num(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or math.isnan(x) else f"{x:.{digits}f}"


def _shown_keys(cells: Cells) -> list[str]:
    """The keys whose values differ between the cells (every one of them is shown)."""
    keys = sorted(set().union(*(c.config for c in cells.values())))
    return [k for k in keys if len({json.dumps(_value(c, k), default=str) for c in cells.values()}) > 1]


def _value(cell: Cell, key: str) -> Any:
    """A key of the cell's identity, "?" where its results did not record it."""
    return cell.config[key] if key in cell.config else "?"


@dataclass
class Row:
    label: str
    cell: Cell
    truth: float | None
    floor: float | None


def rows(cells: Cells, rows_per_class: int = 50_000) -> list[Row]:
    """A row per cell, labelled by its eraser and every other key whose value differs between the cells (an
    eraser option: where it differs between cells of that eraser)."""
    shown = [k for k in _shown_keys(cells) if not k.startswith("eraser.")]
    by_eraser: defaultdict[str, Cells] = defaultdict(dict)
    for key, cell in cells.items():
        by_eraser[cell.eraser][key] = cell
    out = []
    for cell in cells.values():
        eraser = cell.eraser
        keys = shown + [k for k in _shown_keys(by_eraser[eraser]) if k.startswith("eraser.")]
        label = f"{eraser}: " + (", ".join(f"{k.removeprefix('dataset.')}={_value(cell, k)}" for k in keys)
                                 or cell.dataset)
        true = truth(cell, rows_per_class)
        out.append(Row(label, cell, true, floor(cell, true)))
    return sorted(out, key=lambda r: r.label)


def table(rows_: list[Row]) -> str:
    modes = [m for m in FIT_ON if any(m in r.cell.runs for r in rows_)]
    head = ["cell", "truth", "floor", *(f"{m}" for m in modes), *(f"bias {m}" for m in FITTED if m in modes),
            "coverage"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows_:
        row = [r.label, _num(r.truth), _num(r.floor)]
        for m in modes:
            v = list(r.cell.runs.get(m, {}).values())
            sd = statistics.stdev(v) if len(v) > 1 else math.nan
            row.append(f"{statistics.fmean(v):.3f} ± {_num(sd)} ({len(v)})" if v else "–")
        for m in FITTED:
            if m in modes:
                b = bias(r.cell, m)
                mean, ci = mean_ci(b)
                row.append(f"{mean:+.3f} ± {_num(ci)}" if b else "–")
        inside, n = coverage(r.cell)
        row.append(f"{inside}/{n}" if n else "–")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines)


def summary(rows_: list[Row]) -> str:
    """Coverage over every cell × seed, and per fitted mode its mean bias over the cells."""
    inside = sum(coverage(r.cell)[0] for r in rows_)
    total = sum(coverage(r.cell)[1] for r in rows_)
    parts = [f"coverage {inside}/{total} = {inside / total:.2f} of cell × seed pairs" if total else "no coverage"]
    for m in FITTED:
        if b := [v for r in rows_ for v in bias(r.cell, m)]:
            mean, ci = mean_ci(b)
            parts.append(f"bias {m} {mean:+.3f} ± {_num(ci)}")
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", default="outputs/calibrate", type=Path)
    parser.add_argument("--experiment", default="calibrate")
    args = parser.parse_args(argv)
    cells = collect(args.root, args.experiment)
    if not cells:
        print(f"error: no results of experiment {args.experiment} under {args.root}: run `make calibrate` first",
              file=sys.stderr)
        return 1
    found = rows(cells)
    print(table(found))
    print(f"\n{summary(found)}")
    print("\nMDL in bits/sample, mean ± sd over seeds (n). truth: H(Y|X') under the population eraser; floor: the "
          "Bayes posterior on the same blocks (block 1 at log2 K); bias: MDL(mode) − MDL(population) on the same "
          "rows, mean ± 95% CI over seeds; coverage: seeds whose population MDL lies in [min, max] of holdout and "
          "self.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
