"""The paper's qualitative claims, tested on aggregated MDL results (scripts/aggregate.py --claims).

Every claim compares two configurations per table row (dataset, arch, width, depth), paired by seed: the
per-seed differences of bits/sample, their mean ± sd, an exact one-sided sign test and a one-sided paired t-test.

Verdict of one row: "not enough seeds" with fewer than `MIN_SEEDS` paired seeds; otherwise "holds" when every
paired difference has the claimed sign (sign test p = 2^-n, 0.125 at 3 seeds), else "does not hold". The claim
"wider than ~1K does not lower MDL" is a negative one: it does not hold only when every seed's MDL is lower at
the widest width than at ~1K. A claim's overall verdict: "does not hold" if a row does not, else "not enough
seeds" if a row lacks seeds, else "holds". A claim without any row to test is "not testable here".

Claims compare results of one comparison group only (scripts/aggregate.py: results whose configs differ in
anything but eraser and seed are different groups): `evaluate` refuses a frame of several groups (one line naming
the keys); `evaluate_groups` gives every group its own verdicts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd
from scipy import stats

from scripts.tables import group_labels, groups_in, md_cell, require_one_group

MIN_SEEDS = 3
HOLDS, FAILS, FEW, UNTESTABLE = "holds", "does not hold", "not enough seeds", "not testable here"
WIDE = 1024  # "widths beyond ~1K"


@dataclass(frozen=True)
class Claim:
    key: str
    text: str
    sign: int  # +1: the difference (a - b) is claimed > 0; -1: < 0; 0: the negative width claim (not all < 0)
    rows: Callable[[pd.DataFrame], list[tuple[str, pd.Series, pd.Series]]]  # (row label, a by seed, b by seed)


def _label(key: Sequence[object]) -> str:
    dataset, arch, width, depth, variant = key
    return f"{dataset} {arch} w{width} d{depth}" + (f" [{variant}]" if variant else "")


def _eraser_pairs(a: str, b: str, archs: tuple[str, ...] | None = None):
    """Rows where erasers a and b both have finished seeds (archs: arch tags starting with one of these)."""
    def rows(df: pd.DataFrame) -> list[tuple[str, pd.Series, pd.Series]]:
        out = []
        for key, g in df.groupby(["dataset", "arch", "width", "depth", "variant"], sort=False):
            if archs is not None and not str(key[1]).startswith(archs):
                continue
            ga, gb = g[g.eraser == a], g[g.eraser == b]
            if len(ga) and len(gb):
                out.append((_label(key), ga.set_index("seed").bits_per_sample, gb.set_index("seed").bits_per_sample))
        return out
    return rows


def _width_pairs(df: pd.DataFrame) -> list[tuple[str, pd.Series, pd.Series]]:
    """Per (dataset, arch, depth, eraser) with a width ~1K and a wider one: widest vs ~1K."""
    out = []
    for (dataset, arch, depth, variant, eraser), g in df.groupby(["dataset", "arch", "depth", "variant", "eraser"],
                                                                 sort=False):
        widths = sorted(set(g.width))
        base = [w for w in widths if w >= WIDE]
        if len(base) < 2:
            continue
        lo, hi = base[0], base[-1]
        label = f"{dataset} {arch} d{depth} {eraser}: w{hi} vs w{lo}" + (f" [{variant}]" if variant else "")
        out.append((label, g[g.width == hi].set_index("seed").bits_per_sample,
                    g[g.width == lo].set_index("seed").bits_per_sample))
    return out


CLAIMS: dict[str, Claim] = {c.key: c for c in (
    Claim("leace_raises_mdl", "LEACE raises MDL for every architecture (MDL(leace) - MDL(control) > 0)", +1,
          _eraser_pairs("leace", "control")),
    Claim("qleace_above_leace", "QLEACE raises MDL more than LEACE for MLPs and LeNets "
          "(MDL(qleace) - MDL(leace) > 0)", +1, _eraser_pairs("qleace", "leace", ("mlp", "lenet"))),
    Claim("alf_below_qleace", "ALF-QLEACE raises MDL less than QLEACE (MDL(alf_qleace) - MDL(qleace) < 0)", -1,
          _eraser_pairs("alf_qleace", "qleace")),
    Claim("wide_no_lower", "Widths beyond ~1K do not lower MDL (MDL(widest) - MDL(~1K) not < 0 on every seed)", 0,
          _width_pairs),
)}


@dataclass
class RowTest:
    claim: str
    row: str
    diffs: dict[int, float]
    mean: float
    sd: float
    sign_p: float  # one-sided exact sign test in the claimed direction (for the width claim: of a decrease)
    t_p: float  # one-sided paired t-test, same direction
    verdict: str


def row_test(claim: Claim, row: str, a: pd.Series, b: pd.Series) -> RowTest:
    d = (a - b).dropna()
    diffs = {int(s): float(v) for s, v in d.items()}
    n = len(diffs)
    mean = float(d.mean()) if n else math.nan
    sd = float(d.std(ddof=1)) if n > 1 else math.nan
    direction = claim.sign if claim.sign != 0 else -1  # width claim: test for a decrease
    agree = sum(1 for v in diffs.values() if v * direction > 0)
    sign_p = float(stats.binomtest(agree, n, 0.5, alternative="greater").pvalue) if n else math.nan
    if n > 1 and sd > 0:
        t_p = float(stats.ttest_1samp(list(diffs.values()), 0.0,
                                      alternative="greater" if direction > 0 else "less").pvalue)
    else:
        t_p = math.nan
    if n < MIN_SEEDS:
        verdict = FEW
    elif claim.sign == 0:
        verdict = FAILS if agree == n else HOLDS
    else:
        verdict = HOLDS if agree == n else FAILS
    return RowTest(claim.key, row, diffs, mean, sd, sign_p, t_p, verdict)


def overall(tests: Sequence[RowTest]) -> str:
    verdicts = {t.verdict for t in tests}
    if not verdicts:
        return UNTESTABLE
    return FAILS if FAILS in verdicts else FEW if FEW in verdicts else HOLDS


Results = list[tuple[Claim, list[RowTest], str]]


def evaluate(df: pd.DataFrame, keys: Sequence[str] | None = None) -> Results:
    """Each claim (all, or `keys` in order) with its row tests and overall verdict. `df`: aggregate.py's job
    table (status, dataset, arch, width, depth, variant, eraser, seed, bits_per_sample; group) of one group:
    results of several groups are refused (MixedGroupsError, one line naming the keys that differ)."""
    unknown = [k for k in keys or () if k not in CLAIMS]
    if unknown:
        raise ValueError(f"unknown claims {unknown}; known: {sorted(CLAIMS)}")
    require_one_group(df, "a claim")
    # Unfinished jobs keep their row (so a row of the sweep without enough results says so), without a value.
    done = df.copy()
    if "status" in done:
        done.loc[done.status != "done", "bits_per_sample"] = math.nan
    if "variant" not in done:
        done = done.assign(variant="")
    out = []
    for key in keys or list(CLAIMS):
        claim = CLAIMS[key]
        tests = [row_test(claim, row, a, b) for row, a, b in claim.rows(done)]
        out.append((claim, tests, overall(tests)))
    return out


def evaluate_groups(df: pd.DataFrame, keys: Sequence[str] | None = None) -> list[tuple[str, Results]]:
    """`evaluate` per comparison group: [(group, its claims)], groups in order of appearance."""
    if "group" not in df:
        return [("{}", evaluate(df, keys))]
    return [(g, evaluate(df[df.group == g], keys)) for g in groups_in(df)]


def _num(x: float, digits: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


HEADER = ["## The paper's claims (paired by seed, bits/sample)", "",
          f"Verdict per row: holds when all of ≥ {MIN_SEEDS} paired seeds show the claimed sign (exact sign "
          "test p = 2^-n); the width claim fails only when every seed is lower at the widest width.", ""]


def markdown(results: Results, header: bool = True) -> str:
    lines = [*(HEADER if header else []),
             "| claim | row | per-seed differences | mean ± sd | sign test p | paired t p | verdict |",
             "|---|---|---|---|---|---|---|"]
    untestable = []
    for claim, tests, verdict in results:
        if not tests:
            untestable.append(claim)
            continue
        for t in tests:
            diffs = ", ".join(f"s{s}: {v:+.3f}" for s, v in sorted(t.diffs.items()))
            lines.append(f"| {claim.key} | {md_cell(t.row)} | {diffs} | {_num(t.mean)} ± {_num(t.sd)} | "
                         f"{_num(t.sign_p)} | {_num(t.t_p)} | {t.verdict} |")
        lines.append(f"| **{claim.key}** | **overall** | | | | | **{verdict}** |")
    lines.append("")
    for claim, _, verdict in results:
        lines.append(f"- {claim.text}: **{verdict}**")
    if untestable:
        lines += ["", "Not testable with these results: " + "; ".join(c.key for c in untestable)]
    return "\n".join(lines) + "\n"


def markdown_groups(per_group: Sequence[tuple[str, Results]]) -> str:
    """The report of `evaluate_groups`: as `markdown` for one group, else a section (and verdicts) per group."""
    if len(per_group) == 1:
        return markdown(per_group[0][1])
    parts = ["\n".join(HEADER)]
    labels = group_labels([g for g, _ in per_group])
    for i, (group, results) in enumerate(per_group, 1):
        parts.append(f"### Group {i}: {labels[group]}\n\n{markdown(results, header=False)}")
    return "\n".join(parts)
