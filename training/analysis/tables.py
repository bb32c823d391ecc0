"""What the tasks' tables and the aggregate scripts share: the eraser order of the paper's tables, markdown tables,
mean ± sd over seeds, the method (ERM / SD λ=…) a stored config names, the comparison groups (results that differ
in anything but the eraser and the seed are never compared), and the typed rows of the aggregate's frames, each read
once from its pandas row: a summary cell (aggregate_summary.summarize) and a run's probe scores. The columns a frame
may lack (results written before the key existed) are declared with their defaults, once; a present column is taken
as it is (NaN included)."""

from __future__ import annotations

import dataclasses
import json
import math
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import pandas as pd

from erasure.registry import ERASERS
from erasure.traits import eraser_traits
from training.app.result_codec import config_view
from training.engine.regularizers import SdOptions, method_label

MISSING_KEY = "?"  # a config key the result did not record (written before the key existed)

R = TypeVar("R", bound="_Row")


class _Row:
    @classmethod
    def of(cls: type[R], row: pd.Series | Mapping[str, Any], prefix: str = "") -> R:
        """An instance of a row dataclass from a frame row (or a parsed JSON object): column (key) `prefix + field`,
        or the field's default where the row lacks it."""
        fields = dataclasses.fields(cls)  # type: ignore[arg-type]
        return cls(**{f.name: row[prefix + f.name] if prefix + f.name in row else f.default for f in fields})


class Recorded(dict[str, Any]):
    """A flat config (dotted keys) as a result recorded it: a key it did not record reads MISSING_KEY."""

    def __missing__(self, key: str) -> str:
        return MISSING_KEY


@dataclass(frozen=True)
class CellRow(_Row):
    """What the tables read of a summary cell beyond its label and metric columns (aggregate_render)."""

    mixed_data: Any = False
    mixed_commits: Any = False
    mixed_numerics: Any = False
    folds: Any = ""
    null_mismatch: Any = ""
    n_fit_mean: float = math.nan
    n_coded_mean: float = math.nan
    working_rank_mean: float = math.nan
    d_mean: float = math.nan
    variance_dropped_fraction_mean: float = math.nan
    at_cap_share: float = math.nan
    blocks_known: float = 0
    stops: Any = None
    budget_bound: Any = ""  # why the cell's number depends on the budget (analysis/tables.budget_reason)
    fit_rows_per_class_dim_mean: float = math.nan
    rank_irregular_mean: float = math.nan  # the share of runs whose fit is rank-irregular (erasure/rank_test.py)


@dataclass(frozen=True)
class ProbeRow(_Row):
    """One probe's out-of-sample scores in a run's row (prefix `<probe>_probe_`; absent in older certificates)."""

    below_chance: Any = None
    verdict: Any = None
    acc_z: Any = None
    loss_z: Any = None

    @property
    def zs(self) -> tuple[Any, Any]:
        return self.acc_z, self.loss_z


# The paper's column order (Appendix C), then our additions; unknown erasers go last, alphabetically.
ERASER_ORDER = ["control", "leace", "alf_qleace", "gradient", "qleace", "random"]


def eraser_order(names: Iterable[str]) -> list[str]:
    return sorted(set(names), key=lambda e: (ERASER_ORDER.index(e) if e in ERASER_ORDER else len(ERASER_ORDER), e))


def is_identity(eraser: object) -> bool:
    """Whether `eraser` names the identity eraser (the control every other eraser is compared with): its declared
    property (erasure/traits.py), never its name."""
    return isinstance(eraser, str) and eraser in ERASERS and eraser_traits(eraser).identity


def md_cell(value: object) -> str:
    """A value as one markdown table cell: `|` escaped, line breaks folded (an error message may hold both)."""
    return " ".join(str(value).replace("|", r"\|").split("\n"))


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


# --- per-seed statistics and the method a result names --------------------------------------------------
def mean_sd(values: Iterable[float], scale: float = 1.0, digits: int = 1) -> str:
    """mean ± sd (ddof 1) of the finite values, times `scale`, with `digits` decimals; one value alone; "–": none."""
    v = [scale * float(x) for x in values if x is not None and math.isfinite(float(x))]  # NaN/inf: no value
    if not v:
        return "–"
    if len(v) == 1:
        return f"{v[0]:.{digits}f}"
    return f"{np.mean(v):.{digits}f} ± {np.std(v, ddof=1):.{digits}f}"


def grouped(results: list[dict[str, Any]], key: Callable[[dict[str, Any]], tuple[Any, ...]]
            ) -> dict[tuple[Any, ...], list[dict[str, Any]]]:
    """The results by `key(result)`, the keys in the order of their text."""
    out: dict[tuple[Any, ...], list[dict[str, Any]]] = defaultdict(list)
    for r in results:
        out[key(r)].append(r)
    return dict(sorted(out.items(), key=lambda kv: tuple(str(k) for k in kv[0])))


def method_of_stored(config: Mapping[str, Any]) -> str:
    """The method of a result's stored config (so renaming methods needs no re-run)."""
    c = config_view(config)
    sd = None
    if "regularizer.name" in c and c["regularizer.name"] == "sd":
        given = {k.split(".", 1)[1]: v for k, v in c.items()
                 if k.startswith("regularizer.") and k != "regularizer.name"}
        sd = SdOptions(**{"lam": 0.0, "gamma": 0.0, "start_step": 0, "loss_scale": None, **given})
    return method_label(sd, c["gs.weight_decay"] if "gs.weight_decay" in c else 0.0)


# --- comparison groups ------------------------------------------------------------------------------------
# A group is a JSON object {key: value} of the config keys that split results into groups ("{}": one group).
def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def group_label(group: str) -> str:
    """`optim.lr=0.001, regularizer.name=sd` ("" for the single group)."""
    return ", ".join(f"{k}={_show(v)}" for k, v in json.loads(group).items())


def group_labels(groups: Sequence[str]) -> dict[str, str]:
    """Each group's heading: the keys that differ between the groups, with its values; a key it did not record
    (`?`, e.g. `regularizer.lam` of regularizer none) only where the heading needs it to tell groups apart."""
    keys = differing_keys(groups)
    parsed = {g: Recorded(json.loads(g)) for g in groups}
    full = {g: ", ".join(f"{k}={_show(p[k])}" for k in keys) for g, p in parsed.items()}
    short = {g: ", ".join(f"{k}={_show(p[k])}" for k in keys if p[k] != MISSING_KEY) for g, p in parsed.items()}
    distinct = len(set(short.values())) == len(groups) and all(short.values())
    return short if distinct else full


def groups_in(frame: Any) -> list[str]:
    """The distinct groups of a frame with a `group` column, in order of appearance (none: one group)."""
    if "group" not in frame:
        return ["{}"]
    return list(dict.fromkeys(g for g in frame["group"] if isinstance(g, str)))


def differing_keys(groups: Sequence[str]) -> dict[str, list[str]]:
    """Keys whose values differ between the groups, with their shown values."""
    parsed = [Recorded(json.loads(g)) for g in groups]
    out: dict[str, list[str]] = {}
    for k in sorted(set().union(*parsed)):
        if len(values := list(dict.fromkeys(_show(p[k]) for p in parsed))) > 1:
            out[k] = values
    return out


class MixedGroupsError(ValueError):
    """A comparison (claim, plot, table) asked for across results that differ in more than eraser and seed."""


def require_one_group(frame: Any, what: str) -> None:
    """Refuse, with one line naming the keys, `what` over results of more than one comparison group."""
    if len(groups := groups_in(frame)) > 1:
        keys = "; ".join(f"{k} ({' vs '.join(v)})" for k, v in differing_keys(groups).items())
        raise MixedGroupsError(f"refused: {what} would mix results that differ in {keys} besides the eraser and "
                               "seed; compare within one group (scripts/aggregate.py writes one table per group)")


# --- cells: repeats and the permuted-label null ------------------------------------------------------------------
# A cell's results are runs (seed, repeat): with a split fit (`eraser.fit_on=holdout|self|population`) each repeat
# of the repeated holdout is its own MDL run (its own code, never pooled). A cell reports the mean over its runs;
# its noise is the spread over seeds of the per-seed means over repeats (repeats of one seed share the seed's data
# order, so they are not independent seeds).
NOISE_SE = 2.0  # a null's bias is flagged when |bias| > NOISE_SE standard errors of the null's MDL (`bias_noise`)
NULL_FLOOR = 0.01  # bits/sample: ... and above this floor (a null censored at the uniform code has SE 0)
INJECTION, EXCESS = "⚠ injection", "⚠ excess"  # null MDL below / above the label entropy by more than the noise
ARTEFACT_Z = 3.0  # a probe whose accuracy or log-loss is below chance by more than this many SE: dependence artefact
BUDGET_SHARE = 0.2  # results without validation trends: more than this share of block models at the cap
ESTIMABLE_ROWS_PER_CLASS_DIM = 30  # fit rows per class per input dimension from which a fitted eraser's bias against
# the population eraser falls below 0.01 bits/sample (docs/known-answers.md, measured on generator data)
BUDGET_BITS = 0.01  # bits/sample: budget-bound when the at-cap block models' trends would lower the code by more
PROBES = ("linear", "quadratic", "mlp")  # the certificate's out-of-sample probes (erasure/certificate.py)


def seed_means(frame: Any, column: str = "bits_per_sample") -> Any:
    """Per-seed mean over the finite values of a cell's runs (its folds); a seed without one reads NaN."""
    values = pd.to_numeric(frame[column], errors="coerce").astype(float)
    values = values.where(values.map(lambda v: v == v and abs(v) != float("inf")))
    return values.groupby(frame["seed"].to_numpy()).mean()


def fold_text(folds: Iterable[int], total: int | None = None) -> str:
    """`repeats 0–4`, `repeats 0, 2–3 of 5`, `repeat 1` ("" without any)."""
    found = sorted({int(f) for f in folds})
    if not found:
        return ""
    spans: list[list[int]] = []
    for f in found:
        if spans and f == spans[-1][1] + 1:
            spans[-1][1] = f
        else:
            spans.append([f, f])
    text = ", ".join(str(a) if a == b else f"{a}–{b}" for a, b in spans)
    whole = total is not None and found == list(range(total))
    return ("repeat " if len(found) == 1 else "repeats ") + text + ("" if whole or total is None else f" of {total}")


def null_bias(nulls: Any) -> tuple[float, float]:
    """(null MDL, bias) of a cell from its finished null runs (rows with bits_per_sample and ref_bits): the null MDL
    is the mean over its runs (seeds × folds) of bits/sample; bias = null MDL − the mean of the runs' label entropy
    (`ref_bits`: H of the class prior where the result gives it, else log2 K). NaN when there is no null run (or no
    label entropy)."""
    bits = pd.to_numeric(nulls["bits_per_sample"], errors="coerce").astype(float) if len(nulls) else pd.Series([])
    ref = pd.to_numeric(nulls["ref_bits"], errors="coerce").astype(float) if "ref_bits" in nulls and len(nulls) \
        else pd.Series([math.nan] * len(bits))
    ok = bits.map(math.isfinite).to_numpy()
    if not ok.any():
        return math.nan, math.nan
    mean = float(bits[ok].mean())
    refs = ref[ok]
    return mean, (mean - float(refs.mean()) if refs.map(math.isfinite).all() else math.nan)


def bias_noise(null_seed_means: Any) -> tuple[float, str]:
    """(noise, what it is) the bias of a null is compared with: NOISE_SE × the null's own standard error over
    seeds (its per-seed means over repeats), floored at NULL_FLOOR ("2 SE" or "floor"); (NaN, "") with fewer than
    2 null seeds. The true-label MDL's spread is not the null's noise: it would blunt the flag."""
    v = [float(x) for x in null_seed_means if x == x]
    if len(v) < 2:
        return math.nan, ""
    mean = sum(v) / len(v)
    se = NOISE_SE * math.sqrt(sum((x - mean) ** 2 for x in v) / (len(v) - 1)) / math.sqrt(len(v))
    return (se, f"{NOISE_SE:g} SE") if se > NULL_FLOOR else (NULL_FLOOR, "floor")


def bias_flag(bias: float, noise: float) -> str:
    """INJECTION when the null codes below the label entropy by more than the noise (a label-dependent map fitted
    elsewhere added label information to the coded rows), EXCESS when above it (the procedure charges more than
    the labels' entropy for learning nothing), "ok" within it, "?" when the noise is unknown (< 2 null seeds),
    "" without a bias."""
    if bias != bias:
        return ""
    if noise != noise:
        return "?"
    return INJECTION if bias < -noise else EXCESS if bias > noise else "ok"


def null_mismatch(cell: Any, nulls: Any) -> str:
    """What a cell's null lacks or has beyond the cell's runs: seeds, and repeats where the fit has them
    (`frame.seed`, `frame.fold`); "" when they match."""
    parts = []
    for col, name in (("seed", "seeds"), ("fold", "repeats")):
        if col not in cell or col not in nulls:
            continue
        a = {int(v) for v in cell[col] if v == v}
        b = {int(v) for v in nulls[col] if v == v}
        if a != b:
            null_set, cell_set = ("{" + ", ".join(map(str, sorted(s))) + "}" for s in (b, a))
            parts.append(f"{name} {null_set} vs the cell's {cell_set}")
    return "null " + "; ".join(parts) if parts else ""


def probe_below_chance(runs: Any) -> bool:
    """Whether a probe of some run scores below chance by more than ARTEFACT_Z SE (the certificate's own flag or
    verdict, or its z-scores): a dependence artefact of the erased rows."""
    for _, r in runs.iterrows():
        for probe in PROBES:
            scores = ProbeRow.of(r, f"{probe}_probe_")
            if scores.below_chance is True or scores.verdict == "dependence artefact":
                return True
            for z in scores.zs:
                if isinstance(z, int | float) and math.isfinite(z) and z < -ARTEFACT_Z:
                    return True
    return False


def at_cap_share(runs: Any) -> tuple[float, int]:
    """(share of block models at the cap, block models with a known stop reason) over a cell's runs (NaN, 0 when
    no run says: results written before block stop reasons)."""
    if "blocks_known" not in runs:
        return math.nan, 0
    known = float(runs["blocks_known"].fillna(0).sum())
    return (float(runs["blocks_at_cap"].fillna(0).sum()) / known, int(known)) if known else (math.nan, 0)


def budget_reason(runs: Any) -> str:
    """Why a cell's number plausibly depends on the training budget ("" where it does not).

    Evidence (results with validation trends, `mdl.blocks[i].tail_fall_bits`): per run, the block models at the cap
    whose validation loss still fell beyond its noise, weighted by the rows they code: how much further the code
    would fall over as many more validations if they kept their trend (column `budget_bits`); budget-bound when
    its mean over the runs exceeds BUDGET_BITS. Results written before the trends: more than BUDGET_SHARE of the
    block models at the cap (a count, not evidence: the line says so)."""
    if "budget_bits" in runs and runs["budget_bits"].notna().any():
        bits = float(runs["budget_bits"].dropna().mean())
        return f"at-cap models still falling: ≈ {bits:.3f} bits/sample more" if bits > BUDGET_BITS else ""
    share, known = at_cap_share(runs)
    return f"{share:.0%} at cap (no validation trend recorded)" if known and share > BUDGET_SHARE else ""
