"""The paper's qualitative claims, tested on aggregated MDL results (scripts/aggregate.py --claims).

Every claim compares two configurations per table row (dataset, arch, width, depth), paired by seed: the
per-seed differences of bits/sample, their mean ± sd, an exact one-sided sign test and a one-sided paired t-test.

Verdict of one row: "not enough seeds" with fewer than `MIN_SEEDS` paired seeds; otherwise "holds" when every
paired difference has the claimed sign (sign test p = 2^-n, 0.125 at 3 seeds), else "does not hold". The claim
"wider than ~1K does not lower MDL" is a negative one: it does not hold only when every seed's MDL is lower at
the widest width than at ~1K. A claim's overall verdict: "does not hold" if a row does not, else "not enough
seeds" if a row lacks seeds, else "holds". A claim without any row to test is "not testable here".

Once the bias is accounted for: where both sides of a row have a permuted-label null run (scripts/aggregate.py:
`dataset.permute_labels=true`, same config otherwise), each side's bias = null MDL − label entropy is subtracted
(scripts/tables.null_bias), i.e. the per-seed differences are shifted by −(bias_a − bias_b), and the same rule is
applied again. The row's verdict after the bias: "holds" when the shifted differences hold, "holds only before
the bias" when only the raw ones do, "does not hold" when neither does, "bias unknown (no null run)" when a side
has no null ("not enough seeds" as before). The claim's verdict after the bias: the first of does not hold, holds
only before the bias, not enough seeds, bias unknown that a row has, else holds. The raw verdict is unchanged.
Rows are (dataset, arch, width, depth, fit_on, variant): an eraser fitted on a holdout is compared with a control
coded on the same samples; each seed's value is its mean over folds.

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

from scripts.tables import group_labels, groups_in, md_cell, null_bias, require_one_group, seed_means

MIN_SEEDS = 3
HOLDS, FAILS, FEW, UNTESTABLE = "holds", "does not hold", "not enough seeds", "not testable here"
BEFORE_ONLY, NO_NULL = "holds only before the bias", "bias unknown (no null run)"
ROW = ["dataset", "arch", "width", "depth", "fit_on", "variant"]
# (row label, a by seed, b by seed, bias of a, bias of b): a side's bias is NaN without a null run.
Rows = list[tuple[str, pd.Series, pd.Series, float, float]]
WIDE = 1024  # "widths beyond ~1K"


@dataclass(frozen=True)
class Claim:
    key: str
    text: str
    sign: int  # +1: the difference (a - b) is claimed > 0; -1: < 0; 0: the negative width claim (not all < 0)
    rows: Callable[[pd.DataFrame], Rows]  # the rows of a job table (true-label and null runs)


def _fit_text(fit_on: object) -> str:
    return "" if fit_on == "all" else f" (fit on {fit_on})"


def _label(key: Sequence[object]) -> str:
    dataset, arch, width, depth, fit_on, variant = key
    return f"{dataset} {arch} w{width} d{depth}{_fit_text(fit_on)}" + (f" [{variant}]" if variant else "")


def _bias(nulls: pd.DataFrame) -> float:
    return null_bias(nulls)[1]


def _split(g: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(true-label runs, null runs)."""
    null = g["null"].astype(bool)
    return g[~null], g[null]


def _eraser_pairs(a: str, b: str, archs: tuple[str, ...] | None = None):
    """Rows where erasers a and b both have finished seeds (archs: arch tags starting with one of these)."""
    def rows(df: pd.DataFrame) -> Rows:
        out = []
        for key, g in df.groupby(ROW, sort=False):
            if archs is not None and not str(key[1]).startswith(archs):
                continue
            true, null = _split(g)
            ga, gb = true[true.eraser == a], true[true.eraser == b]
            if len(ga) and len(gb):
                out.append((_label(key), seed_means(ga), seed_means(gb), _bias(null[null.eraser == a]),
                            _bias(null[null.eraser == b])))
        return out
    return rows


def _width_pairs(df: pd.DataFrame) -> Rows:
    """Per (dataset, arch, depth, eraser) with a width ~1K and a wider one: widest vs ~1K."""
    out = []
    for (dataset, arch, depth, fit_on, variant, eraser), g in df.groupby(
            ["dataset", "arch", "depth", "fit_on", "variant", "eraser"], sort=False):
        true, null = _split(g)
        base = [w for w in sorted(set(true.width)) if w >= WIDE]
        if len(base) < 2:
            continue
        lo, hi = base[0], base[-1]
        label = f"{dataset} {arch} d{depth} {eraser}: w{hi} vs w{lo}{_fit_text(fit_on)}" + \
            (f" [{variant}]" if variant else "")
        out.append((label, seed_means(true[true.width == hi]), seed_means(true[true.width == lo]),
                    _bias(null[null.width == hi]), _bias(null[null.width == lo])))
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
    bias_a: float = math.nan  # each side's bias (null MDL − label entropy); NaN: no null run
    bias_b: float = math.nan
    bias_verdict: str = NO_NULL  # the verdict once the bias is accounted for


def _rule(claim: Claim, diffs: Sequence[float]) -> str:
    """The verdict of ≥ MIN_SEEDS paired differences."""
    direction = claim.sign if claim.sign != 0 else -1
    agree = sum(1 for v in diffs if v * direction > 0)
    if claim.sign == 0:
        return FAILS if agree == len(diffs) else HOLDS
    return HOLDS if agree == len(diffs) else FAILS


def row_test(claim: Claim, row: str, a: pd.Series, b: pd.Series, bias_a: float = math.nan,
             bias_b: float = math.nan) -> RowTest:
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
    verdict = FEW if n < MIN_SEEDS else _rule(claim, list(diffs.values()))
    shift = bias_a - bias_b
    if verdict == FEW:
        after = FEW
    elif math.isnan(shift):
        after = NO_NULL
    elif _rule(claim, [v - shift for v in diffs.values()]) == HOLDS:
        after = HOLDS
    else:
        after = BEFORE_ONLY if verdict == HOLDS else FAILS
    return RowTest(claim.key, row, diffs, mean, sd, sign_p, t_p, verdict, bias_a, bias_b, after)


def overall(tests: Sequence[RowTest]) -> str:
    verdicts = {t.verdict for t in tests}
    if not verdicts:
        return UNTESTABLE
    return FAILS if FAILS in verdicts else FEW if FEW in verdicts else HOLDS


def overall_after_bias(tests: Sequence[RowTest]) -> str:
    """A claim's verdict once the bias is accounted for: the first of does not hold, holds only before the bias,
    not enough seeds, bias unknown that a row has; else holds."""
    verdicts = {t.bias_verdict for t in tests}
    if not verdicts:
        return UNTESTABLE
    return next((v for v in (FAILS, BEFORE_ONLY, FEW, NO_NULL) if v in verdicts), HOLDS)


Results = list[tuple[Claim, list[RowTest], str]]


def evaluate(df: pd.DataFrame, keys: Sequence[str] | None = None) -> Results:
    """Each claim (all, or `keys` in order) with its row tests and overall verdict. `df`: aggregate.py's job
    table (status, dataset, arch, width, depth, variant, eraser, seed, bits_per_sample; group; where present
    fit_on, fold, null, ref_bits) of one group: results of several groups are refused (MixedGroupsError, one line
    naming the keys that differ)."""
    unknown = [k for k in keys or () if k not in CLAIMS]
    if unknown:
        raise ValueError(f"unknown claims {unknown}; known: {sorted(CLAIMS)}")
    require_one_group(df, "a claim")
    # Unfinished jobs keep their row (so a row of the sweep without enough results says so), without a value.
    done = df.copy()
    if "status" in done:
        done.loc[done.status != "done", "bits_per_sample"] = math.nan
    for col, default in (("variant", ""), ("fit_on", "all"), ("null", False), ("ref_bits", math.nan)):
        if col not in done:
            done = done.assign(**{col: default})
    out = []
    for key in keys or list(CLAIMS):
        claim = CLAIMS[key]
        tests = [row_test(claim, *row) for row in claim.rows(done)]
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
          "test p = 2^-n); the width claim fails only when every seed is lower at the widest width.",
          "After the bias: the same rule on the differences minus (bias a − bias b), each side's bias = its "
          "permuted-label null MDL − label entropy (`dataset.permute_labels=true`); holds, holds only before the "
          "bias, does not hold, or bias unknown (no null run) when a side has none.", ""]


def _shift(t: RowTest) -> str:
    shift = t.bias_a - t.bias_b
    return "–" if math.isnan(shift) else f"{shift:+.3f}"


def markdown(results: Results, header: bool = True) -> str:
    lines = [*(HEADER if header else []),
             "| claim | row | per-seed differences | mean ± sd | sign test p | paired t p | verdict | bias a − b "
             "| after the bias |",
             "|---|---|---|---|---|---|---|---|---|"]
    untestable = []
    for claim, tests, verdict in results:
        if not tests:
            untestable.append(claim)
            continue
        for t in tests:
            diffs = ", ".join(f"s{s}: {v:+.3f}" for s, v in sorted(t.diffs.items()))
            lines.append(f"| {claim.key} | {md_cell(t.row)} | {diffs} | {_num(t.mean)} ± {_num(t.sd)} | "
                         f"{_num(t.sign_p)} | {_num(t.t_p)} | {t.verdict} | {_shift(t)} | {t.bias_verdict} |")
        lines.append(f"| **{claim.key}** | **overall** | | | | | **{verdict}** | | "
                     f"**{overall_after_bias(tests)}** |")
    lines.append("")
    for claim, tests, verdict in results:
        lines.append(f"- {claim.text}: **{verdict}**; after the bias: **{overall_after_bias(tests)}**")
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
