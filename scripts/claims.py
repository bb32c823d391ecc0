"""The paper's qualitative claims, tested on aggregated MDL results (scripts/aggregate.py --claims).

Every claim compares two sides (two erasers, or two widths of one eraser) per table row (dataset, arch, width,
depth, eraser variants), paired by seed; each seed's value is its mean over repeats.

Measurements. An eraser fitted out of sample (`eraser.fit_on=holdout`, split or pool) reads low, one fitted on the
coded rows (`self`, or `all` where it codes as many rows) reads high: a side fitted both ways at equal n_coded has a
BRACKET per seed, [min, max] of the two. A row is one measurement: a bracket (holdout with self, or with all at
equal n_coded), or one fit mode alone (all, self, holdout, oracle: "single"). The identity eraser (control) has no
fit: its runs at one n_coded stand for either end.

Verdict of one row, first that applies:
- "not enough seeds": fewer than MIN_SEEDS seeds have every value;
- "does not hold": on some seed a raw difference (per fit mode) contradicts the claim, or (single row) not every
  seed shows the claimed sign;
- "brackets overlap": a bracket row whose raw differences agree but whose brackets do not separate on every seed;
- "not identifiable": a single row where a side is flagged: a probe below chance (dependence) or its permuted-label
  null below the label entropy (injection; scripts/tables.bias_flag);
- "budget-bound": a side has more than BUDGET_SHARE of its block models at the cap (scripts/aggregate_collect.at_cap);
- "holds": the two sides separate in the claimed direction on every seed (bracket: the whole brackets).
The claim "wider than ~1K does not lower MDL" is a negative one: it does not hold when the widest width's bracket
lies below ~1K's on every seed; raw differences all lower in one fit mode while the brackets overlap read "brackets
overlap"; else it holds (flags and budget as above).

Beside the verdict: the per-seed margin (how far the sides separate in the claimed direction; > 0 supports it), its
mean ± 95% CI (t), an exact one-sided sign test and a one-sided paired t-test of the margin, each Holm-corrected
across the rows of all claims (and groups) of one report. A claim's overall verdict: the first of does not hold,
brackets overlap, not identifiable, budget-bound, not enough seeds that a row has, else holds; without a row it is
"not testable here".

Claims compare results of one comparison group only (scripts/aggregate.py: results whose configs differ in
anything but eraser and seed are different groups): `evaluate` refuses a frame of several groups (one line naming
the keys); `evaluate_groups` gives every group its own verdicts, and the report says which claims hold in every
group (a sensitivity sweep's groups: `experiment=sensitivity`).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd
from scipy import stats

from training.analysis.tables import (
    BUDGET_SHARE,
    INJECTION,
    at_cap_share,
    bias_flag,
    bias_noise,
    group_labels,
    groups_in,
    is_identity,
    md_cell,
    null_bias,
    probe_below_chance,
    require_one_group,
    seed_means,
)

MIN_SEEDS = 5
HOLDS, FAILS, FEW, UNTESTABLE = "holds", "does not hold", "not enough seeds", "not testable here"
OVERLAP, NOT_IDENTIFIABLE, BUDGET = "brackets overlap", "not identifiable", "budget-bound"
ORDER = (FAILS, OVERLAP, NOT_IDENTIFIABLE, BUDGET, FEW)  # a claim's overall verdict: the first a row has
IN_SAMPLE = ("self", "all")  # in-sample bracket ends (holdout: the out-of-sample end; oracle: a single row)
FIT_MODES = ("all", "self", "holdout", "oracle")
WIDE = 1024  # "widths beyond ~1K"


@dataclass
class Side:
    """One side of a row: per fit mode its runs (a job-table slice), and its n_coded where known."""

    name: str
    runs: dict[str, pd.DataFrame]
    control: bool = False  # no fit: runs of one fit mode stand for the others at the same n_coded

    def n_coded(self, mode: str) -> float:
        if mode not in self.runs or "n_coded" not in self.runs[mode]:
            return math.nan
        v = pd.to_numeric(self.runs[mode]["n_coded"], errors="coerce").dropna()
        return float(v.iloc[0]) if len(v) and v.nunique() == 1 else math.nan


@dataclass
class Measurement:
    label: str  # "[holdout, self]" (a bracket), "all", ...
    out_mode: str | None
    in_mode: str | None

    @property
    def modes(self) -> list[str]:
        return [m for m in (self.out_mode, self.in_mode) if m is not None]

    @property
    def bracket(self) -> bool:
        return self.out_mode is not None and self.in_mode is not None


def _equal_n(a: float, b: float, unknown_equal: bool) -> bool:
    return unknown_equal if math.isnan(a) or math.isnan(b) else a == b


def measurements(sides: Sequence[Side]) -> list[Measurement]:
    """The measurements both sides have: brackets (holdout with self, else with all at equal n_coded), and every
    mode no bracket uses as a single measurement. A control side has whatever its runs at the same n_coded give."""
    fitted = [s for s in sides if not s.control] or list(sides)
    common = set(FIT_MODES)
    for s in fitted:
        common &= set(s.runs)
    controls = [s for s in sides if s.control]
    ref = fitted[0]
    out: list[Measurement] = []
    used: set[str] = set()
    if "holdout" in common:
        n = ref.n_coded("holdout")
        partner = "self" if "self" in common else \
            "all" if "all" in common and _equal_n(ref.n_coded("all"), n, False) else None
        if partner is not None:
            out.append(Measurement(f"[holdout, {partner}]", "holdout", partner))
            used |= {"holdout", partner}
    for mode in FIT_MODES:
        if mode in common and mode not in used:
            out.append(Measurement(mode, mode if mode in ("holdout", "oracle") else None,
                                   mode if mode in IN_SAMPLE else None))
    return [m for m in out if all(_control_runs(c, m, ref) for c in controls)]


def _control_runs(side: Side, m: Measurement, ref: Side) -> dict[str, pd.DataFrame]:
    """mode -> the control's runs standing for it at the reference side's n_coded ({} if it has none)."""
    found = {}
    for mode in m.modes:
        if mode in side.runs:
            found[mode] = side.runs[mode]
            continue
        n = ref.n_coded(mode)
        twin = next((k for k, g in side.runs.items() if k != "oracle" and mode != "oracle"
                     and _equal_n(side.n_coded(k), n, {k, mode} <= {"holdout", "self"})), None)
        if twin is None:
            return {}
        found[mode] = side.runs[twin]
    return found


def _side_runs(side: Side, m: Measurement, ref: Side) -> dict[str, pd.DataFrame]:
    return _control_runs(side, m, ref) if side.control else {k: side.runs[k] for k in m.modes}


def _flags(runs: dict[str, pd.DataFrame], nulls: dict[str, pd.DataFrame]) -> list[str]:
    """Why a side's measurement is suspect: a probe below chance, its null below the label entropy."""
    out = []
    for mode, g in runs.items():
        if probe_below_chance(g):
            out.append(f"probe below chance ({mode})")
        if mode in nulls and len(nulls[mode]):
            bias = null_bias(nulls[mode])[1]
            if bias_flag(bias, bias_noise(seed_means(nulls[mode]).dropna())[0]) == INJECTION:
                out.append(f"null {bias:+.3f} ({mode})")
    return out


def _budget(runs: dict[str, pd.DataFrame]) -> list[str]:
    out = []
    for mode, g in runs.items():
        share, known = at_cap_share(g)
        if known and share > BUDGET_SHARE:
            out.append(f"{share:.0%} at cap ({mode})")
    return out


@dataclass
class RowInput:
    row: str
    a: dict[str, pd.Series]  # fit mode -> per-seed values
    b: dict[str, pd.Series]
    bracket: bool
    flags: list[str] = field(default_factory=list)
    budget: list[str] = field(default_factory=list)


def _row_inputs(label: str, a: Side, b: Side, nulls_a: dict[str, pd.DataFrame],
                nulls_b: dict[str, pd.DataFrame]) -> list[RowInput]:
    out = []
    ref = a if not a.control else b
    for m in measurements([a, b]):
        ra, rb = _side_runs(a, m, ref), _side_runs(b, m, ref)
        if not ra or not rb:
            continue
        flags = [f"a: {f}" for f in _flags(ra, nulls_a)] + [f"b: {f}" for f in _flags(rb, nulls_b)]
        budget = [f"a: {f}" for f in _budget(ra)] + [f"b: {f}" for f in _budget(rb)]
        fit = "" if m.label == "all" else f" (fit on {m.label})"
        out.append(RowInput(label + fit, {k: seed_means(g) for k, g in ra.items()},
                            {k: seed_means(g) for k, g in rb.items()}, m.bracket, flags, budget))
    return out


Rows = list[RowInput]


@dataclass(frozen=True)
class Claim:
    key: str
    text: str
    sign: int  # +1: the difference (a - b) is claimed > 0; -1: < 0; 0: the negative width claim (not all < 0)
    rows: Callable[[pd.DataFrame], Rows]  # the rows of a job table (true-label and null runs)


def _split(g: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(true-label runs, null runs)."""
    null = g["null"].astype(bool)
    return g[~null], g[null]


def _by_mode(g: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {str(k): gg for k, gg in g.groupby("fit_on", sort=False)}


def _variant_runs(true: pd.DataFrame, eraser: str, variant: str) -> pd.DataFrame:
    """The runs of one eraser variant across fit modes; a fit mode whose runs have no variant joins every one."""
    g = true[true.eraser == eraser]
    plain = g.groupby("fit_on").variant.transform(lambda v: set(v) == {""})
    return g[(g.variant == variant) | plain]


def _side(name: str, runs: pd.DataFrame) -> Side:
    return Side(name, _by_mode(runs), control=is_identity(name))


def _eraser_pairs(a: str, b: str, archs: tuple[str, ...] | None = None) -> Callable[[pd.DataFrame], Rows]:
    """Rows where erasers a and b both have finished seeds (archs: arch tags starting with one of these); each
    variant of one paired with the same variant of the other, or with the other's only (unnamed) one."""
    def rows(df: pd.DataFrame) -> Rows:
        out: Rows = []
        for (dataset, arch, width, depth), g in df.groupby(["dataset", "arch", "width", "depth"], sort=False):
            if archs is not None and not str(arch).startswith(archs):
                continue
            true, null = _split(g)
            va = list(dict.fromkeys(true[true.eraser == a].variant))
            vb = list(dict.fromkeys(true[true.eraser == b].variant))
            for x in va:
                for y in vb:
                    if x != y and x and y:
                        continue
                    label = f"{dataset} {arch} w{width} d{depth}" + "".join(f" [{v}]" for v in dict.fromkeys((x, y))
                                                                          if v)
                    sa, sb = _side(a, _variant_runs(true, a, x)), _side(b, _variant_runs(true, b, y))
                    out += _row_inputs(label, sa, sb, _by_mode(_variant_runs(null, a, x)),
                                       _by_mode(_variant_runs(null, b, y)))
        return out
    return rows


def _width_pairs(df: pd.DataFrame) -> Rows:
    """Per (dataset, arch, depth, eraser variant) with a width ~1K and a wider one: widest vs ~1K."""
    out: Rows = []
    for (dataset, arch, depth, variant, eraser), g in df.groupby(
            ["dataset", "arch", "depth", "variant", "eraser"], sort=False):
        true, null = _split(g)
        base = [w for w in sorted(set(true.width)) if w >= WIDE]
        if len(base) < 2:
            continue
        lo, hi = base[0], base[-1]
        label = f"{dataset} {arch} d{depth} {eraser}: w{hi} vs w{lo}" + (f" [{variant}]" if variant else "")
        out += _row_inputs(label, _side(eraser, true[true.width == hi]), _side(eraser, true[true.width == lo]),
                           _by_mode(null[null.width == hi]), _by_mode(null[null.width == lo]))
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
    diffs: dict[str, dict[int, float]]  # fit mode -> seed -> raw difference a - b
    margins: dict[int, float]  # seed -> separation in the tested direction (> 0: separated that way)
    mean: float  # of the margins
    ci: float  # half-width of the 95% t interval of the mean margin
    sign_p: float  # one-sided exact sign test of the margins (> 0)
    t_p: float  # one-sided paired t-test of the margins (> 0)
    verdict: str
    bracket: bool = False
    why: str = ""  # flags / budget behind the verdict
    holm_sign_p: float = math.nan
    holm_t_p: float = math.nan


def _margins(direction: int, a: dict[str, pd.Series], b: dict[str, pd.Series]) -> pd.Series:
    """Per seed: how far the sides' brackets ([min, max] over fit modes) separate in `direction` (> 0: a above b
    for +1, a below b for -1); only seeds with every value."""
    fa, fb = pd.concat(a, axis=1), pd.concat(b, axis=1)
    seeds = fa.dropna().index.intersection(fb.dropna().index)
    fa, fb = fa.loc[seeds], fb.loc[seeds]
    if direction > 0:
        return fa.min(axis=1) - fb.max(axis=1)
    return fb.min(axis=1) - fa.max(axis=1)


def row_test(claim: Claim, r: RowInput) -> RowTest:
    direction = claim.sign if claim.sign != 0 else -1  # width claim: test for a decrease
    margins = _margins(direction, r.a, r.b)
    diffs = {mode: {int(s): float(v) for s, v in (r.a[mode] - r.b[mode]).loc[margins.index].items()}
             for mode in r.a}
    m = {int(s): float(v) for s, v in margins.items()}
    n = len(m)
    values = list(m.values())
    mean = float(sum(values) / n) if n else math.nan
    sd = float(pd.Series(values).std(ddof=1)) if n > 1 else math.nan
    ci = float(stats.t.ppf(0.975, n - 1) * sd / math.sqrt(n)) if n > 1 else math.nan
    sign_p = float(stats.binomtest(sum(v > 0 for v in values), n, 0.5, alternative="greater").pvalue) if n \
        else math.nan
    t_p = float(stats.t.sf(mean / (sd / math.sqrt(n)), n - 1)) if n > 1 and sd > 0 else math.nan
    separated = n > 0 and all(v > 0 for v in values)
    # raw differences: per fit mode, do all seeds show the tested direction? does some seed contradict it?
    every = [all(v * direction > 0 for v in d.values()) for d in diffs.values()]
    against = any(v * direction < 0 for d in diffs.values() for v in d.values())
    why = "; ".join(r.flags + r.budget)
    if n < MIN_SEEDS:
        verdict = FEW
    elif claim.sign == 0:  # the negative claim: refuted by a separated decrease
        verdict = FAILS if separated else OVERLAP if any(every) else HOLDS
    elif against or (not r.bracket and not separated):
        verdict = FAILS
    elif not separated:
        verdict = OVERLAP
    else:
        verdict = HOLDS
    if verdict in (HOLDS, FAILS) and not r.bracket and r.flags:
        verdict = NOT_IDENTIFIABLE
    elif verdict in (HOLDS, FAILS, OVERLAP) and r.budget:
        verdict = BUDGET
    return RowTest(claim.key, r.row, diffs, m, mean, ci, sign_p, t_p, verdict, r.bracket, why)


def overall(tests: Sequence[RowTest]) -> str:
    verdicts = {t.verdict for t in tests}
    if not verdicts:
        return UNTESTABLE
    return next((v for v in ORDER if v in verdicts), HOLDS)


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaN stays NaN and does not count)."""
    idx = sorted((i for i, p in enumerate(ps) if not math.isnan(p)), key=lambda i: ps[i])
    out, running = [math.nan] * len(ps), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (len(idx) - rank) * ps[i]))
        out[i] = running
    return out


def apply_holm(tests: Sequence[RowTest]) -> None:
    """Holm-correct the sign-test and t-test p of these row tests (all rows of one report), in place."""
    for attr in ("sign_p", "t_p"):
        for t, p in zip(tests, holm([getattr(t, attr) for t in tests]), strict=True):
            setattr(t, f"holm_{attr}", p)


Results = list[tuple[Claim, list[RowTest], str]]


def _evaluate(df: pd.DataFrame, keys: Sequence[str] | None) -> Results:
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
        tests = [row_test(claim, row) for row in claim.rows(done)]
        out.append((claim, tests, overall(tests)))
    return out


def evaluate(df: pd.DataFrame, keys: Sequence[str] | None = None) -> Results:
    """Each claim (all, or `keys` in order) with its row tests (Holm across all of them) and overall verdict.
    `df`: aggregate.py's job table (status, dataset, arch, width, depth, variant, eraser, seed, bits_per_sample;
    where present fit_on, fold, null, ref_bits, n_coded, probe flags, blocks_at_cap/blocks_known) of one group:
    results of several groups are refused (MixedGroupsError, one line naming the keys that differ)."""
    out = _evaluate(df, keys)
    apply_holm([t for _, tests, _ in out for t in tests])
    return out


def evaluate_groups(df: pd.DataFrame, keys: Sequence[str] | None = None) -> list[tuple[str, Results]]:
    """`evaluate` per comparison group: [(group, its claims)], groups in order of appearance; Holm across the
    rows of every group."""
    if "group" not in df:
        return [("{}", evaluate(df, keys))]
    per = [(g, _evaluate(df[df.group == g], keys)) for g in groups_in(df)]
    apply_holm([t for _, results in per for _, tests, _ in results for t in tests])
    return per


def surviving(per_group: Sequence[tuple[str, Results]]) -> dict[str, bool]:
    """Claim key -> whether it holds in every group (a claim some group cannot test does not survive)."""
    verdicts: defaultdict[str, list[str]] = defaultdict(list)
    for _, results in per_group:
        for claim, _, verdict in results:
            verdicts[claim.key].append(verdict)
    return {key: all(v == HOLDS for v in vs) for key, vs in verdicts.items()}


def _num(x: float, digits: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


HEADER = ["## The paper's claims (paired by seed, bits/sample)", "",
          f"Per row: the raw differences a − b per fit mode, in seed order; the margin = how far the two sides "
          "separate in the claimed direction (a bracket [out of sample, in sample] per side where both fit modes "
          "ran at equal n_coded; > 0 supports the claim), its mean ± 95% CI, one-sided sign test and paired t-test, "
          f"Holm-corrected across every row of this report. holds: separated on every one of ≥ {MIN_SEEDS} "
          f"seeds and no raw difference against the claim; brackets overlap; not identifiable: one fit mode only "
          f"and a side flagged (probe below chance, or null below the label entropy); budget-bound: > "
          f"{BUDGET_SHARE:.0%} of a side's block models stopped at max_epochs with their best epoch in the last "
          "10% of the epochs they ran.", ""]


def _diff_text(t: RowTest) -> str:
    modes = list(t.diffs)
    return "; ".join((f"{m} " if len(modes) > 1 else "") + " ".join(f"{v:+.3f}" for _, v in sorted(d.items()))
                     for m, d in t.diffs.items())


def markdown(results: Results, header: bool = True) -> str:
    lines = [*(HEADER if header else []),
             "| claim | row | raw differences a − b | margin mean ± 95% CI | sign p | t p | Holm p (sign / t) "
             "| verdict | why |",
             "|---|---|---|---|---|---|---|---|---|"]
    untestable = []
    for claim, tests, verdict in results:
        if not tests:
            untestable.append(claim)
            continue
        for t in tests:
            lines.append(f"| {claim.key} | {md_cell(t.row)} | {_diff_text(t)} | {_num(t.mean)} ± {_num(t.ci)} | "
                         f"{_num(t.sign_p)} | {_num(t.t_p)} | {_num(t.holm_sign_p)} / {_num(t.holm_t_p)} | "
                         f"{t.verdict} | {md_cell(t.why)} |")
        lines.append(f"| **{claim.key}** | **overall** | | | | | | **{verdict}** | |")
    lines.append("")
    for claim, _, verdict in results:
        lines.append(f"- {claim.text}: **{verdict}**")
    if untestable:
        lines += ["", "Not testable with these results: " + "; ".join(c.key for c in untestable)]
    return "\n".join(lines) + "\n"


def markdown_groups(per_group: Sequence[tuple[str, Results]]) -> str:
    """The report of `evaluate_groups`: as `markdown` for one group, else a section (and verdicts) per group and
    which claims hold in every group."""
    if len(per_group) == 1:
        return markdown(per_group[0][1])
    parts = ["\n".join(HEADER)]
    labels = group_labels([g for g, _ in per_group])
    for i, (group, results) in enumerate(per_group, 1):
        parts.append(f"### Group {i}: {labels[group]}\n\n{markdown(results, header=False)}")
    survive = surviving(per_group)
    lines = [f"### Across all {len(per_group)} groups", ""]
    lines += [f"- {k}: **{'survives every group' if ok else 'does not survive every group'}**"
              for k, ok in survive.items()]
    parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)
