"""The paper's qualitative claims, tested on aggregated MDL results (scripts/aggregate.py --claims).

Every claim compares two sides (two erasers, or two widths of one eraser) per table row (dataset, arch, width,
depth, eraser variants), paired by seed; each seed's value is its mean over repeats.

Measurements. An eraser fitted out of sample (`eraser.fit_on=holdout`, split or pool) reads low, one fitted on the
coded rows (`self`, or `all` where it codes as many rows) reads high: a side fitted both ways at equal n_coded has a
BRACKET per seed, [min, max] of the two. A row is one measurement: a bracket (holdout with self, or with all at
equal n_coded), or one fit mode alone (all, self, holdout, oracle: "single"). The identity eraser (control) has no
fit: its runs at one n_coded stand for either end.

One standard of evidence. Per seed the difference a − b lies in [d_lo, d_hi] (d_lo = min a − max b,
d_hi = max a − min b over the brackets' ends; one fit mode: d_lo = d_hi = a − b). A claim "a − b > 0" is SUPPORTED
when the one-sided paired t-test of d_lo > 0 rejects at ALPHA after Holm's correction across the claim's rows (the
row's margin CI, printed at its Holm level, then excludes zero), CONTRADICTED when the same test of d_hi < 0
rejects, else INCONCLUSIVE, or UNDERPOWERED where the CI's half-width exceeds the claim's effect of interest
(`Claim.effect`, bits/sample). "a − b < 0" mirrors it. A claim of absence (sign 0: "widths beyond ~1K do not lower
MDL") is an equivalence claim with margin δ = `Claim.effect`: supported by TOST (both d_lo > −δ and d_hi < δ,
p = the larger one-sided p), contradicted when the change is beyond −δ (d_hi < −δ). Each row says how many seeds
it needs to be decidable (the CI's half-width at its level below max(|mean margin|, effect), at the observed sd).
Before that: "not enough seeds" below MIN_SEEDS; a supported or contradicted single row with a flagged side (probe
below chance, injecting null: analysis/tables.bias_flag) is "not identifiable"; a side whose block models at the
cap still had falling validation losses, by enough to move the code, is "budget-bound"
(analysis/tables.budget_reason).

Non-specific removal. A fitted LEACE removes K − 1 directions chosen partly by the noise of its fit sample, which
raise the code whatever the concept: at equal class means (population LEACE is the identity) both bracket ends sit
above the control on every seed, a bias the margin's CI cannot see. So a removal claim (a fitted eraser against the
identity: `leace_raises_mdl`) measures the eraser against itself fitted on shuffled labels
(`eraser.fit_labels=shuffled`, applied to the same true-label rows) in each fit mode where that ran; a fitted mode
without it is UNCONTROLLED whatever its margin, and the row names the command that runs the control. Only the
population eraser (exact moments, no fit) is measured against the identity. Shuffled-fit runs are a control, not a
variant: no other claim reads them (`fit_labels_apart`).

Scale. Every number is the eraser as fitted on the rows the row names (n fit, rows per class per input dimension);
the population effect is estimable from about ESTIMABLE_ROWS_PER_CLASS_DIM fit rows per class per dimension. A row
whose fitted linear eraser is rank-irregular in half or more of a side's runs (erasure/rank_test.py: a removed
direction no more label-aligned than under shuffled labels) says so beside its verdict.

A claim's verdict in one group: contradicted if a row is, else the first of not identifiable, uncontrolled,
budget-bound, not enough seeds, underpowered, inconclusive that a row has, else supported (every row supported);
without a row "not testable here". Its p is the largest Holm p of its rows (every row must hold: an
intersection-union test).

Claims compare results of one comparison group only (scripts/aggregate.py: results whose configs differ in
anything but eraser and seed are different groups): `evaluate` refuses a frame of several groups (one line naming
the keys); `evaluate_groups` gives every group its own verdicts (Holm within each claim of each group, never across
groups), and a claim "survives every group" when its largest p over the groups is below ALPHA (intersection-union:
no correction across groups).
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import pandas as pd
from scipy import stats

from training.analysis.tables import (
    ESTIMABLE_ROWS_PER_CLASS_DIM,
    INJECTION,
    bias_flag,
    bias_noise,
    budget_reason,
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
ALPHA = 0.05  # family-wise level of one claim's rows (Holm)
EFFECT = 0.05  # bits/sample: the default effect of interest (absence claims: the equivalence margin δ)
MAX_SEEDS = 10_000  # "seeds needed" beyond this reads "> MAX_SEEDS"
SUPPORTED, CONTRADICTED, INCONCLUSIVE, UNDERPOWERED = "supported", "contradicted", "inconclusive", "underpowered"
FEW, UNTESTABLE, NOT_IDENTIFIABLE, BUDGET = "not enough seeds", "not testable here", "not identifiable", "budget-bound"
UNCONTROLLED = "uncontrolled"
ORDER = (CONTRADICTED, NOT_IDENTIFIABLE, UNCONTROLLED, BUDGET, FEW, UNDERPOWERED, INCONCLUSIVE)  # first a row has
PRESET = "<preset>"  # in a row's command; `evaluate(experiment=...)` names it
IN_SAMPLE = ("self", "all")  # in-sample bracket ends (holdout: the out-of-sample end; oracle, population: single)
FIT_MODES = ("all", "self", "holdout", "oracle", "population")  # population: generator data only
WIDE = 1024  # "widths beyond ~1K"


@dataclass
class Side:
    """One side of a row: per fit mode its runs and its null runs (job-table slices), and its n_coded where known."""

    name: str
    runs: dict[str, pd.DataFrame]
    nulls: dict[str, pd.DataFrame] = field(default_factory=dict)
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
    common = set(FIT_MODES).intersection(*(s.runs for s in fitted))
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
            out.append(Measurement(mode, mode if mode in ("holdout", "oracle", "population") else None,
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


def _numbers(g: pd.DataFrame, column: str) -> pd.Series:
    return pd.to_numeric(g[column], errors="coerce").dropna() if column in g else pd.Series(dtype=float)


def _rank_notes(runs: dict[str, pd.DataFrame]) -> list[str]:
    """A fit mode whose runs are rank-irregular in half or more (erasure/rank_test.py): the eraser as fitted removes
    directions no more label-aligned than under shuffled labels."""
    flags = {mode: _numbers(g, "rank_irregular") for mode, g in runs.items()}
    return [f"rank-irregular fit in {int(f.sum())}/{len(f)} runs ({mode})" for mode, f in flags.items()
            if len(f) and f.mean() >= 0.5]


def _fitted(runs: dict[str, pd.DataFrame]) -> list[str]:
    """Per fitted mode: "as fitted on n rows, r rows/class/d" (where the results say)."""
    out = []
    for mode, g in runs.items():
        n, per = _numbers(g, "n_fit"), _numbers(g, "fit_rows_per_class_dim")
        if len(n) and mode != "population":
            out.append(f"{mode} as fitted on {n.mean():.0f} rows" + (f", {per.mean():.2g} rows/class/d" if len(per)
                                                                      else ""))
    return out


def control_command(eraser: str, variant: str, modes: Sequence[str]) -> str:
    """The one command that runs the non-specific-removal control of `eraser` (its variant) in these fit modes."""
    fitted = [m for m in modes if m != "oracle"]
    if not fitted:
        return "fit_on=oracle has no shuffled-label fit: read it beside fit_on=population"
    items = " ".join(i for i in variant.split(", ") if i)
    return (f"make reproduce EXP={PRESET} ARGS=\"eraser={eraser}{' ' + items if items else ''} "
            f"eraser.fit_on={','.join(fitted)} {SHUFFLED}\"")


@dataclass
class RowInput:
    row: str
    a: dict[str, pd.Series]  # fit mode -> per-seed values
    b: dict[str, pd.Series]
    bracket: bool
    flags: list[str] = field(default_factory=list)
    budget: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)  # said beside the verdict, never changing it (rank-irregular)
    fitted: list[str] = field(default_factory=list)  # "as fitted on n rows" per side and mode
    uncontrolled: str = ""  # a fitted eraser against the identity: the command that runs its control


def _ab(of_a: list[str], of_b: list[str]) -> list[str]:
    return [f"a: {x}" for x in of_a] + [f"b: {x}" for x in of_b]


def _row_inputs(label: str, a: Side, b: Side, skip: set[str] | None = None,
                control: Callable[[list[str]], str] | None = None) -> list[RowInput]:
    """The rows of a against b; `skip`: fit modes measured against another side already (no row uses them);
    `control`: b is the identity, a a fitted eraser: a row using a fitted mode is uncontrolled, with this command."""
    out = []
    ref = a if not a.control else b
    for m in measurements([a, b]):
        if skip and skip & set(m.modes):
            continue
        ra, rb = (_control_runs(s, m, ref) if s.control else {k: s.runs[k] for k in m.modes} for s in (a, b))
        if not ra or not rb:
            continue
        budget = [[f"{why} ({mode})" for mode, g in r.items() if (why := budget_reason(g))] for r in (ra, rb)]
        fit = "" if m.label == "all" else f" (fit on {m.label})"
        modes = [k for k in m.modes if k != "population"]
        out.append(RowInput(label + fit, {k: seed_means(g) for k, g in ra.items()},
                            {k: seed_means(g) for k, g in rb.items()}, m.bracket,
                            _ab(_flags(ra, a.nulls), _flags(rb, b.nulls)), _ab(*budget),
                            _ab(_rank_notes(ra), [] if b.name.endswith(SHUFFLED_SIDE) else _rank_notes(rb)),
                            _ab(*([] if s.control else _fitted(r) for s, r in ((a, ra), (b, rb)))),
                            control(modes) if control is not None and modes else ""))
    return out


Rows = list[RowInput]


@dataclass(frozen=True)
class Claim:
    key: str
    text: str
    sign: int  # +1: the difference (a - b) is claimed > 0; -1: < 0; 0: absence (|a - b| < effect, TOST)
    rows: Callable[[pd.DataFrame], Rows]  # the rows of a job table (true-label and null runs)
    effect: float = EFFECT  # bits/sample: the effect of interest (sign 0: the equivalence margin δ)


def _split(g: pd.DataFrame, shuffled: bool = False) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(true-label runs, null runs) of erasers fitted on the coded labels (`shuffled`: on shuffled labels, the
    non-specific-removal control, which only the claims that name it read)."""
    null, fit = g["null"].astype(bool), g["shuffled"].astype(bool) == shuffled
    return g[~null & fit], g[null & fit]


SHUFFLED = "eraser.fit_labels=shuffled"  # the variant item of an eraser fitted on shuffled labels
SHUFFLED_SIDE = " (shuffled fit)"


def fit_labels_apart(variant: str) -> tuple[str, bool]:
    """(a variant without its eraser.fit_labels item, whether its eraser was fitted on shuffled labels): the
    shuffled fit is a control of its eraser, not a variant of it."""
    items = [i for i in str(variant).split(", ") if i]
    return ", ".join(i for i in items if not i.startswith("eraser.fit_labels=")), SHUFFLED in items


def _by_mode(g: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {str(k): gg for k, gg in g.groupby("fit_on", sort=False)}


def _variant_runs(true: pd.DataFrame, eraser: str, variant: str) -> pd.DataFrame:
    """The runs of one eraser variant across fit modes; a fit mode whose runs have no variant joins every one."""
    g = true[true.eraser == eraser]
    plain = g.groupby("fit_on").variant.transform(lambda v: set(v) == {""})
    return g[(g.variant == variant) | plain]


def _side(name: str, runs: pd.DataFrame, nulls: pd.DataFrame) -> Side:
    return Side(name, _by_mode(runs), _by_mode(nulls), control=is_identity(name))


def _eraser_pairs(a: str, b: str, archs: tuple[str, ...] | None = None) -> Callable[[pd.DataFrame], Rows]:
    """Rows where erasers a and b both have finished seeds (archs: arch tags starting with one of these); each
    variant of one paired with the same variant of the other, or with the other's only (unnamed) one.
    b the identity (a removal claim): in the fit modes where a also ran fitted on shuffled labels
    (eraser.fit_labels=shuffled), a is measured against that (the non-specific-removal control: as many
    directions, chosen without the concept) instead of b; a's other fitted modes against b are uncontrolled (the
    row says the command that runs the control); population (no fit) against b."""
    nonspecific = is_identity(b) and not is_identity(a)
    def rows(df: pd.DataFrame) -> Rows:
        out: Rows = []
        for (dataset, arch, width, depth), g in df.groupby(["dataset", "arch", "width", "depth"], sort=False):
            if archs is not None and not str(arch).startswith(archs):
                continue
            true, null = _split(g)
            shuffled, shuffled_null = _split(g, shuffled=True)
            va = list(dict.fromkeys(true[true.eraser == a].variant))
            vb = list(dict.fromkeys(true[true.eraser == b].variant))
            for x in va:
                name = f"{dataset} {arch} w{width} d{depth}"
                sa, covered = _side(a, _variant_runs(true, a, x), _variant_runs(null, a, x)), set()
                control, c_null = ((f[(f.eraser == a) & (f.variant == x)] for f in (shuffled, shuffled_null))
                                   if nonspecific else (shuffled[:0], shuffled_null[:0]))
                if len(control):
                    found = _row_inputs(name + (f" [{x}]" if x else "") + " vs shuffled fit", sa,
                                        Side(a + SHUFFLED_SIDE, _by_mode(control), _by_mode(c_null)))
                    covered, out = {m for r in found for m in r.a}, out + found
                command = (lambda modes, x=x: control_command(a, x, modes)) if nonspecific else None
                for y in vb:
                    if x != y and x and y:
                        continue
                    label = name + "".join(f" [{v}]" for v in dict.fromkeys((x, y)) if v)
                    out += _row_inputs(label, sa, _side(b, _variant_runs(true, b, y), _variant_runs(null, b, y)),
                                       covered, command)
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
        out += _row_inputs(label, _side(eraser, true[true.width == hi], null[null.width == hi]),
                           _side(eraser, true[true.width == lo], null[null.width == lo]))
    return out


CLAIMS: dict[str, Claim] = {c.key: c for c in (
    Claim("leace_raises_mdl", "LEACE raises MDL for every architecture, beyond non-specific removal (MDL(leace) - "
          "MDL(b) > 0; b: LEACE fitted on shuffled labels, eraser.fit_labels=shuffled, in the same fit mode: a "
          "fitted mode without it is uncontrolled; population LEACE (no fit): the control)", +1,
          _eraser_pairs("leace", "control")),
    Claim("qleace_above_leace", "QLEACE raises MDL more than LEACE for MLPs and LeNets "
          "(MDL(qleace) - MDL(leace) > 0)", +1, _eraser_pairs("qleace", "leace", ("mlp", "lenet"))),
    Claim("alf_below_qleace", "ALF-QLEACE raises MDL less than QLEACE (MDL(alf_qleace) - MDL(qleace) < 0)", -1,
          _eraser_pairs("alf_qleace", "qleace")),
    Claim("alf_below_leace", "ALF-QLEACE raises MDL less than LEACE (MDL(alf_qleace) - MDL(leace) < 0; paper §4)",
          -1, _eraser_pairs("alf_qleace", "leace")),
    Claim("wide_no_lower", f"Widths beyond ~1K do not change MDL (|MDL(widest) - MDL(~1K)| < {EFFECT} bits/sample, "
          "TOST; contradicted by a drop beyond it)", 0, _width_pairs),
)}


@dataclass(kw_only=True)
class RowTest(RowInput):
    """A row's test: its inputs and what `row_test` and `decide` make of them."""

    claim: str
    diffs: dict[str, dict[int, float]]  # fit mode -> seed -> raw difference a - b
    margins: dict[int, float]  # seed -> margin in the claimed direction (> 0 supports the claim on that seed)
    mean: float  # of the margins
    sd: float  # of the margins
    p: float  # one-sided p of the claim on this row (paired t; absence: TOST)
    p_against: float  # one-sided p of the contrary (sign ±1: the other direction; absence: a drop beyond δ)
    holm_p: float = math.nan  # Holm across the claim's rows (what the verdict uses)
    holm_p_against: float = math.nan
    level: float = math.nan  # the one-sided level of this row's Holm step (ALPHA / (rows - rank))
    ci: float = math.nan  # half-width of the two-sided 1 - 2·level t interval of the mean margin
    seeds_needed: int | None = None  # to be decidable at this level and sd (None: more than MAX_SEEDS)
    verdict: str = ""
    why: str = ""  # flags / budget / the control's command behind the verdict; notes (rank-irregular)

    @property
    def n(self) -> int:
        return len(self.margins)


def t_p(values: Sequence[float], shift: float = 0.0) -> float:
    """One-sided p of the t-test that the mean of `values` exceeds `shift` (scipy's ttest_1samp, 'greater'); a
    sample without spread: 0 if its mean is above `shift`, else 1; NaN below 2 values."""
    n = len(values)
    if n < 2:
        return math.nan
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    if sd == 0:
        return 0.0 if mean > shift else 1.0
    return float(stats.t.sf((mean - shift) / (sd / math.sqrt(n)), n - 1))


def _ends(a: dict[str, pd.Series], b: dict[str, pd.Series]) -> tuple[pd.Series, pd.Series]:
    """Per seed (only seeds with every value) the lowest and highest difference a − b the brackets allow."""
    fa, fb = pd.concat(a, axis=1), pd.concat(b, axis=1)
    seeds = fa.dropna().index.intersection(fb.dropna().index)
    fa, fb = fa.loc[seeds], fb.loc[seeds]
    return fa.min(axis=1) - fb.max(axis=1), fa.max(axis=1) - fb.min(axis=1)


def row_test(claim: Claim, r: RowInput) -> RowTest:
    """The row's margins and one-sided p values (before Holm: `evaluate` corrects and decides)."""
    lo, hi = _ends(r.a, r.b)
    d = claim.effect
    if claim.sign > 0:
        margins, p, against = lo, t_p(list(lo)), t_p(list(-hi))
    elif claim.sign < 0:
        margins, p, against = -hi, t_p(list(-hi)), t_p(list(lo))
    else:  # absence: TOST for |a − b| < δ; contradicted by a drop beyond δ
        margins = pd.concat([lo + d, d - hi], axis=1).min(axis=1)
        p = max(t_p(list(lo), -d), t_p(list(-hi), -d))
        against = t_p(list(-hi), d)
    diffs = {mode: {int(s): float(v) for s, v in (r.a[mode] - r.b[mode]).loc[margins.index].items()}
             for mode in r.a}
    m = {int(s): float(v) for s, v in margins.items()}
    n = len(m)
    mean = float(margins.mean()) if n else math.nan
    sd = float(margins.std(ddof=1)) if n > 1 else math.nan
    command = [f"no non-specific-removal control: {r.uncontrolled}"] if r.uncontrolled else []
    return RowTest(**vars(r), claim=claim.key, diffs=diffs, margins=m, mean=mean, sd=sd, p=p, p_against=against,
                   why="; ".join(command + r.flags + r.budget + r.notes))


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjusted p-values (NaN stays NaN and does not count)."""
    idx = sorted((i for i, p in enumerate(ps) if not math.isnan(p)), key=lambda i: ps[i])
    out, running = [math.nan] * len(ps), 0.0
    for rank, i in enumerate(idx):
        running = max(running, min(1.0, (len(idx) - rank) * ps[i]))
        out[i] = running
    return out


def _half_width(sd: float, n: int, level: float) -> float:
    if n < 2 or math.isnan(sd) or math.isnan(level):
        return math.nan
    return float(stats.t.ppf(1 - level, n - 1) * sd / math.sqrt(n))


def seeds_needed(sd: float, target: float, level: float) -> int | None:
    """The fewest seeds (≥ MIN_SEEDS) whose t interval at `level` has a half-width below `target` at this sd;
    None beyond MAX_SEEDS. (The half-width falls with n: bisection.)"""
    if math.isnan(sd) or math.isnan(level) or target <= 0:
        return None
    if not _half_width(sd, MAX_SEEDS, level) < target:
        return None
    lo, hi = 1, MAX_SEEDS  # half-width(lo) ≥ target (n = 1: infinite), half-width(hi) < target
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if _half_width(sd, mid, level) < target else (mid, hi)
    return max(MIN_SEEDS, hi)


def decide(claim: Claim, tests: Sequence[RowTest], alpha: float = ALPHA) -> None:
    """Holm across the claim's rows, each row's CI at its Holm level, seeds needed, and the verdict, in place."""
    for attr, ps in (("holm_p", [t.p for t in tests]), ("holm_p_against", [t.p_against for t in tests])):
        for t, q in zip(tests, holm(ps), strict=True):
            setattr(t, attr, q)
    # Each row's Holm step level alpha / (m − rank) (rank by p; NaN p: NaN): a row whose Holm p is below alpha has
    # its raw p below this level, so its CI at this level excludes zero.
    ranked = sorted((t for t in tests if not math.isnan(t.p)), key=lambda t: t.p)
    for rank, t in enumerate(ranked):
        t.level = alpha / (len(ranked) - rank)
    for t in tests:
        t.ci = _half_width(t.sd, t.n, t.level)
        t.seeds_needed = seeds_needed(t.sd, max(abs(t.mean), claim.effect), t.level)
        if t.n < MIN_SEEDS:
            verdict = FEW
        elif t.holm_p < alpha:
            verdict = SUPPORTED
        elif t.holm_p_against < alpha:
            verdict = CONTRADICTED
        else:
            verdict = UNDERPOWERED if not t.ci <= claim.effect else INCONCLUSIVE
        if verdict in (SUPPORTED, CONTRADICTED) and not t.bracket and t.flags:
            verdict = NOT_IDENTIFIABLE
        elif t.uncontrolled:
            verdict = UNCONTROLLED
        elif verdict != FEW and t.budget:
            verdict = BUDGET
        t.verdict = verdict


def overall(tests: Sequence[RowTest]) -> str:
    verdicts = {t.verdict for t in tests}
    return UNTESTABLE if not verdicts else next((v for v in ORDER if v in verdicts), SUPPORTED)


def claim_p(tests: Sequence[RowTest]) -> float:
    """A claim's p in one group: the largest Holm p of its rows (every row must hold); NaN without rows."""
    ps = [t.holm_p for t in tests]
    return math.nan if not ps or any(math.isnan(p) for p in ps) else max(ps)


Results = list[tuple[Claim, list[RowTest], str]]


def evaluate(df: pd.DataFrame, keys: Sequence[str] | None = None, experiment: str | None = None) -> Results:
    """Each claim (all, or `keys` in order) with its row tests (Holm across the claim's rows) and overall verdict.
    `df`: aggregate.py's job table (status, dataset, arch, width, depth, variant, eraser, seed, bits_per_sample;
    where present fit_on, fold, null, ref_bits, n_coded, probe flags, blocks_at_cap/blocks_known) of one group:
    results of several groups are refused (MixedGroupsError, one line naming the keys that differ)."""
    if unknown := [k for k in keys or () if k not in CLAIMS]:
        raise ValueError(f"unknown claims {unknown}; known: {sorted(CLAIMS)}")
    require_one_group(df, "a claim")
    # Unfinished jobs keep their row (so a row of the sweep without enough results says so), without a value.
    done = df.copy()
    if "status" in done:
        done.loc[done.status != "done", "bits_per_sample"] = math.nan
    for col, default in (("variant", ""), ("fit_on", "all"), ("null", False), ("ref_bits", math.nan)):
        if col not in done:
            done = done.assign(**{col: default})
    apart = [fit_labels_apart(v) for v in done.variant]
    done = done.assign(variant=[v for v, _ in apart], shuffled=[s for _, s in apart])
    out = []
    for key in keys or list(CLAIMS):
        claim = CLAIMS[key]
        tests = [row_test(claim, row) for row in claim.rows(done)]
        for t in tests:
            if experiment:
                t.uncontrolled, t.why = (v.replace(PRESET, experiment) for v in (t.uncontrolled, t.why))
        decide(claim, tests)
        out.append((claim, tests, overall(tests)))
    return out


def evaluate_groups(df: pd.DataFrame, keys: Sequence[str] | None = None, experiment: str | None = None
                    ) -> list[tuple[str, Results]]:
    """`evaluate` per comparison group: [(group, its claims)], groups in order of appearance; Holm within each
    claim of each group (never across groups: surviving every group is an intersection-union test)."""
    if "group" not in df:
        return [("{}", evaluate(df, keys, experiment))]
    return [(g, evaluate(df[df.group == g], keys, experiment)) for g in groups_in(df)]


def group_p(per_group: Sequence[tuple[str, Results]]) -> dict[str, float]:
    """Claim key -> its largest p over the groups (NaN where some group cannot test it)."""
    ps: defaultdict[str, list[float]] = defaultdict(list)
    for _, results in per_group:
        for claim, tests, _ in results:
            ps[claim.key].append(claim_p(tests))
    return {k: math.nan if any(math.isnan(p) for p in v) else max(v) for k, v in ps.items()}


def surviving(per_group: Sequence[tuple[str, Results]], alpha: float = ALPHA) -> dict[str, bool]:
    """Claim key -> whether it is supported in every group: its largest p over the groups below `alpha`, no flag,
    budget or missing seeds in any group."""
    short = {claim.key for _, results in per_group for claim, _, verdict in results if verdict != SUPPORTED}
    return {k: p < alpha and k not in short for k, p in group_p(per_group).items()}


def _num(x: float | None, digits: int = 3) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


HEADER = ["## The paper's claims (paired by seed, bits/sample)", "",
          "Per row: the raw differences a − b per fit mode, in seed order; the margin = how far the two sides "
          "separate in the claimed direction (a bracket [out of sample, in sample] per side where both fit modes "
          "ran at equal n_coded; > 0 supports the claim), its mean ± CI at the row's Holm level (two-sided, "
          "1 − 2·level), the one-sided paired t p of the claim and of its contrary, Holm-corrected across the "
          f"claim's rows. supported: Holm p < {ALPHA}; contradicted: Holm p of the contrary < {ALPHA}; "
          "underpowered: neither, and the CI wider than the claim's effect of interest; inconclusive: neither. An "
          "absence claim is TOST with margin δ = its effect. Seeds needed: for the CI at this level and sd to be "
          f"narrower than max(|mean|, effect). Below {MIN_SEEDS} seeds: not enough seeds; not identifiable: one fit "
          "mode only and a side flagged (probe below chance, or null below the label entropy); uncontrolled: a "
          "fitted eraser measured against the identity, without its non-specific-removal control (the same eraser "
          "fitted on shuffled labels in the same fit mode; the row gives the command that runs it), whatever its "
          "margin; budget-bound: a side's block models at the cap whose validation losses still fell beyond their "
          "noise (analysis/tables.budget_reason). Every eraser is measured as fitted on the rows the row names "
          "(rows/class/d: fit rows per class per input dimension; the population effect is estimable from about "
          f"{ESTIMABLE_ROWS_PER_CLASS_DIM}); rank-irregular: the fitted linear eraser removes a direction no more "
          "label-aligned than under shuffled labels in half or more of a side's runs (said beside the verdict).",
          ""]


def _diff_text(t: RowTest) -> str:
    modes = list(t.diffs)
    return "; ".join((f"{m} " if len(modes) > 1 else "") + " ".join(f"{v:+.3f}" for _, v in sorted(d.items()))
                     for m, d in t.diffs.items())


def _ci_text(t: RowTest) -> str:
    level = "" if math.isnan(t.level) else f" ({1 - 2 * t.level:.1%})"
    return f"{_num(t.mean)} ± {_num(t.ci)}{level}"


def markdown(results: Results, header: bool = True) -> str:
    lines = [*(HEADER if header else []),
             "| claim | row | as fitted | raw differences a − b | margin mean ± CI (level) | p / Holm p | against: p "
             "/ Holm p | seeds needed | verdict | why |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    untestable = []
    for claim, tests, verdict in results:
        if not tests:
            untestable.append(claim)
            continue
        for t in tests:
            need = f"> {MAX_SEEDS}" if t.seeds_needed is None else str(t.seeds_needed)
            lines.append(f"| {claim.key} | {md_cell(t.row)} | {md_cell('; '.join(t.fitted)) or '–'} | "
                         f"{_diff_text(t)} | {_ci_text(t)} | {_num(t.p)} / {_num(t.holm_p)} | {_num(t.p_against)} / "
                         f"{_num(t.holm_p_against)} | {need} | {t.verdict} | {md_cell(t.why)} |")
        lines.append(f"| **{claim.key}** | **overall** (p {_num(claim_p(tests))}) | | | | | | | **{verdict}** | |")
    lines.append("")
    for claim, tests, verdict in results:
        irregular = any(t.notes for t in tests)
        lines.append(f"- {claim.text}: **{verdict}**"
                     + (" (in a rank-irregular cell: the fit removes noise-chosen directions)" if irregular else ""))
    if untestable:
        lines += ["", "Not testable with these results: " + "; ".join(c.key for c in untestable)]
    return "\n".join(lines) + "\n"


def markdown_groups(per_group: Sequence[tuple[str, Results]]) -> str:
    """The report of `evaluate_groups`: as `markdown` for one group, else a section (and verdicts) per group and
    which claims are supported in every group (the largest p over the groups)."""
    if len(per_group) == 1:
        return markdown(per_group[0][1])
    parts = ["\n".join(HEADER)]
    labels = group_labels([g for g, _ in per_group])
    for i, (group, results) in enumerate(per_group, 1):
        parts.append(f"### Group {i}: {labels[group]}\n\n{markdown(results, header=False)}")
    survive, ps = surviving(per_group), group_p(per_group)
    tested = {claim.key for _, results in per_group for claim, tests, _ in results if tests}
    lines = [f"### Across all {len(per_group)} groups (largest p over the groups; no correction across them)", ""]
    lines += [f"- {k}: **not testable in any group** (no row of these results compares its erasers)" if k not in tested
              else f"- {k}: **{'survives every group' if ok else 'does not survive every group'}** (p {_num(ps[k])})"
              for k, ok in survive.items()]
    parts.append("\n".join(lines) + "\n")
    return "\n".join(parts)
