#!/usr/bin/env python
"""Aggregate result.json files into tables (Markdown, CSV, LaTeX) and plots (PNG).

    python scripts/aggregate.py outputs/runs --name all          # everything under a directory
    python scripts/aggregate.py --experiment demo --name demo    # exactly the jobs of a preset
    python scripts/aggregate.py --experiment paper_table_c --override paths.out_dir=/scratch/out
    python scripts/aggregate.py outputs/runs --strict            # refuse cells mixing code versions

Every cell (dataset, arch, width, depth, eraser) reports mean ± sd over its finished seeds. Erasers are compared
only where everything else is equal: results whose semantic configs differ in anything but the eraser and the
seed (a learning rate, a regularizer, a key one result did not record) fall into different groups, each with
tables (and plots, and a claims verdict) of its own, headed by the keys that differ; eraser options are variants
of the eraser, and so is `eraser.fit_on` (a `fit on` column: all | holdout). The folds of a cross-fitted cell
(`eraser.fit_on=holdout`, `eraser.fold=0..`) are one cell: each fold is its own MDL run, the cell reports the mean
over folds × seeds (sd over seeds of the per-seed means) and lists the folds. A permuted-label run
(`dataset.permute_labels=true`) is the null of the cell it otherwise matches: the "Null control" table gives its
MDL and bias = null MDL − label entropy, flagged against seed noise (scripts/tables.py). Jobs that did not finish
are listed as missing, failed (a multirun's job-status ledger says so, or its MDL is not finite), partial
(progress.json: killed or still running), incomplete (result.json without an mdl section) or malformed (a
result.json that cannot be read: also a warning naming it); they are never filled in.
A cell whose seeds come from different commits (result.json provenance; none recorded: "unknown") is marked;
--strict refuses it. With --experiment a result whose config hash differs from the preset's job is
"other-config", not counted. Results of other tasks (`task != mdl`, e.g. Spectral Decoupling) go to
scripts/aggregate_gs.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import re
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import pandas as pd

from scripts.tables import (
    bias_flag,
    bias_noise,
    eraser_order,
    fold_text,
    group_label,
    group_labels,
    groups_in,
    md_table,
    null_bias,
    require_one_group,
    seed_means,
)
from training.app.results import same_config, stored_config
from training.app.schema import load_config

ROOT = Path(__file__).resolve().parents[1]

# A table row (group: the comparison group, a table of its own; fit_on: how the eraser was fitted, all | holdout;
# variant: eraser options that differ, if any). A cell's runs: its seeds × folds, and its null runs (`null`).
ROW_KEY = ["group", "dataset", "arch", "width", "depth", "fit_on", "variant"]
CELL = [*ROW_KEY, "eraser"]
LABEL_NAMES = {"dataset": "dataset", "arch": "arch", "width": "w", "depth": "d", "fit_on": "fit on",
               "variant": "variant"}  # the row label columns of a table (fit on, variant: only when they vary)
# Config keys shown by the row/column labels themselves; every other semantic key that differs within a
# comparison puts results into different groups, eraser options into different variants of the eraser.
SHOWN = {"seed", "dataset.tag", "dataset.name", "arch.tag", "arch.name", "arch.activation", "arch.width",
         "arch.depth", "eraser.name", "eraser.fit_on"}
# Keys that are not identity: the folds of a cell are combined, a permuted-label run is the null of its cell.
FOLD_KEY, NULL_KEY = "eraser.fold", "dataset.permute_labels"
# Keys added with issue 21 whose defaults live in conf/config.yaml, not in the schema: a result written before them
# ran exactly like these values (the eraser fitted on the coded data, no folds, true labels, erased before augment).
FIT_DEFAULTS = {"eraser.fit_on": "all", "eraser.fit_fraction": 0.2, FOLD_KEY: 0, "eraser.after_augment": False,
                NULL_KEY: False}
HOLDOUT_ONLY = ("eraser.fit_fraction", FOLD_KEY)  # no effect on a job with eraser.fit_on=all
# Comparisons: the erasers of a table row, the widths of one eraser (MDL vs width), its depths.
UNITS = [["dataset", "arch", "width", "depth"], ["dataset", "arch", "depth", "eraser", "variant"],
         ["dataset", "arch", "width", "eraser", "variant"]]
PAPER_KEYS = ("optim.lr", "optim.beta1", "optim.warmup_steps")  # conf/optim/schedulefree.yaml: the paper's rule
PAPER_RULE = "paper_optim"  # such a key at the value its rule gives (arch.paper_optim per eraser family)
MISSING_KEY = "?"  # a key the result did not record (written before the key existed)
UNKNOWN_COMMIT = "unknown"
MIXED = "†"  # a cell whose seeds come from different commits
METRICS = ["bits_per_sample", "legacy", "final_val_loss"]
CERT = {"max_mean_gap": "mean gap", "max_cov_gap": "cov gap", "linear_probe_acc": "linear probe",
        "quadratic_probe_acc": "quadratic probe", "chance": "chance"}
# The certificate's out-of-sample (cross-fitted) probe scores (erasure/certificate.py), where the result has them.
PROBES = ("linear", "quadratic")
PROBE_NUMBERS = [f"{p}_probe_{k}" for p in PROBES for k in ("acc_se", "acc_z", "loss_bits", "loss_se", "loss_z")] \
    + ["chance_loss_bits"]
ARTEFACT_Z = 3.0  # a probe whose accuracy or log-loss is below chance by more than this many SE: dependence artefact
ARTEFACT, INFORMATION, NOTHING = "dependence artefact", "information", "no information detected"
# What the eraser's report says it did (result.json "eraser" → "report"): QLEACE's working rank (of d), the
# variance of the dropped directions and the coupling noise's largest share of tr C; gradient erasure's own
# gaps to its targets (relative mean / covariance distance) before and after the optimisation.
REPORT = ["working_rank", "d", "variance_dropped_fraction", "max_noise_share", "max_mean_gap_before",
          "max_cov_gap_before", "max_mean_gap_after", "max_cov_gap_after"]
# Paper Appendix C (CIFAR-10, legacy MDL units, 5 seeds; Quirke & Belrose 2025, App. C): (mean, sd).
PAPER_TABLE_C: dict[str, dict[str, tuple[float, float]]] = {
    "MLP": {"control": (7.14, 0.05), "leace": (8.49, 0.10), "alf_qleace": (8.94, 0.14),
            "gradient": (10.02, 0.08), "qleace": (11.41, 0.00)},
    "LeNet": {"control": (5.62, 0.02), "leace": (6.59, 0.28), "alf_qleace": (6.83, 0.11),
              "gradient": (8.71, 0.09), "qleace": (8.68, 0.24)},
    "ConvNeXtV2": {"control": (5.09, 0.09), "leace": (5.20, 0.15), "alf_qleace": (4.92, 0.05),
                   "gradient": (5.37, 0.02), "qleace": (1.67, 0.20)},
    "Swin V2": {"control": (8.18, 0.03), "leace": (9.00, 0.13), "alf_qleace": (8.67, 1.20),
                "gradient": (9.29, 0.06), "qleace": (9.08, 0.13)},
}
PAPER_ARCHS = {"MLP": ("mlp_relu", 128, 2), "LeNet": ("lenet", 128, 2), "ConvNeXtV2": ("convnext", 40, 2),
               "Swin V2": ("swin", 40, 2)}
PAPER_ERASER_NAMES = {"control": "Control", "leace": "LEACE", "alf_qleace": "ALF-QLEACE",
                      "gradient": "Gradient Quadratic", "qleace": "QLEACE"}
JOB_PATH = re.compile(r"(?P<dataset>[^/]+)/(?P<eraser>[^/]+)/(?P<arch>[^/]+)-w(?P<width>\d+)-d(?P<depth>\d+)"
                      r"(?:/c[0-9a-f]{8})?/seed(?P<seed>\d+)$")  # paths.job_subdir (and the pre-v2 layout)


# --- collecting -------------------------------------------------------------------------------------------
def warn(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def _read(path: Path) -> Any:
    """Parsed JSON, or None when absent or unreadable (warned about, naming the file)."""
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        warn(f"skipped {path}: not readable JSON ({type(e).__name__}: {e})")
        return None


def _load_result(path: Path) -> tuple[dict[str, Any] | None, str | None]:
    """(result, None), or (None, why) for a file that is not a result (None, None: absent)."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return None, None
    except (OSError, json.JSONDecodeError, UnicodeDecodeError) as e:
        return None, f"not readable JSON ({type(e).__name__}: {e})"
    if not isinstance(data, dict):
        return None, f"not a JSON object (a {type(data).__name__})"
    if not isinstance(data.get("config"), dict):
        return None, "no config"
    return data, None


@functools.cache
def _closed_sections() -> dict[str, frozenset[str]]:
    """Config groups that allow no undeclared keys, with their declared keys (training/app/schema.py)."""
    from training.app.schema import JobConfig, OptionsSection, Section

    out = {}
    for f in dataclasses.fields(JobConfig):
        kind = f.metadata.get("kind")
        if isinstance(kind, type) and issubclass(kind, Section) and not issubclass(kind, OptionsSection):
            out[f.name] = frozenset(g.name for g in dataclasses.fields(kind) if not g.name.startswith("_"))
    return out


def _dead(key: str) -> bool:
    """A key of a closed group that the schema no longer declares (e.g. a pre-v2 result's eraser.cache)."""
    group, _, rest = key.partition(".")
    declared = _closed_sections().get(group)
    return declared is not None and rest.split(".")[0] not in declared


def _family(eraser: Any) -> str | None:
    try:
        from erasure.registry import ERASERS

        return str(ERASERS.meta(str(eraser))["family"]) if eraser in ERASERS else None
    except Exception:  # noqa: BLE001 - no registry, no rule: the value is compared as it is
        return None


def _paper_value(flat: dict[str, Any], key: str) -> Any:
    """What conf/optim/schedulefree.yaml resolves `key` to by the paper's rule (None: no rule in this config)."""
    if key == "optim.lr":
        dataset_rule = f"dataset.paper_lr.{flat.get('arch.name')}"
        if dataset_rule in flat:
            return flat[dataset_rule]
        family = _family(flat.get("eraser.name"))
        return flat.get(f"arch.paper_optim.lr.{family}") if family else None
    return flat.get(f"arch.paper_optim.{key.split('.', 1)[1]}")


def config_identity(cfg: dict[str, Any], numerics_version: Any = None) -> dict[str, Any]:
    """The semantic config (flat, dotted keys) as results are compared: what the job hash covers, as the result
    recorded it (no defaults filled in for keys added since: those read "?"; except FIT_DEFAULTS, whose absence
    means exactly those values, and eraser.fit_fraction/fold, which do nothing with eraser.fit_on=all, are
    dropped there), without keys the schema has dropped since; optim.lr/beta1/warmup_steps that follow the
    paper's rule (arch.paper_optim per eraser family, dataset.paper_lr; null in a pre-v2 result) read PAPER_RULE,
    so erasers at their paper rates compare."""
    from training.app.results import flatten
    from training.app.schema import semantic

    flat = {k: v for k, v in flatten(semantic(cfg, fill_defaults=False)).items() if not _dead(k)}
    for key, default in FIT_DEFAULTS.items():
        flat.setdefault(key, default)
    if flat["eraser.fit_on"] == "all":
        for key in HOLDOUT_ONLY:
            flat.pop(key, None)
    for key in PAPER_KEYS:
        if key in flat and (flat[key] is None or flat[key] == _paper_value(flat, key)):
            flat[key] = PAPER_RULE
    if numerics_version is not None and "numerics_version" not in flat:
        flat["numerics_version"] = numerics_version
    return flat


def _identity_columns(cfg: dict[str, Any], numerics_version: Any = None) -> dict[str, str]:
    """`settings`: what must be equal for two results to be compared (all but labels, eraser and seed);
    `eraser_settings`: the eraser's options (its variants). Neither holds the fold (folds are combined) nor
    dataset.permute_labels (a null run belongs to the cell of its true-label runs)."""
    flat = {k: v for k, v in config_identity(cfg, numerics_version).items() if k not in (FOLD_KEY, NULL_KEY)}
    settings = {k: v for k, v in flat.items() if k not in SHOWN and not k.startswith("eraser.")}
    eraser = {k: v for k, v in flat.items() if k.startswith("eraser.") and k not in SHOWN}
    return {"settings": json.dumps(settings, sort_keys=True, default=str),
            "eraser_settings": json.dumps(eraser, sort_keys=True, default=str)}


def stored_view(cfg: dict[str, Any]) -> dict[str, Any]:
    """`stored_config` with FIT_DEFAULTS for the keys a result written before them lacks."""
    view = stored_config(cfg)
    for key, default in FIT_DEFAULTS.items():
        view.setdefault(key, default)
    return view


def _cell_from_config(cfg: dict[str, Any], numerics_version: Any = None) -> dict[str, Any]:
    c = stored_view(cfg)
    fit_on = str(c["eraser.fit_on"])
    return {"dataset": c["dataset.tag"], "arch": c["arch.tag"], "width": int(c["arch.width"]),
            "depth": int(c["arch.depth"]), "eraser": str(c["eraser.name"]), "seed": int(c["seed"]),
            "fit_on": fit_on, "fold": int(c[FOLD_KEY]) if fit_on == "holdout" else 0,
            "null": bool(c[NULL_KEY]), "protocol": c["mdl.protocol"], **_identity_columns(cfg, numerics_version)}


def _cell_from_path(job_dir: Path) -> dict[str, Any] | None:
    m = JOB_PATH.search(job_dir.as_posix())
    if m is None:
        return None
    d = m.groupdict()
    return {"dataset": d["dataset"], "arch": d["arch"], "width": int(d["width"]), "depth": int(d["depth"]),
            "eraser": d["eraser"], "seed": int(d["seed"]), "fit_on": None, "fold": None, "null": None,
            "protocol": "?", "settings": None, "eraser_settings": None}


def _key_values(flats: list[dict[str, Any]]) -> set[str]:
    """Keys whose values differ between these flat configs (a key one of them lacks reads MISSING_KEY)."""
    keys = set().union(*flats)
    return {k for k in keys
            if len({json.dumps(f.get(k, MISSING_KEY), sort_keys=True, default=str) for f in flats}) > 1}


def assign_groups(df: pd.DataFrame) -> pd.DataFrame:
    """Label each row with its comparison `group` and its eraser `variant`; drop repeated (cell, seed) entries.

    variant: the eraser options that differ between results of one eraser (and fit_on) on one dataset and
    architecture (part of the eraser's identity). group: the values of every other semantic key that differs
    within a comparison (the erasers of a table row; the widths, or depths, of one eraser): results of different
    groups are never compared, averaged or plotted together. Folds and null runs (`fold`, `null`) stay in their
    cell. Rows without a config (a job known only by its directory) join the group of the finished seeds in their
    c<hash> directory, or of their cell, when that is unambiguous."""
    if df.empty:
        return df
    df = df.copy()
    df["variant"], df["group"] = "", None
    known = df[df.settings.notna()]
    for _, g in known.groupby(["dataset", "arch", "eraser", "fit_on"], sort=False):  # fit_on: a column of its own
        flats = [json.loads(s) for s in set(g.eraser_settings)]
        varying = sorted(_key_values(flats)) if len(flats) > 1 else []
        for i in g.index if varying else ():
            flat = json.loads(df.at[i, "eraser_settings"])
            df.at[i, "variant"] = ", ".join(f"{k}={flat.get(k, MISSING_KEY)}" for k in varying)
    known = df[df.settings.notna()]
    split: set[str] = set()
    for unit in UNITS:
        for _, g in known.groupby(unit, sort=False):
            flats = [json.loads(s) for s in set(g.settings)]
            if len(flats) > 1:
                split |= _key_values(flats)
    for i in known.index:
        flat = json.loads(df.at[i, "settings"])
        df.at[i, "group"] = json.dumps({k: flat.get(k, MISSING_KEY) for k in sorted(split)}, default=str)
    _place_unknown(df)
    df["null"] = df["null"].map(lambda v: pd.api.types.is_bool(v) and bool(v))
    order = df.assign(_rank=(df.status != "done").astype(int)).sort_values("_rank", kind="stable")
    dup = order.duplicated([*CELL, "null", "fold", "seed"], keep="first") & order.group.notna()
    if dup.any():
        warn(f"{int(dup.sum())} repeated result(s) of the same config and seed ignored: "
             + ", ".join(order[dup].job_dir.astype(str)))
    return df.drop(index=order[dup].index).drop(columns=["settings", "eraser_settings"])


PLACED = ("group", "variant", "fit_on", "fold", "null")  # what a row known only by its directory takes over


def _place_unknown(df: pd.DataFrame) -> None:
    """Group, variant, fit_on, fold and null of rows known only by their directory (in place): those of the
    finished seeds in their c<hash> directory, or of their cell when unambiguous (else the group stays unknown)."""
    known = df[df.group.notna()]
    by_dir: dict[str, set[tuple[Any, ...]]] = {}
    by_cell: dict[tuple[Any, ...], set[tuple[Any, ...]]] = {}
    for r in known.itertuples():
        placed = tuple(getattr(r, k) for k in PLACED)
        by_dir.setdefault(_cell_dir(r.job_dir), set()).add(placed)
        by_cell.setdefault((r.dataset, r.arch, r.width, r.depth, r.eraser), set()).add(placed)
    groups = set(known.group)
    for i in df.index[df.group.isna()]:
        r = df.loc[i]
        found = by_dir.get(_cell_dir(r.job_dir)) or by_cell.get((r.dataset, r.arch, r.width, r.depth, r.eraser))
        if found is not None and len(found) == 1:
            for key, value in zip(PLACED, next(iter(found)), strict=True):
                df.at[i, key] = value
        elif found is None and len(groups) <= 1:
            df.at[i, "group"] = next(iter(groups), "{}")
            df.at[i, "fit_on"], df.at[i, "fold"], df.at[i, "null"] = "all", 0, False


def _cell_dir(job_dir: str) -> str:
    """The c<hash> directory holding a job's seed directories ("" in the pre-v2 layout)."""
    parent = Path(job_dir).parent
    return str(parent) if re.fullmatch(r"c[0-9a-f]{8}", parent.name) else ""


def commit_of(result: dict[str, Any]) -> str:
    """The code version a result was computed with: its commit (10 hex digits, `+dirty` with uncommitted
    changes), or UNKNOWN_COMMIT (written without provenance, or outside a git checkout)."""
    prov = result.get("provenance")
    code = prov.get("code") if isinstance(prov, dict) else None
    commit = code.get("commit") if isinstance(code, dict) else None
    if not isinstance(commit, str) or not commit:
        return UNKNOWN_COMMIT
    return commit[:10] + ("+dirty" if code.get("dirty") is True else "")


def _number(value: Any) -> float | None:
    return float(value) if isinstance(value, int | float) and not isinstance(value, bool) else None


def _label_entropy(result: dict[str, Any], mdl: dict[str, Any]) -> tuple[float, str]:
    """(bits, source) the null's MDL is compared with: the entropy of the class prior where the result gives it
    (result["dataset"]["class_counts"], or the certificate's `chance_loss_bits`: the prior-only code of the coded
    labels), else log2 K (K: mdl.num_classes, or result["dataset"]["num_classes"]); (NaN, "") without either."""
    info = result.get("dataset")
    info = info if isinstance(info, dict) else {}
    counts = info.get("class_counts")
    if isinstance(counts, list) and counts and all(_number(c) is not None and c >= 0 for c in counts) \
            and sum(counts) > 0:
        total = float(sum(counts))
        return -sum(c / total * math.log2(c / total) for c in counts if c > 0), "H(prior)"
    cert = result.get("certificate")
    for side in ("after", "before"):
        scores = cert.get(side) if isinstance(cert, dict) else None
        value = _number(scores.get("chance_loss_bits")) if isinstance(scores, dict) else None
        if value is not None and math.isfinite(value):
            return value, "H(prior)"
    k = _number(mdl.get("num_classes"))
    k = k if k is not None else _number(info.get("num_classes"))
    return (math.log2(k), "log2 K") if k is not None and k >= 1 else (math.nan, "")


def _probe_columns(after: dict[str, Any]) -> dict[str, Any]:
    """The certificate's out-of-sample probe scores (NaN / None where absent: an older certificate)."""
    row: dict[str, Any] = {}
    for key in PROBE_NUMBERS:
        value = _number(after.get(key))
        row[key] = math.nan if value is None else value
    for probe in PROBES:
        flag, verdict = after.get(f"{probe}_probe_below_chance"), after.get(f"{probe}_probe_verdict")
        row[f"{probe}_probe_below_chance"] = flag if isinstance(flag, bool) else None
        row[f"{probe}_probe_verdict"] = verdict if isinstance(verdict, str) else None
    return row


def _result_row(result: dict[str, Any], job_dir: str) -> dict[str, Any]:
    """The row of an MDL result: done; failed when its MDL is not finite; incomplete without an mdl section.
    Raises (KeyError, TypeError, ValueError) on a malformed config or mdl section."""
    numerics = result.get("numerics_version")
    row = {**_cell_from_config(result["config"], numerics), "job_dir": job_dir, "status": "done",
           "commit": commit_of(result)}
    mdl, final = result.get("mdl"), result.get("final") or {}
    if not isinstance(mdl, dict):
        return {**row, "status": "incomplete", "error": "result.json has no mdl section"}
    bits, legacy = _number(mdl.get("bits_per_sample")), _number(mdl.get("legacy", math.nan))
    if bits is None or legacy is None:
        raise ValueError(f"mdl.bits_per_sample / mdl.legacy not numbers: {mdl.get('bits_per_sample')!r}, "
                         f"{mdl.get('legacy')!r}")
    if not (math.isfinite(bits) and (math.isfinite(legacy) or "legacy" not in mdl)):
        return {**row, "status": "failed", "error": f"non-finite MDL (bits_per_sample={bits}, legacy={legacy}): "
                                                      "not counted as a seed"}
    row.update(protocol=mdl.get("protocol", row["protocol"]), bits_per_sample=bits, legacy=legacy)
    if not isinstance(final, dict):
        raise TypeError(f"final is a {type(final).__name__}")
    row["final_val_loss"] = _number(final.get("val_loss_bits", math.nan))
    if row["final_val_loss"] is None:
        row["final_val_loss"] = math.nan
    after = (result.get("certificate") or {}).get("after") or {}
    for key in CERT:
        value = _number(after.get(key))
        row[key] = math.nan if value is None else value
    row.update(_probe_columns(after))
    row["ref_bits"], row["ref_kind"] = _label_entropy(result, mdl)
    info = result.get("dataset")
    if isinstance(info, dict) and info.get("permuted_labels") is True:
        row["null"] = True  # a null run, whatever its config says
    fit = (result.get("eraser") or {}).get("fit")
    folds = _number(fit.get("folds")) if isinstance(fit, dict) else None
    row["folds_total"] = math.nan if folds is None else int(folds)
    report = (result.get("eraser") or {}).get("report") or {}
    for key in REPORT:
        value = _number(report.get(key))
        row[key] = math.nan if value is None else value
    row["curve"] = final.get("val_loss_curve") or []
    return row


def failed_jobs(ledger_roots: Iterable[Path]) -> dict[str, str]:
    """job_dir -> error, from multirun ledgers (training/cli/ledger.py); the latest entry per job wins."""
    latest: dict[str, dict[str, Any]] = {}
    for root in ledger_roots:
        for path in sorted(root.glob(".multirun/*/job-*.json")):  # run ids sort by time
            entry = _read(path)
            if isinstance(entry, dict) and isinstance(entry.get("job_dir"), str):
                latest[str(Path(entry["job_dir"]))] = entry
    return {d: str(e.get("error", "")) for d, e in latest.items() if e.get("status") == "failed"}


def _unfinished_row(cell: dict[str, Any], job_dir: Path, failed: dict[str, str]) -> dict[str, Any]:
    row = {**cell, "job_dir": str(job_dir), "status": "missing"}
    progress = _read(job_dir / "progress.json")
    if str(job_dir) in failed:
        row.update(status="failed", error=failed[str(job_dir)])
    elif progress is not None:
        blocks = progress.get("blocks") if isinstance(progress, dict) else None
        row.update(status="partial", error=f"{len(blocks) if isinstance(blocks, list) else 0} block models finished")
    return row


def _is_mdl_task(result: dict[str, Any]) -> bool:
    return not isinstance(result.get("config"), dict) or stored_config(result["config"])["task"] == "mdl"


def collect_dir(root: Path) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Rows of every MDL result.json under root plus failed/partial jobs found there; and all parsed results.
    A file that is not a result is a warning naming it (and a `malformed` row when its path names a job); an
    MDL result without an mdl section is `incomplete`; one whose MDL is not finite is `failed`."""
    rows, results, seen = [], [], set()
    for path in sorted(root.rglob("result.json")):
        result, why = _load_result(path)
        if result is not None:
            results.append(result)
            if not _is_mdl_task(result):
                seen.add(str(path.parent))
                continue
            try:
                rows.append(_result_row(result, str(path.parent)))
                seen.add(str(path.parent))
                continue
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                why = f"malformed ({type(e).__name__}: {e})"
        if why is None:
            continue
        warn(f"skipped {path}: {why}")
        cell = _cell_from_path(path.parent)
        if cell is not None:
            rows.append({**cell, "job_dir": str(path.parent), "status": "malformed", "error": why})
            seen.add(str(path.parent))
    failed = failed_jobs([root, root / "runs"])
    unfinished = {str(p.parent) for p in root.rglob("progress.json")} | set(failed)
    for job_dir in sorted(unfinished - seen):
        cell = _cell_from_path(Path(job_dir))
        if cell is not None:
            rows.append(_unfinished_row(cell, Path(job_dir), failed))
    df = assign_groups(pd.DataFrame(rows))
    if len(df):  # groups in the order of their values (numbers as numbers); rows keep their order within one
        df = df.iloc[sorted(range(len(df)), key=lambda i: _group_order(df.group.iloc[i]))]
    return df, results


def _group_order(group: Any) -> tuple[Any, ...]:
    if not isinstance(group, str):
        return (1,)
    values = json.loads(group).values()
    return (0, *((0, v, "") if isinstance(v, int | float) and not isinstance(v, bool) else (1, 0, json.dumps(v))
                 for v in values))


def collect_experiment(name: str, extra: list[str]) -> tuple[pd.DataFrame, list[dict[str, Any]]]:
    """Exactly the jobs of a preset, in launch order; jobs without a matching result are listed as such. Groups
    come from the preset's configs (a result counts only when its config hashes to its job's)."""
    from training.app.schema import config_hash
    from training.app.sweeps import expand

    cfgs = expand(name, extra)
    out_dirs = {Path(c["paths"]["out_dir"]) for c in cfgs}
    failed = failed_jobs([d / "runs" for d in out_dirs])
    rows, results = [], []
    for cfg in cfgs:
        job_dir = Path(cfg["paths"]["job_dir"])
        path = job_dir / "result.json"
        result, why = _load_result(path)
        if why is not None:
            warn(f"skipped {path}: {why}")
        h = config_hash(cfg)  # same_config also rehashes the stored config (the hash may have changed since)
        same = result is not None and same_config(result, h)
        if same:
            results.append(result)
        if stored_config(cfg)["task"] != "mdl":
            continue
        cell = _cell_from_config(cfg)
        if same:
            assert result is not None
            try:
                row = _result_row(result, str(job_dir))
                rows.append({**row, **{k: cell[k] for k in ("settings", "eraser_settings")}})
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                warn(f"skipped {path}: malformed ({type(e).__name__}: {e})")
                rows.append({**cell, "job_dir": str(job_dir), "status": "malformed", "error": str(e)})
        elif result is not None:
            rows.append({**cell, "job_dir": str(job_dir), "status": "other-config",
                         "error": f"result.json holds config {result.get('config_hash')}"})
        elif why is not None:
            rows.append({**cell, "job_dir": str(job_dir), "status": "malformed", "error": why})
        else:
            rows.append(_unfinished_row(cell, job_dir, failed))
    return assign_groups(pd.DataFrame(rows)), results


# --- summarising ------------------------------------------------------------------------------------------
def _ordered(values: Iterable[str]) -> list[str]:
    return eraser_order(values)


def _mean_sd(values: pd.Series) -> tuple[float, float, int]:
    """Over the finite values only (a NaN/inf never enters a mean)."""
    v = pd.to_numeric(values, errors="coerce").astype(float)
    v = v[v.map(math.isfinite)]
    return (float(v.mean()) if len(v) else math.nan, float(v.std(ddof=1)) if len(v) > 1 else math.nan, len(v))


def _commits(done: pd.DataFrame) -> str:
    """`<commit>: seeds 0 2; <commit>: seed 1` (in seed order of first appearance)."""
    if "commit" not in done or done.empty:
        return ""
    by: dict[str, list[int]] = {}
    for seed, commit in sorted(zip(done.seed, done.commit.fillna(UNKNOWN_COMMIT), strict=True)):
        by.setdefault(str(commit), []).append(int(seed))
    return "; ".join(f"{c}: seed{'s' if len(s) > 1 else ''} {' '.join(map(str, s))}" for c, s in by.items())


def _mean_sd_runs(done: pd.DataFrame, col: str) -> tuple[float, float]:
    """Mean over a cell's finite runs (seeds × folds), sd over seeds of the per-seed means (one fold per seed:
    the plain mean ± sd over seeds)."""
    mean, _, n = _mean_sd(done[col])
    if n == 0:
        return math.nan, math.nan
    per_seed = seed_means(done, col).dropna()
    return mean, float(per_seed.std(ddof=1)) if len(per_seed) > 1 else math.nan


def _run_label(seed: Any, fold: Any, holdout: bool) -> str:
    return f"{seed}f{int(fold)}" if holdout and isinstance(fold, int | float) and fold == fold else str(seed)


def _probe_verdict(runs: pd.DataFrame) -> str:
    """The certificate verdict of a cell over its runs: "dependence artefact" when a probe of some run scores
    below chance by more than ARTEFACT_Z SE (acc or log-loss; the certificate's own flag, or its z-scores),
    "information" when one scores above chance, "no information detected", or "n/a" (no probe scores)."""
    below: dict[str, int] = {}
    info: dict[str, int] = {}
    known = 0
    for _, r in runs.iterrows():
        seen = False
        for probe in PROBES:
            flag, verdict = r.get(f"{probe}_probe_below_chance"), r.get(f"{probe}_probe_verdict")
            flag = bool(flag) if pd.api.types.is_bool(flag) else None  # absent: None or NaN in a frame
            verdict = verdict if isinstance(verdict, str) else None
            zs = [_number(r.get(f"{probe}_probe_{k}_z")) for k in ("acc", "loss")]
            zs = [z for z in zs if z is not None and math.isfinite(z)]
            if flag is None and verdict is None and not zs:
                continue
            seen = True
            if flag is True or verdict == ARTEFACT or any(z < -ARTEFACT_Z for z in zs):
                below[probe] = below.get(probe, 0) + 1
            elif verdict == INFORMATION or (verdict is None and any(z > ARTEFACT_Z for z in zs)):
                info[probe] = info.get(probe, 0) + 1
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
    noise (scripts/tables.bias_noise) and flag."""
    null_mean, bias = null_bias(nulls)
    per_seed = seed_means(nulls).dropna() if len(nulls) else pd.Series(dtype=float)
    noise, source = bias_noise(per_seed, seed_means(true_done).dropna() if len(true_done) else [])
    kinds = sorted(set(nulls.ref_kind.dropna())) if "ref_kind" in nulls and len(nulls) else []
    return {"null_mean": null_mean, "null_sd": float(per_seed.std(ddof=1)) if len(per_seed) > 1 else math.nan,
            "null_seeds": len(per_seed), "null_runs": int(nulls.bits_per_sample.map(math.isfinite).sum())
            if len(nulls) else 0,
            "null_ref": float(nulls.ref_bits.mean()) if len(nulls) and "ref_bits" in nulls else math.nan,
            "null_ref_kind": " / ".join(k for k in kinds if k), "null_folds": fold_text(nulls.fold)
            if len(nulls) and (nulls.fit_on == "holdout").any() else "",
            "bias": bias, "bias_noise": noise, "bias_noise_of": source,
            "bias_flag": bias_flag(bias, noise) if len(nulls) else ""}


def summarize(df: pd.DataFrame) -> pd.DataFrame:
    """One row per cell: mean/sd/n of each metric over finished runs (a non-finite result is a failed seed, not a
    seed; with folds the mean is over seeds × folds and the sd over seeds of the per-seed means); expected runs =
    every seed of the cell's group's true-label runs (the sweep's, with --experiment) × the folds found in the
    cell; which commits the runs come from; the cell's null (`_null_columns`) from its permuted-label runs."""
    out = []
    df = df[df.group.notna()]
    if "null" not in df:
        df = df.assign(null=False)
    for col, default in (("fit_on", "all"), ("fold", 0)):
        if col not in df:
            df = df.assign(**{col: default})
    seeds_of = {g: set(gg.seed) for g, gg in df[~df["null"]].groupby("group", sort=False)}  # not the nulls' seeds
    for key, cell in df.groupby(CELL, sort=False):
        g, nulls = cell[~cell["null"]], cell[cell["null"] & (cell.status == "done")]
        done = g[g.status == "done"]
        rec: dict[str, Any] = dict(zip(CELL, key, strict=True))
        holdout = rec["fit_on"] == "holdout"
        all_seeds = seeds_of.get(rec["group"], set())
        folds = sorted({int(f) for f in g.fold if isinstance(f, int | float) and f == f}) if holdout else [0]
        totals = {int(t) for t in done.get("folds_total", pd.Series(dtype=float)).dropna()}
        rec["folds"] = fold_text(folds, next(iter(totals)) if len(totals) == 1 else None) if holdout else ""
        rec["protocol"] = ",".join(sorted(set(done.protocol))) if len(done) else ""
        rec["n"], rec["n_expected"] = len(done), len(all_seeds | set(g.seed)) * max(1, len(folds))
        rec["n_seeds"] = len(set(done.seed))
        present = {(s, int(f) if holdout and isinstance(f, int | float) and f == f else 0)
                   for s, f in zip(g.seed, g.fold, strict=True)}
        absent = sorted((s, f) for s in all_seeds | set(g.seed) for f in folds if (s, f) not in present)
        rec["missing_seeds"] = " ".join(
            [f"{_run_label(s, f, holdout)}:{st}" for s, f, st in zip(g[g.status != "done"].seed,
                                                                   g[g.status != "done"].fold,
                                                                   g[g.status != "done"].status, strict=True)]
            + [f"{_run_label(s, f, holdout)}:missing" for s, f in absent])
        rec["commits"] = _commits(done)
        rec["mixed_commits"] = "commit" in done and done.commit.nunique(dropna=False) > 1
        for col in METRICS + list(CERT) + REPORT + PROBE_NUMBERS:
            mean, sd = _mean_sd_runs(done, col) if col in done and len(done) else (math.nan, math.nan)
            rec[f"{col}_mean"], rec[f"{col}_sd"] = mean, sd
        rec["probe_verdict"] = _probe_verdict(done)
        rec.update(_null_columns(nulls, done))
        out.append(rec)
    return pd.DataFrame(out)


def _true_runs(df: pd.DataFrame) -> pd.DataFrame:
    """Finished true-label runs of known groups (null runs are their cells' controls, never a value of the cell)."""
    done = df[(df.status == "done") & df.group.notna()]
    return done[~done["null"]] if "null" in done else done


def increase_over_control(df: pd.DataFrame, metric: str = "bits_per_sample") -> pd.DataFrame:
    """Per (row, eraser): mean ± sd over seeds of metric(eraser) - metric(control), paired by seed (each side the
    seed's mean over its folds); rows are within one group and one fit_on, so an eraser is only ever paired with a
    control of the same configuration."""
    done = _true_runs(df)
    out = []
    for key, g in done.groupby(ROW_KEY, sort=False):
        control = seed_means(g[g.eraser == "control"], metric)
        if control.empty:
            continue
        for eraser, ge in g[g.eraser != "control"].groupby("eraser", sort=False):
            diff = (seed_means(ge, metric) - control).dropna()
            mean, sd, n = _mean_sd(diff)
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
            mixed.append(f"{_cell_name(dict(zip(CELL, key, strict=False)))}{null}: {_commits(g)}")
    unknown = list(done[done.commit == UNKNOWN_COMMIT].job_dir.astype(str))
    return mixed, unknown


def _cell_name(rec: dict[str, Any] | pd.Series) -> str:
    group = group_label(rec["group"]) if isinstance(rec["group"], str) else ""
    variant = f" [{rec['variant']}]" if rec["variant"] else ""
    fit = f" (fit on {rec['fit_on']})" if rec.get("fit_on", "all") not in ("all", None) else ""
    where = f" ({group})" if group else ""
    return f"{rec['dataset']} {rec['arch']} w{rec['width']} d{rec['depth']}{variant} {rec['eraser']}{fit}{where}"


# --- formatting -------------------------------------------------------------------------------------------
def fmt(mean: float, sd: float, digits: int = 3) -> str:
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.{digits}f} ± {sd:.{digits}f}" if not math.isnan(sd) else f"{mean:.{digits}f}"


def _cell_text(rec: pd.Series | None, metric: str, digits: int = 3) -> str:
    if rec is None:
        return "missing"
    if rec["n"] == 0:
        states = {s.split(":", 1)[1] for s in str(rec["missing_seeds"]).split()}
        return "failed" if "failed" in states else "incomplete" if states & {"incomplete", "malformed"} \
            else "missing"
    text = fmt(rec[f"{metric}_mean"], rec[f"{metric}_sd"], digits)
    text += f" ({rec['n']}/{rec['n_expected']})" if rec["n"] < rec["n_expected"] else ""
    text += f" [{rec['folds']}]" if rec.get("folds") else ""
    return text + (f" {MIXED}" if rec.get("mixed_commits") else "")


def _row_keys(summary: pd.DataFrame) -> list[tuple[Any, ...]]:
    """Table rows in order of appearance, a row fitted on all before its holdout twin."""
    keys = list(dict.fromkeys(tuple(r) for r in summary[ROW_KEY].itertuples(index=False)))
    at = ROW_KEY.index("fit_on")
    first = {k[:at]: i for i, k in reversed(list(enumerate(keys)))}
    return sorted(keys, key=lambda k: (first[k[:at]], k[at] != "all"))


def _label_columns(summary: pd.DataFrame, fit_on: bool = True) -> list[str]:
    """Row-label columns: dataset, arch, width, depth; `fit_on` when some row was fitted on a holdout, `variant`
    when some row has one."""
    cols = ["dataset", "arch", "width", "depth"]
    if fit_on and "fit_on" in summary and (summary.fit_on != "all").any():
        cols.append("fit_on")
    return cols + (["variant"] if (summary.variant != "").any() else [])


def _labels(summary: pd.DataFrame) -> tuple[list[str], list[str]]:
    """(header names, ROW_KEY columns) of the row labels."""
    cols = _label_columns(summary)
    return [LABEL_NAMES[c] for c in cols], cols


def _label_cells(key: tuple[Any, ...], cols: list[str]) -> list[str]:
    values = dict(zip(ROW_KEY, key, strict=True))
    return [str(values[c]) for c in cols]


def pivot(summary: pd.DataFrame, metric: str, digits: int = 3) -> tuple[list[str], list[list[str]]]:
    """One table (rows × erasers) of one group; refused over several groups."""
    require_one_group(summary, "a table")
    erasers = _ordered(summary.eraser)
    index = {tuple(k): r for k, (_, r) in zip(summary[CELL].itertuples(index=False), summary.iterrows(),
                                               strict=True)}
    labels, shown = _labels(summary)
    rows = [_label_cells(key, shown) + [_cell_text(index.get((*key, e)), metric, digits) for e in erasers]
            for key in _row_keys(summary)]
    return [*labels, *erasers], rows


def increase_rows(inc: pd.DataFrame, summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    require_one_group(summary, "a table")
    erasers = [e for e in _ordered(summary.eraser) if e != "control"]
    look = {tuple(k): (m, s, n) for k, m, s, n in zip(inc[CELL].itertuples(index=False), inc["mean"], inc["sd"],
                                                       inc["n"], strict=True)}
    labels, shown = _labels(summary)
    rows = []
    for key in _row_keys(summary):
        cells = []
        for e in erasers:
            m, s, n = look.get((*key, e), (math.nan, math.nan, 0))
            cells.append("missing" if n == 0 else (f"{m:+.3f} ± {s:.3f}" if not math.isnan(s) else f"{m:+.3f}"))
        rows.append(_label_cells(key, shown) + cells)
    return [*labels, *erasers], rows


def _first(g: pd.DataFrame, key: str) -> float:
    v = g[f"{key}_mean"].dropna() if f"{key}_mean" in g else pd.Series(dtype=float)
    return float(v.iloc[0]) if len(v) else math.nan


def _report_cells(g: pd.DataFrame) -> list[str]:
    """working rank (of d), variance dropped, max noise share; gradient erasure's own gaps before → after."""
    rank, d = _first(g, "working_rank"), _first(g, "d")
    cells = ["n/a" if math.isnan(rank) else f"{rank:.0f}/{d:.0f}"]
    for key in ("variance_dropped_fraction", "max_noise_share"):
        v = _first(g, key)
        cells.append("n/a" if math.isnan(v) else f"{v:.2%}")
    gaps = [_first(g, k) for k in ("max_mean_gap_before", "max_cov_gap_before", "max_mean_gap_after",
                                   "max_cov_gap_after")]
    cells.append("n/a" if any(math.isnan(v) for v in gaps) else
                 f"{gaps[0]:.3g} / {gaps[1]:.3g} → {gaps[2]:.3g} / {gaps[3]:.3g}")
    return cells


def _with_se(mean: float, se: float) -> str:
    if math.isnan(mean):
        return "n/a"
    return f"{mean:.3f} ± {se:.3f}" if not math.isnan(se) else f"{mean:.3f}"


def _has_probe_scores(summary: pd.DataFrame) -> bool:
    """Whether some result of these cells has the certificate's out-of-sample probe scores (SE, z, verdict)."""
    numbers = [f"{p}_probe_{k}_mean" for p in PROBES for k in ("acc_se", "loss_bits")]
    return any(c in summary and summary[c].notna().any() for c in numbers) or \
        ("probe_verdict" in summary and (summary.probe_verdict != "n/a").any())


def _probe_cells(g: pd.DataFrame) -> list[str]:
    """acc ± SE and log-loss ± SE (bits) per probe, chance (majority accuracy / prior-only code), the verdict."""
    cells = []
    for probe in PROBES:
        cells.append(_with_se(_first(g, f"{probe}_probe_acc"), _first(g, f"{probe}_probe_acc_se")))
        cells.append(_with_se(_first(g, f"{probe}_probe_loss_bits"), _first(g, f"{probe}_probe_loss_se")))
    chance, chance_loss = _first(g, "chance"), _first(g, "chance_loss_bits")
    cells.append(f"{'n/a' if math.isnan(chance) else f'{chance:.3f}'} / "
                 f"{'n/a' if math.isnan(chance_loss) else f'{chance_loss:.3f}'}")
    verdicts = [v for v in g.probe_verdict if v != "n/a"] if "probe_verdict" in g else []
    cells.append(next((v for v in verdicts if v.startswith(ARTEFACT)), verdicts[0] if verdicts else "n/a"))
    return cells


def certificate_rows(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """One row per (dataset, eraser) (and fit_on / variant, when some results were fitted on a holdout / differ
    in eraser options) of one group: the certificate after erasure and what the eraser reports it did. With the
    certificate's out-of-sample probes: each probe's accuracy and log-loss (bits) ± SE, chance, and the verdict
    (a probe below chance by > ARTEFACT_Z SE reads "dependence artefact", never a success)."""
    require_one_group(summary, "a table")
    keys = ["dataset", *[c for c in _label_columns(summary) if c in ("fit_on", "variant")], "eraser"]
    probes = _has_probe_scores(summary)
    rows = []
    for key, g in summary.groupby(keys, sort=False):
        if probes:
            gaps = [g[f"{k}_mean"].dropna() for k in ("max_mean_gap", "max_cov_gap")]
            scores = [f"{v.iloc[0]:.3g}" if len(v) else "n/a" for v in gaps] + _probe_cells(g)
        else:
            scores = [f"{v.iloc[0]:.3g}" if len(v) else "n/a" for v in (g[f"{k}_mean"].dropna() for k in CERT)]
        rows.append([*key, *scores, *_report_cells(g)])
    order = {e: i for i, e in enumerate(_ordered(summary.eraser))}
    rows.sort(key=lambda r: (r[0], order[r[len(keys) - 1]], *r[1:len(keys) - 1]))
    cert = [CERT["max_mean_gap"], CERT["max_cov_gap"], *[f"{p} probe {what}" for p in PROBES for what in
                                                         ("acc ± SE", "loss ± SE (bits)")],
            "chance acc / loss (bits)", "probe verdict"] if probes else list(CERT.values())
    header = [*[k.replace("_", " ") for k in keys], *cert, "working rank", "variance dropped", "noise share (max)",
              "gradient gaps mean / cov (before → after)"]
    return header, rows


NULL_HOWTO = ("–: no null run; run the cell again with `dataset.permute_labels=true` (same config and seeds "
              "otherwise)")


def null_rows(summary: pd.DataFrame) -> tuple[list[str], list[list[str]]]:
    """The null control of one group: per cell (eraser × fit_on) its MDL, its null's MDL (permuted labels, mean
    over the null's seeds × folds), the label entropy, bias = null MDL − label entropy, the noise the bias is
    compared with (scripts/tables.bias_noise) and the flag, seeds (true / null)."""
    require_one_group(summary, "a table")
    cols = [c for c in _label_columns(summary, fit_on=False)]
    order = {e: i for i, e in enumerate(_ordered(summary.eraser))}
    rows_of = {k: i for i, k in enumerate(_row_keys(summary))}
    recs = sorted((r for _, r in summary.iterrows()),
                  key=lambda r: (rows_of[tuple(r[k] for k in ROW_KEY)], order[r.eraser]))
    rows = []
    for r in recs:
        values = dict(zip(ROW_KEY, (r[k] for k in ROW_KEY), strict=True))
        label = [str(values[c]) for c in cols] + [r.eraser, r.fit_on, _cell_text(r, "bits_per_sample")]
        if r.null_runs == 0:
            rows.append([*label, "–", "–", "–", "–", "", f"{r.n_seeds} / 0"])
            continue
        null = fmt(r.null_mean, r.null_sd) + (f" [{r.null_folds}]" if r.null_folds else "")
        ref = "n/a" if math.isnan(r.null_ref) else f"{r.null_ref:.3f} ({r.null_ref_kind})"
        bias = "n/a" if math.isnan(r.bias) else f"{r.bias:+.3f}"
        noise = f"{r.bias_noise:.3f} ({r.bias_noise_of})" if r.bias_noise_of else "n/a (< 2 seeds)"
        rows.append([*label, null, ref, bias, noise, r.bias_flag, f"{r.n_seeds} / {r.null_seeds}"])
    header = [*[LABEL_NAMES[c] for c in cols], "eraser", "fit on", "MDL", "null MDL", "label entropy", "bias",
              "noise (2 SE)", "flag", "n seeds (true / null)"]
    return header, rows


NULL_NOTE = (
    "Null: the cell rerun with `dataset.permute_labels=true` (labels shuffled once per seed, same config otherwise), "
    "mean over its seeds × folds. bias = null MDL − label entropy (H of the class prior where the result records "
    "it, else log2 K): what the procedure charges for labels that carry no information (> 0: the cost of learning "
    "nothing; < 0: the code found label information that is not in the images, e.g. put there by an eraser fitted "
    "on the coded samples). flag: ⚠ when |bias| > noise = 2 × the larger standard error over seeds of the null "
    "MDL (`null`) and the cell's true-label MDL (`true`), each with ≥ 2 seeds; ok within it; ? fewer than 2 seeds "
    "on both. " + NULL_HOWTO + ".\n")
NO_NULL = ("Null control: no permuted-label runs among these results, so the procedure's bias (null MDL − label "
           "entropy) is unknown; rerun the cells with `dataset.permute_labels=true` (same config and seeds "
           "otherwise) to measure it.\n")


def paper_rows(summary: pd.DataFrame) -> list[list[str]] | None:
    """Paper Appendix C next to ours (legacy units) for the CIFAR-10 base-size cells of one group, if any."""
    require_one_group(summary, "a table")
    group = groups_in(summary)[0] if len(summary) else "{}"
    index = {tuple(k): r for k, (_, r) in zip(summary[CELL].itertuples(index=False), summary.iterrows(),
                                               strict=True)}
    rows, found = [], False
    for name, (tag, width, depth) in PAPER_ARCHS.items():
        cells = []
        for eraser, (pm, ps) in PAPER_TABLE_C[name].items():
            rec = index.get((group, "cifar10", tag, width, depth, "all", "", eraser))
            found |= rec is not None
            cells.append(f"{_cell_text(rec, 'legacy', 2)} / {pm:.2f} ± {ps:.2f}")
        rows.append([name, *cells])
    return rows if found else None


def unfinished(df: pd.DataFrame, with_group: bool = False) -> list[list[str]]:
    bad = df[df.status != "done"]
    rows = []
    for _, r in bad.iterrows():
        null = r.get("null")
        status = f"{r.status} (null)" if pd.api.types.is_bool(null) and null else r.status  # permuted labels
        row = [status, str(r.seed), r.job_dir, str(r.get("error", "") or "")]
        if with_group:
            g = r.get("group")
            row.insert(0, group_label(g) if isinstance(g, str) else "unknown (no result to tell)")
        rows.append(row)
    return rows


def _code_line(df: pd.DataFrame) -> str:
    done = df[df.status == "done"]
    if done.empty or "commit" not in done:
        return ""
    counts = done.commit.fillna(UNKNOWN_COMMIT).value_counts(sort=False)
    shown = ", ".join(f"{c} ({n})" for c, n in counts.items())
    note = "; unknown: no commit recorded (older result, or not a git checkout)" if UNKNOWN_COMMIT in counts else ""
    return f"Code versions (commit: finished results): {shown}{note}.\n"


def _mixed_lines(summary: pd.DataFrame) -> str:
    mixed = summary[summary.mixed_commits.astype(bool)] if "mixed_commits" in summary else summary.iloc[0:0]
    return "".join(f"{MIXED} seeds from different commits: {_cell_name(r)}: {r.commits}\n"
                   for _, r in mixed.iterrows())


def _group_sections(df: pd.DataFrame, summary: pd.DataFrame, h: str) -> list[str]:
    parts = [f"{h} MDL (bits/sample)\n", md_table(*pivot(summary, "bits_per_sample"))]
    mixed = _mixed_lines(summary)
    if mixed:
        parts.append(mixed)
    parts += [f"{h} Legacy MDL (the paper code's units)\n", md_table(*pivot(summary, "legacy"))]
    inc = increase_over_control(df)
    if len(inc):
        parts += [f"{h} MDL increase over control (bits/sample, paired by seed)\n",
                  md_table(*increase_rows(inc, summary))]
    if "null_runs" in summary and (summary.null_runs > 0).any():
        parts += [f"{h} Null control (permuted labels, bits/sample)\n", md_table(*null_rows(summary)), NULL_NOTE]
    else:
        parts.append(NO_NULL)
    parts += [f"{h} Final validation loss (bits, full-data run)\n", md_table(*pivot(summary, "final_val_loss"))]
    parts += [f"{h} Erasure certificate (after erasure)\n", md_table(*certificate_rows(summary))]
    paper = paper_rows(summary)
    if paper is not None:
        header = ["architecture", *[f"{PAPER_ERASER_NAMES[e]} (ours / paper)" for e in PAPER_TABLE_C["MLP"]]]
        parts += [f"{h} Paper Appendix C vs ours (CIFAR-10, legacy units)\n", md_table(header, paper)]
    return parts


def plot_stems(summary: pd.DataFrame, name: str) -> dict[str, str]:
    """group -> file stem of its plots: `name`, or `name-g<i>` with several groups."""
    groups = groups_in(summary)
    return {g: name if len(groups) == 1 else f"{name}-g{i}" for i, g in enumerate(groups, 1)}


def markdown(df: pd.DataFrame, summary: pd.DataFrame, title: str, name: str = "results") -> str:
    done, total = int((df.status == "done").sum()), len(df)
    protocols = ", ".join(sorted({p for p in summary.protocol if p})) or "n/a"
    parts = [f"# {title}\n", f"{done}/{total} jobs finished; MDL protocol: {protocols}. Cells: mean ± sd over "
             f"finished seeds, (n/N) when seeds are missing, {MIXED} when they come from different commits.\n"]
    code = _code_line(df)
    if code:
        parts.append(code)
    groups = groups_in(summary)
    if len(groups) == 1:
        parts += _group_sections(df, summary, "##")
    else:
        from scripts.tables import differing_keys

        keys = ", ".join(differing_keys(groups))
        parts.append(f"These results differ in {keys} besides the eraser and the seed: one set of tables per "
                     f"group, erasers compared only within a group ({MISSING_KEY}: not recorded in the result; "
                     f"{PAPER_RULE}: the paper's rate for the architecture and eraser family).\n")
        stems, labels = plot_stems(summary, name), group_labels(groups)
        for i, g in enumerate(groups, 1):
            parts.append(f"## Group {i}: {labels[g]}\n\nPlots: {stems[g]}*.png\n")
            parts += _group_sections(df[df.group == g], summary[summary.group == g], "###")
    bad = unfinished(df, with_group=len(groups) > 1)
    if bad:
        header = ["status", "seed", "job dir", "detail"]
        parts += ["## Jobs without a result\n", md_table(["group", *header] if len(groups) > 1 else header, bad)]
    return "\n".join(parts)


def _tex_escape(s: str) -> str:
    for char in "&%#":
        s = s.replace(char, "\\" + char)
    return s.replace("_", r"\_").replace("±", r"$\pm$").replace(MIXED, r"$\dagger$")


def latex(summary: pd.DataFrame) -> str:
    out = []
    for g in groups_in(summary):
        part = summary[summary.group == g]
        where = f" ({_tex_escape(group_label(g))})" if group_label(g) else ""
        for metric, caption in (("bits_per_sample", "Prequential MDL (bits/sample)"),
                                ("legacy", "Legacy MDL (paper units)")):
            header, rows = pivot(part, metric)
            shown = len(_labels(part)[1])
            out += [r"\begin{table}[t]", r"\centering",
                    r"\begin{tabular}{" + "l" * shown + "r" * (len(header) - shown) + "}",
                    r"\toprule", " & ".join(_tex_escape(h) for h in header) + r" \\", r"\midrule"]
            out += [" & ".join(_tex_escape(c) for c in r) + r" \\" for r in rows]
            out += [r"\bottomrule", r"\end{tabular}", rf"\caption{{{caption}{where}; mean $\pm$ sd over seeds.}}",
                    r"\end{table}", ""]
    return "\n".join(out)


# --- other tasks ------------------------------------------------------------------------------------------
def gs_module() -> Any:
    """scripts/aggregate_gs.py (Spectral Decoupling tables and plots)."""
    from scripts import aggregate_gs

    return aggregate_gs


def other_task_tables(results: list[dict[str, Any]], out: Path | None = None) -> dict[str, str]:
    """Tables (and, with `out`, plots) from scripts/aggregate_gs.py (Spectral Decoupling; it picks the results it
    knows: tasks other than mdl, and MDL runs with a regularizer). Its failure is reported, not fatal."""
    if not results:
        return {}
    others = sum(not _is_mdl_task(r) for r in results)
    try:
        module = gs_module()
        tables = dict(module.tables(results))
        if others and not tables:
            print(f"note: {others} result(s) of other tasks have no table here (scripts/aggregate_gs.py made none)",
                  file=sys.stderr)
        if out is not None and tables:
            for path in module.plots(results, out):
                print(f"wrote {path}")
        return tables
    except Exception as e:  # noqa: BLE001 - the MDL tables stand on their own
        print(f"warning: aggregate_gs failed ({type(e).__name__}: {e}); its tables are missing", file=sys.stderr)
        return {}


# --- main -------------------------------------------------------------------------------------------------
def write_all(df: pd.DataFrame, results: list[dict[str, Any]], out: Path, name: str, title: str) -> str:
    out.mkdir(parents=True, exist_ok=True)
    text = ""
    if len(df):
        summary = summarize(df)
        text = markdown(df, summary, title, name)
        (out / f"{name}.md").write_text(text)
        summary.to_csv(out / f"{name}.csv", index=False)
        df.drop(columns=["curve"], errors="ignore").to_csv(out / f"{name}_jobs.csv", index=False)
        (out / f"{name}.tex").write_text(latex(summary))
        from scripts.aggregate_plots import plot_all

        inc = increase_over_control(df)
        for group, stem in plot_stems(summary, name).items():  # one set of plots per group: never overlaid
            plot_all(df[df.group == group], summary[summary.group == group], inc[inc.group == group], out, stem)
    for key, table in other_task_tables(results, out).items():
        fname = key if Path(key).suffix else f"{key}.md"
        (out / f"{name}_{fname}").write_text(table)
        text += f"\n{table}"
    return text


def strict_refusal(df: pd.DataFrame) -> str | None:
    """The one line --strict refuses with, or None: every cell's seeds from one known commit."""
    mixed, unknown = commit_problems(df)
    problems = []
    if mixed:
        problems.append(f"{len(mixed)} cell(s) with seeds from different commits (first: {mixed[0]})")
    if unknown:
        problems.append(f"{len(unknown)} result(s) without a recorded commit (first: {unknown[0]})")
    if not problems:
        return None
    return ("--strict: " + "; ".join(problems) + "; rerun those jobs with one version of the code, or aggregate "
            "without --strict")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("root", nargs="?", type=Path, help="directory searched for result.json")
    ap.add_argument("--experiment", help="aggregate exactly the jobs of this preset (missing ones shown)")
    ap.add_argument("--override", action="append", default=[], help="extra Hydra override for --experiment")
    ap.add_argument("--name", default=None, help="table/plot file stem (default: experiment name or 'results')")
    ap.add_argument("--out", type=Path, default=Path("outputs/tables"))
    ap.add_argument("--claims", action="store_true",
                    help="also print the paper's claims report (scripts/claims.py), per group; with --experiment "
                         "it is printed whenever the preset defines `claims`")
    ap.add_argument("--strict", action="store_true",
                    help="refuse (exit 2, one line) when a cell's seeds come from different commits or a result "
                         "has no recorded commit (provenance.code.commit)")
    args = ap.parse_args(argv)
    if args.experiment:
        df, results = collect_experiment(args.experiment, args.override)
        title = f"Experiment {args.experiment}"
    elif args.root:
        df, results = collect_dir(args.root)
        title = f"Results under {args.root}"
    else:
        ap.error("give a directory or --experiment")
    if df.empty and not results:
        print("no results found", file=sys.stderr)
        return 1
    if args.strict and not df.empty and (line := strict_refusal(df)) is not None:
        print(f"error: {line}", file=sys.stderr)
        return 2
    name = args.name or args.experiment or "results"
    print(write_all(df, results, args.out, name, title))
    print(f"wrote {args.out}/{name}.md, .csv, _jobs.csv, .tex and PNG plots", file=sys.stderr)
    keys = preset_claims(args.experiment, args.override) if args.experiment else None
    if (args.claims or keys) and not df.empty:
        from scripts import claims

        report = claims.markdown_groups(claims.evaluate_groups(df, keys))
        print(report)
        (args.out / f"{name}_claims.md").write_text(report)
    return 0


def preset_claims(experiment: str, extra: list[str]) -> list[str] | None:
    """The claims a preset defines (its `claims` key), or None."""
    from training.app.sweeps import expand

    cfgs = expand(experiment, extra)
    keys = load_config(cfgs[0]).claims if cfgs else None
    return [str(k) for k in keys] if keys else None


if __name__ == "__main__":
    sys.exit(main())
