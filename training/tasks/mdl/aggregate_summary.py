"""Summarise collected rows for scripts/aggregate.py: mean ± sd per cell over seeds (and folds), the null
control's bias, probe verdicts, the increase over the control and commits mixed within a cell.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

import pandas as pd

from training.analysis.tables import (
    ARTEFACT_Z,
    PROBES,
    ProbeRow,
    at_cap_share,
    bias_flag,
    bias_noise,
    budget_reason,
    fold_text,
    group_label,
    is_identity,
    null_bias,
    null_mismatch,
    seed_means,
)
from training.app.result_types import number
from training.tasks.mdl.aggregate_collect import (
    CELL,
    CERT,
    PROBE_NUMBERS,
    REPORT,
    ROW_KEY,
    SPLIT_MODES,
    UNKNOWN_COMMIT,
    UNKNOWN_DIRTY,
)

METRICS = ["bits_per_sample", "legacy", "final_val_loss"]
FIT_NUMBERS = ["n_fit", "n_coded", "fit_rows_per_class_dim", "rank_irregular", "budget_bits"]
ARTEFACT, INFORMATION, NOTHING = "dependence artefact", "information", "no information detected"


def _mean_sd(values: pd.Series) -> tuple[float, float, int]:
    """Over the finite values only (a NaN/inf never enters a mean)."""
    v = pd.to_numeric(values, errors="coerce").astype(float)
    v = v[v.map(math.isfinite)]
    return (float(v.mean()) if len(v) else math.nan, float(v.std(ddof=1)) if len(v) > 1 else math.nan, len(v))


def _seeds_by(runs: pd.DataFrame, column: str, width: int | None = None) -> str:
    """`<value>: seeds 0 2; <value>: seed 1` over the runs that record `column` (a string, cut to `width`): the
    commits, numerics signatures or data fingerprints (cut to 10) of a cell's runs, in seed order."""
    if column not in runs or runs.empty:
        return ""
    by: dict[str, list[int]] = {}
    for seed, value in sorted(zip(runs.seed, runs[column], strict=True), key=lambda t: (t[0], str(t[1]))):
        if isinstance(value, str):
            by.setdefault(value[:width], []).append(int(seed))
    return "; ".join(f"{d}: seed{'s' if len(s) > 1 else ''} {' '.join(map(str, s))}" for d, s in by.items())


def _commits(done: pd.DataFrame) -> str:
    return _seeds_by(done.assign(commit=done.commit.fillna(UNKNOWN_COMMIT)) if "commit" in done else done, "commit")


def mixed_data(runs: pd.DataFrame) -> bool:
    """Whether a cell's runs (null runs included: the same data, labels permuted) were computed on different data
    (different `dataset.fingerprint`s; runs that record none are not compared)."""
    return "data" in runs and runs.data.dropna().nunique() > 1


def _mean_sd_runs(done: pd.DataFrame, col: str) -> tuple[float, float]:
    """Mean over a cell's finite runs (seeds × folds), sd over seeds of the per-seed means (one fold per seed:
    the plain mean ± sd over seeds)."""
    mean, _, n = _mean_sd(done[col])
    if n == 0:
        return math.nan, math.nan
    per_seed = seed_means(done, col).dropna()
    return mean, float(per_seed.std(ddof=1)) if len(per_seed) > 1 else math.nan


def _run_label(seed: Any, fold: Any, holdout: bool) -> str:
    return f"{seed}r{int(fold)}" if holdout and isinstance(fold, int | float) and fold == fold else str(seed)


def _probe_verdict(runs: pd.DataFrame) -> str:
    """The certificate verdict of a cell over its runs: "dependence artefact" when a probe of some run scores
    below chance by more than ARTEFACT_Z SE (acc or log-loss; the certificate's own flag, or its z-scores),
    "information" when one scores above chance, "no information detected", or "n/a" (no probe scores)."""
    below: Counter[str] = Counter()
    info: Counter[str] = Counter()
    known = 0
    for _, r in runs.iterrows():
        seen = False
        for probe in PROBES:
            scores = ProbeRow.of(r, f"{probe}_probe_")
            flag = bool(scores.below_chance) if pd.api.types.is_bool(scores.below_chance) else None  # absent: NaN
            verdict = scores.verdict if isinstance(scores.verdict, str) else None
            zs = [z for z in map(number, scores.zs) if z is not None and math.isfinite(z)]
            if flag is None and verdict is None and not zs:
                continue
            seen = True
            if flag is True or verdict == ARTEFACT or any(z < -ARTEFACT_Z for z in zs):
                below[probe] += 1
            elif verdict == INFORMATION or (verdict is None and any(z > ARTEFACT_Z for z in zs)):
                info[probe] += 1
        known += seen
    if not known:
        return "n/a"
    for verdict, counts in ((ARTEFACT, below), (INFORMATION, info)):
        if counts:
            runs_text = "" if known == 1 else f"; {max(counts.values())}/{known} runs"
            return f"{verdict} ({', '.join(p for p in PROBES if p in counts)}{runs_text})"
    return NOTHING


def _null_columns(nulls: pd.DataFrame, true_done: pd.DataFrame) -> dict[str, Any]:
    """The cell's null (its finished permuted-label runs): MDL, label entropy, bias = null MDL − label entropy,
    noise (tables.bias_noise: the null's own SE, floored), flag, and what of the cell's seeds and repeats
    the null lacks or adds (`null_mismatch`)."""
    null_mean, bias = null_bias(nulls)
    per_seed = seed_means(nulls).dropna() if len(nulls) else pd.Series(dtype=float)
    noise, source = bias_noise(per_seed)
    kinds = sorted(set(nulls.ref_kind.dropna())) if "ref_kind" in nulls and len(nulls) else []
    return {"null_mean": null_mean, "null_sd": float(per_seed.std(ddof=1)) if len(per_seed) > 1 else math.nan,
            "null_seeds": len(per_seed), "null_runs": int(nulls.bits_per_sample.map(math.isfinite).sum())
            if len(nulls) else 0,
            "null_ref": float(nulls.ref_bits.mean()) if len(nulls) and "ref_bits" in nulls else math.nan,
            "null_ref_kind": " / ".join(k for k in kinds if k), "null_folds": fold_text(nulls.fold)
            if len(nulls) and nulls.fit_on.isin(SPLIT_MODES).any() else "",
            "bias": bias, "bias_noise": noise, "bias_noise_of": source,
            "bias_flag": bias_flag(bias, noise) if len(nulls) else "",
            "null_mismatch": null_mismatch(true_done, nulls) if len(nulls) else ""}


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: mean/sd/n of each metric over finished runs (a non-finite result is a failed seed, not a
    seed; with folds the mean is over seeds × folds and the sd over seeds of the per-seed means); expected runs =
    every seed of the cell's group's true-label runs (the sweep's, with --experiment) × the folds found in the
    cell; which commits the runs come from; the cell's null (`_null_columns`) from its permuted-label runs."""
    out = []
    df = df[df.group.notna()]  # collected (aggregate_collect): every row has null, fit_on and fold
    seeds_of: defaultdict[str, set[Any]] = defaultdict(set)  # the true-label runs' seeds (not the nulls')
    seeds_of.update({g: set(gg.seed) for g, gg in df[~df["null"]].groupby("group", sort=False)})
    for key, cell in df.groupby(CELL, sort=False):
        g, nulls = cell[~cell["null"]], cell[cell["null"] & (cell.status == "done")]
        # results set aside when their data changed (aggregate --set-aside): listed, never counted with the cell's
        aside = g[g.set_aside.notna()] if "set_aside" in g else g.iloc[0:0]
        g = g.drop(aside.index)
        done = g[g.status == "done"]
        rec: dict[str, Any] = dict(zip(CELL, key, strict=True))
        holdout = rec["fit_on"] in SPLIT_MODES
        all_seeds = seeds_of[rec["group"]]
        folds = sorted({int(f) for f in g.fold if isinstance(f, int | float) and f == f}) if holdout else [0]
        totals = {int(t) for t in done.folds_total.dropna()} if "folds_total" in done else set()
        rec["folds"] = fold_text(folds, next(iter(totals)) if len(totals) == 1 else None) if holdout else ""
        rec["protocol"] = ",".join(sorted(set(done.protocol))) if len(done) else ""
        rec["n"], rec["n_expected"] = len(done), len(all_seeds | set(g.seed)) * max(1, len(folds))
        rec["n_seeds"] = len(set(done.seed))
        present = {(s, int(f) if holdout and isinstance(f, int | float) and f == f else 0)
                   for s, f in zip(g.seed, g.fold, strict=True)}
        absent = sorted((s, f) for s in all_seeds | set(g.seed) for f in folds if (s, f) not in present)
        bad = g[g.status != "done"]
        rec["missing_seeds"] = " ".join(
            [f"{_run_label(s, f, holdout)}:{st}" for s, f, st in zip(bad.seed, bad.fold, bad.status, strict=True)]
            + [f"{_run_label(s, f, holdout)}:missing" for s, f in absent])
        rec["commits"] = _commits(done)
        rec["mixed_commits"] = "commit" in done and done.commit.nunique(dropna=False) > 1
        # finished seeds under different numerics signatures (results written before the signature: not compared)
        rec["numerics"] = _seeds_by(done, "numerics")
        rec["mixed_numerics"] = "numerics" in done and done.numerics.dropna().nunique() > 1
        runs = pd.concat([done, nulls])
        rec["data"], rec["mixed_data"] = _seeds_by(runs, "data", 10), mixed_data(runs)
        rec["set_aside"] = _seeds_by(aside, "data", 10)
        for col in METRICS + list(CERT) + REPORT + PROBE_NUMBERS + FIT_NUMBERS:
            averaged = col in done and len(done) and not rec["mixed_data"]  # never a mean over different data
            mean, sd = _mean_sd_runs(done, col) if averaged else (math.nan, math.nan)
            rec[f"{col}_mean"], rec[f"{col}_sd"] = mean, sd
        rec["probe_verdict"] = _probe_verdict(done)
        rec.update(_null_columns(nulls, done))
        # the stop reasons of the cell's block models (counts over its runs), the share at the cap, budget-bound
        share, known = at_cap_share(done)
        reasons = {r: int(done[f"blocks_{r}"].fillna(0).sum()) if f"blocks_{r}" in done else 0
                   for r in ("patience", "max_epochs")}
        rec.update(blocks_known=known, at_cap_share=share, budget_bound=budget_reason(done),
                   stops=", ".join(f"{r} {n}" for r, n in reasons.items() if n) if known else "")
        out.append(rec)
    return pd.DataFrame(out)


def increase_over_control(df: pd.DataFrame, metric: str = "bits_per_sample") -> pd.DataFrame:
    """Per (row, eraser): mean ± sd over seeds of metric(eraser) - metric(control), paired by seed (each side the
    seed's mean over its folds); rows are within one group and one fit_on, so an eraser is only ever paired with a
    control of the same configuration. Null runs are their cells' controls, never a value of the cell."""
    done = df[(df.status == "done") & df.group.notna()]
    done = done[~done["null"]] if "null" in done else done
    out = []
    for key, g in done.groupby(ROW_KEY, sort=False):
        identity = g.eraser.map(is_identity).astype(bool)
        control = seed_means(g[identity], metric)
        if control.empty:
            continue
        for eraser, ge in g[~identity].groupby("eraser", sort=False):
            mean, sd, n = _mean_sd((seed_means(ge, metric) - control).dropna())
            out.append({**dict(zip(ROW_KEY, key, strict=True)), "eraser": eraser, "mean": mean, "sd": sd, "n": n})
    return pd.DataFrame(out, columns=[*ROW_KEY, "eraser", "mean", "sd", "n"])


def commit_problems(df: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(cells whose seeds come from different commits, as `<cell>: <commits>`; finished jobs without a known
    commit) — what --strict refuses."""
    done = df[df.status == "done"]
    if "commit" not in done:
        return [], []
    mixed = []
    for key, g in done.groupby([*CELL, "null"] if "null" in done else CELL, sort=False, dropna=False):
        if g.commit.nunique(dropna=False) > 1:
            null = " (null)" if len(key) > len(CELL) and key[-1] else ""
            mixed.append(f"{cell_name(dict(zip(CELL, key, strict=False)))}{null}: {_commits(g)}")
    return mixed, list(done[done.commit == UNKNOWN_COMMIT].job_dir.astype(str))


def unverified_problems(df: pd.DataFrame) -> list[str]:
    """Finished jobs whose checkout may have had uncommitted changes (`provenance.code.dirty` null: git could not
    tell): their commit does not identify their code, so --strict refuses them."""
    done = df[df.status == "done"]
    if "commit" not in done:
        return []
    return list(done[done.commit.astype(str).str.endswith(UNKNOWN_DIRTY)].job_dir.astype(str))


def data_problems(df: pd.DataFrame) -> list[str]:
    """Cells whose runs were computed on different data (`<cell>: <fingerprints>`): what --strict refuses."""
    done = df[df.status == "done"]
    if "data" not in done or done.empty:
        return []
    return [f"{cell_name(dict(zip(CELL, key, strict=True)))}: {_seeds_by(g, 'data', 10)}"
            for key, g in done.groupby(CELL, sort=False, dropna=False) if mixed_data(g)]


def cell_name(rec: dict[str, Any] | pd.Series) -> str:
    group = group_label(rec["group"]) if isinstance(rec["group"], str) else ""
    variant = f" [{rec['variant']}]" if rec["variant"] else ""
    fit = f" (fit on {rec['fit_on']})" if rec["fit_on"] not in ("all", None) else ""
    where = f" ({group})" if group else ""
    return f"{rec['dataset']} {rec['arch']} w{rec['width']} d{rec['depth']}{variant} {rec['eraser']}{fit}{where}"


