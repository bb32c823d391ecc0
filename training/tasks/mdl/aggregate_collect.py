"""Collect result.json files into one row per job for scripts/aggregate.py: the config identity that decides
a job's comparison group and eraser variant, the unfinished jobs (missing, failed, partial, incomplete,
malformed), and the code version each result records.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import sys
import typing
from collections import defaultdict
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from erasure.registry import ERASERS
from training.analysis.tables import PROBES, Recorded
from training.app.lifecycle import SavedProgress
from training.app.result_codec import MalformedResultError, config_view, flatten
from training.app.result_types import Result, at, number
from training.app.results import RESULT_FILE, SET_ASIDE, same_config
from training.app.schema import JobConfig, OptionsSection, Section, config_hash, same_numbers
from training.app.tasks import job_semantic, read_any, spec_of
from training.common.ledger_entry import ENTRY_GLOB, LedgerEntry, read_entry
from training.data.eraser_config import FIT_DEFAULTS, REPEAT_KEY, legacy_fold
from training.tasks.mdl.job_paths import JobPath
from training.tasks.mdl.result import BlockRecord, MdlRecord, MdlResult, number_or_nan

# A table row (group: the comparison group, a table of its own; fit_on: how the eraser was fitted, all | holdout;
# variant: eraser options that differ, if any). A cell's runs: its seeds × folds, and its null runs (`null`).
ROW_KEY = ["group", "dataset", "arch", "width", "depth", "fit_on", "variant"]
CELL = [*ROW_KEY, "eraser"]
# Config keys shown by the row/column labels themselves; every other semantic key that differs within a
# comparison puts results into different groups, eraser options into different variants of the eraser.
SHOWN = {"seed", "dataset.tag", "dataset.name", "arch.tag", "arch.name", "arch.activation", "arch.width",
         "arch.depth", "eraser.name", "eraser.fit_on"}
# Keys that are not identity: the repeats of a cell (repeated holdout) are combined, a permuted-label run is the null
# of its cell. `eraser.repeat` names the repeat (result_codec reads a result's older `eraser.fold` as it).
NULL_KEY = "dataset.permute_labels"
# Fit modes with a random split of the training rows (and so repeats): population codes the rows self codes.
SPLIT_MODES = ("holdout", "self", "population")
# The eraser.fit keys a fit mode does not use (no effect on its job: not in the hash).
UNUSED_FIT_KEYS: defaultdict[str, tuple[str, ...]] = defaultdict(tuple, {  # other modes: none unused
    "all": ("eraser.fit_fraction", REPEAT_KEY, "eraser.fit_source", "eraser.n_fit"),
    "oracle": ("eraser.fit_fraction", REPEAT_KEY, "eraser.fit_source")})
# Comparisons: the erasers of a table row, the widths of one eraser (MDL vs width), its depths.
UNITS = [["dataset", "arch", "width", "depth"], ["dataset", "arch", "depth", "eraser", "variant"],
         ["dataset", "arch", "width", "eraser", "variant"]]
PAPER_KEYS = ("optim.lr", "optim.beta1", "optim.warmup_steps")  # conf/optim/schedulefree.yaml: the paper's rule
PAPER_TABLES = ("arch.paper_optim.", "dataset.paper_lr.")  # the tables of that rule (not hashed, not identity)
PAPER_RULE = "paper_optim"  # such a key at the value its rule gives (arch.paper_optim per eraser family)
UNKNOWN_COMMIT = "unknown"
DIRTY, UNKNOWN_DIRTY = "+dirty", "+dirty?"  # after a commit: uncommitted changes; whether there were is unknown
CERT = {"max_mean_gap": "mean gap", "max_cov_gap": "cov gap", "linear_probe_acc": "linear probe",
        "quadratic_probe_acc": "quadratic probe", "mlp_probe_acc": "MLP probe", "chance": "chance"}
# The certificate's out-of-sample (cross-fitted) probe scores (erasure/certificate.py), where the result has them.
PROBE_NUMBERS = [f"{p}_probe_{k}" for p in PROBES for k in ("acc_se", "acc_z", "loss_bits", "loss_se", "loss_z")] \
    + ["chance_loss_bits"]
# What the eraser's report says it did (result.json "eraser" → "report"): QLEACE's working rank (of d), the
# variance of the dropped directions and the coupling noise's largest share of tr C; gradient erasure's own
# gaps to its targets (relative mean / covariance distance) before and after the optimisation.
REPORT = ["working_rank", "d", "variance_dropped_fraction", "max_noise_share", "max_mean_gap_before",
          "max_cov_gap_before", "max_mean_gap_after", "max_cov_gap_after"]
# Training budget (training/engine/stopping.py: a block model stops for `patience` or `max_epochs`; the step floor
# can run it past max_epochs, so its `epochs` are what it ran). A block model is AT THE CAP when it stopped for
# max_epochs (the patience rule never fired: it was still improving within its patience window) with its best
# epoch in the last CAP_TAIL of the epochs it ran (at least the last one): the cap, not the data, ended it.
CAP_TAIL = 0.1
STOP_REASONS = ("patience", "max_epochs")


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


def _load_result(path: Path) -> tuple[Result | None, str | None]:
    """(result, None), or (None, why) for a file that is not a result (None, None: absent)."""
    try:
        result = read_any(path)
    except MalformedResultError as e:
        return None, str(e)
    except OSError as e:
        return None, f"not readable JSON ({type(e).__name__}: {e})"
    if result is not None and result.config is None:
        return None, "no config"
    return result, None


@functools.cache
def _closed_sections() -> dict[str, frozenset[str]]:
    """Config groups that allow no undeclared keys, with their declared keys (training/app/schema.py)."""
    out = {}
    for name, kind in typing.get_type_hints(JobConfig).items():  # a section's field is typed as its class
        if isinstance(kind, type) and issubclass(kind, Section) and not issubclass(kind, OptionsSection):
            out[name] = frozenset(g.name for g in dataclasses.fields(kind) if not g.name.startswith("_"))
    return out


def _dead(key: str) -> bool:
    """A key of a closed group that the schema no longer declares (e.g. a pre-v2 result's eraser.cache)."""
    group, _, rest = key.partition(".")
    sections = _closed_sections()
    return group in sections and rest.split(".")[0] not in sections[group]


def _family(eraser: Any) -> str | None:
    try:
        return str(ERASERS.meta(str(eraser))["family"]) if eraser in ERASERS else None
    except Exception:  # noqa: BLE001 - no registry, no rule: the value is compared as it is
        return None


def _paper_value(flat: dict[str, Any], key: str) -> Any:
    """What conf/optim/schedulefree.yaml resolves `key` to by the paper's rule (None: no rule in this config)."""
    if key == "optim.lr":  # the dataset's rate for the architecture, else the architecture's for the eraser family
        rules = [f"dataset.paper_lr.{flat['arch.name']}", f"arch.paper_optim.lr.{_family(flat['eraser.name'])}"]
    else:
        rules = [f"arch.paper_optim.{key.split('.', 1)[1]}"]
    return next((flat[rule] for rule in rules if rule in flat), None)  # no family: no such key


def config_identity(cfg: dict[str, Any], numerics_version: Any = None) -> dict[str, Any]:
    """The semantic config (flat, dotted keys) as results are compared: what the job hash covers, as the result
    recorded it (no defaults filled in for keys added since: those read "?"; except FIT_DEFAULTS, whose absence
    means exactly those values, and eraser.fit_fraction/fold, which do nothing with eraser.fit_on=all, are
    dropped there), without keys the schema has dropped since; optim.lr/beta1/warmup_steps that follow the
    paper's rule (arch.paper_optim per eraser family, dataset.paper_lr; null in a pre-v2 result) read PAPER_RULE,
    so erasers at their paper rates compare."""
    flat = legacy_fold({k: v for k, v in flatten(job_semantic(cfg, fill_defaults=False)).items() if not _dead(k)})
    flat = {**FIT_DEFAULTS, **flat}
    # hashed only away from fp32: absent, it is what the result recorded (fp32 before the key existed)
    recorded, key = flatten(same_numbers(cfg)), "training.precision"
    flat.setdefault(key, recorded[key] if key in recorded else "fp32")
    fit_on = flat["eraser.fit_on"]
    if fit_on in SPLIT_MODES and flat["eraser.fit_source"] in ("split", None):  # FIT_DEFAULTS: always there
        flat.pop("eraser.n_fit", None)  # the split decides the fit size
        flat.pop("eraser.fit_source", None)  # split: the default (absent in results written before pool existed)
    for key in UNUSED_FIT_KEYS[str(fit_on)]:
        flat.pop(key, None)
    tables = {k: v for k, v in flatten(cfg).items() if k.startswith(PAPER_TABLES)}  # not hashed: the stored config's
    for key in PAPER_KEYS:
        if key in flat and (flat[key] is None or flat[key] == _paper_value({**tables, **flat}, key)):
            flat[key] = PAPER_RULE
    if numerics_version is not None and "numerics_version" not in flat:
        flat["numerics_version"] = numerics_version
    return flat


def _cell_from_config(cfg: dict[str, Any], numerics_version: Any = None) -> dict[str, Any]:
    """The row's labels, and its identity: `settings`, what must be equal for two results to be compared (all but
    labels, eraser and seed); `eraser_settings`, the eraser's options (its variants). Neither holds the fold (folds
    are combined) nor dataset.permute_labels (a null run belongs to the cell of its true-label runs)."""
    c = config_view(cfg)  # older spellings read as today's (result_codec.config_view)
    fit_on = str(c["eraser.fit_on"])
    flat = {k: v for k, v in config_identity(cfg, numerics_version).items() if k not in (REPEAT_KEY, NULL_KEY, *SHOWN)}
    settings = {k: v for k, v in flat.items() if not k.startswith("eraser.")}
    eraser = {k: v for k, v in flat.items() if k.startswith("eraser.")}
    return {"dataset": c["dataset.tag"], "arch": c["arch.tag"], "width": int(c["arch.width"]),
            "depth": int(c["arch.depth"]), "eraser": str(c["eraser.name"]), "seed": int(c["seed"]),
            "fit_on": fit_on, "fold": int(c[REPEAT_KEY] or 0) if fit_on in SPLIT_MODES else 0,
            "null": bool(c[NULL_KEY]), "protocol": c["mdl.protocol"],
            "settings": json.dumps(settings, sort_keys=True, default=str),
            "eraser_settings": json.dumps(eraser, sort_keys=True, default=str)}


def _cell_from_path(job_dir: Path) -> dict[str, Any] | None:
    p = JobPath.parse(job_dir)  # paths.job_subdir (and the pre-v2 layout)
    if p is None:
        return None
    return {"dataset": p.dataset, "arch": p.arch, "width": p.width, "depth": p.depth,
            "eraser": p.eraser, "seed": p.seed, "fit_on": None, "fold": None, "null": None,
            "protocol": "?", "settings": None, "eraser_settings": None}


def _key_values(flats: list[Recorded]) -> set[str]:
    """Keys whose values differ between these flat configs (a key one of them lacks reads MISSING_KEY)."""
    return {k for k in set().union(*flats) if len({json.dumps(f[k], sort_keys=True, default=str) for f in flats}) > 1}


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
        flats = [Recorded(json.loads(s)) for s in set(g.eraser_settings)]
        varying = sorted(_key_values(flats)) if len(flats) > 1 else []
        for i in g.index if varying else ():
            flat = Recorded(json.loads(df.at[i, "eraser_settings"]))
            df.at[i, "variant"] = ", ".join(f"{k}={flat[k]}" for k in varying)
    known = df[df.settings.notna()]
    split: set[str] = set()
    for unit in UNITS:
        for _, g in known.groupby(unit, sort=False):
            if len(flats := [Recorded(json.loads(s)) for s in set(g.settings)]) > 1:
                split |= _key_values(flats)
    for i in known.index:
        flat = Recorded(json.loads(df.at[i, "settings"]))
        df.at[i, "group"] = json.dumps({k: flat[k] for k in sorted(split)}, default=str)
    _place_unknown(df)
    df["null"] = df["null"].map(lambda v: pd.api.types.is_bool(v) and bool(v))
    order = df.assign(_rank=(df.status != "done").astype(int)).sort_values("_rank", kind="stable")
    aside = ["set_aside"] if "set_aside" in order else []  # a result moved aside is not a repeat of result.json
    same = [*CELL, "null", "fold", "seed", *aside]
    # a row known only by its directory repeats only a row of its c<hash> directory (another config's otherwise)
    home = order.assign(home=order.job_dir.map(lambda d: Path(_cell_dir(d)).name)).duplicated([*same, "home"])
    dup = order.duplicated(same) & order.group.notna() & (order.settings.notna() | home)
    if dup.any():
        warn(f"{int(dup.sum())} repeated result(s) of the same config and seed ignored: "
             + ", ".join(order[dup].job_dir.astype(str)))
    return df.drop(index=order[dup].index).drop(columns=["settings", "eraser_settings"])


PLACED = ("group", "variant", "fit_on", "fold", "null")  # what a row known only by its directory takes over


def _place_unknown(df: pd.DataFrame) -> None:
    """Group, variant, fit_on, fold and null of rows known only by their directory (in place): those of the
    finished seeds in their c<hash> directory, or of their cell when unambiguous (else the group stays unknown)."""
    known = df[df.group.notna()]
    by_dir: defaultdict[str, set[tuple[Any, ...]]] = defaultdict(set)
    by_cell: defaultdict[tuple[Any, ...], set[tuple[Any, ...]]] = defaultdict(set)
    for r in known.itertuples():
        placed = tuple(getattr(r, k) for k in PLACED)
        by_dir[_cell_dir(r.job_dir)].add(placed)
        by_cell[(r.dataset, r.arch, r.width, r.depth, r.eraser)].add(placed)
    groups = set(known.group)
    for i in df.index[df.group.isna()]:
        r = df.loc[i]
        found = by_dir[_cell_dir(r.job_dir)] or by_cell[(r.dataset, r.arch, r.width, r.depth, r.eraser)]
        if len(found) == 1:
            for key, value in zip(PLACED, next(iter(found)), strict=True):
                df.at[i, key] = value
        elif not found and len(groups) <= 1:
            df.at[i, "group"] = next(iter(groups), "{}")
            df.at[i, "fit_on"], df.at[i, "fold"], df.at[i, "null"] = "all", 0, False


def _cell_dir(job_dir: str) -> str:
    """The c<hash> directory holding a job's seed directories ("" in the pre-v2 layout)."""
    p = JobPath.parse(job_dir)
    return str(Path(job_dir).parent) if p is not None and p.cell is not None else ""


def commit_of(result: Result) -> str:
    """The code version a result was computed with: its commit (10 hex digits, `+dirty` with uncommitted
    changes, `+dirty?` where that is unknown), or UNKNOWN_COMMIT (written without provenance, or outside a git
    checkout)."""
    prov = result.provenance
    if prov is None or prov.commit is None:
        return UNKNOWN_COMMIT
    return prov.commit[:10] + {True: DIRTY, False: "", None: UNKNOWN_DIRTY}[prov.dirty]


# memory_format: "channels_last" only where training.channels_last was on (absent, as in older results: None)
SIGNATURE = ("device_name", "torch", "cuda", "cudnn", "precision", "engine", "models_together", "deterministic",
             "memory_format")


BITWISE_ON_CPU = {"fit", "loop"}  # the numerics contract: bitwise on CPU, alone or in a group of any size


def numerics_of(result: Result) -> str | None:
    """The numerics signature a result records (`provenance.numerics`, training/engine/numerics.py) as one text,
    or None for a result written before it (not compared). On CPU the loop engine and `fit()` give the same bits
    whatever the group size, so there they read as one engine ("fit|loop", models_together "any")."""
    sig = result.provenance.raw.get("numerics") if result.provenance is not None else None
    if not isinstance(sig, Mapping):
        return None
    if sig.get("cuda") is None and set(str(sig.get("engine")).split("+")) <= BITWISE_ON_CPU:
        sig = {**sig, "engine": "fit|loop", "models_together": "any"}
    return " ".join(f"{k}={sig.get(k)}" for k in SIGNATURE)


def data_of(result: Result) -> str | None:
    """The identity of the data a result was computed on: its `dataset.fingerprint` content hash (the loaded
    arrays', before any label permutation), or None for a result written without one."""
    fingerprint = result.dataset.fingerprint
    return fingerprint.content if fingerprint is not None and fingerprint.content else None


def _label_entropy(result: MdlResult, mdl: MdlRecord | None) -> tuple[float, str]:
    """(bits, source) the null's MDL is compared with: the entropy of the class prior where the result gives it
    (`dataset.class_counts`, or the certificate's `chance_loss_bits`: the prior-only code of the coded labels),
    else log2 K (K: mdl.num_classes, or dataset.num_classes); (NaN, "") without either."""
    if (counts := result.dataset.class_counts) is not None and sum(counts) > 0:
        total = float(sum(counts))
        return -sum(c / total * math.log2(c / total) for c in counts if c > 0), "H(prior)"
    for side in ("after", "before"):
        if math.isfinite(value := result.body.certificate.score("chance_loss_bits", side)):
            return value, "H(prior)"
    k = mdl.num_classes if mdl is not None else None
    k = k if k is not None else result.dataset.num_classes
    return (math.log2(k), "log2 K") if k is not None and k >= 1 else (math.nan, "")


def at_cap(block: BlockRecord) -> bool | None:
    """Whether a block model stopped at the cap (see CAP_TAIL); None when its result does not say."""
    epochs, best, reason = block.epochs, block.best_epoch, block.stop_reason
    if reason is None or epochs is None or best is None:
        return None
    tail = max(1, math.ceil(CAP_TAIL * epochs))
    return reason == "max_epochs" and best > epochs - tail


def budget_columns(mdl: MdlRecord) -> dict[str, float]:
    """Per run: block models with a known stop reason, those stopped by each reason, those at the cap, and how much
    the at-cap ones' validation trends would still lower the code (bits/sample; analysis/tables.budget_reason)."""
    caps = [c for c in (at_cap(b) for b in mdl.blocks) if c is not None]
    trends = [b for b in mdl.blocks if b.tail_fall_bits is not None and b.coded_size]
    out = {"blocks_known": float(len(caps)) if caps else math.nan,
           "blocks_at_cap": float(sum(caps)) if caps else math.nan,
           "budget_bits": sum((b.tail_fall_bits or 0) * (b.coded_size or 0) for b in trends if at_cap(b))
           / mdl.n_coded if trends and len(trends) == len(mdl.blocks) and mdl.n_coded else math.nan}
    for reason in STOP_REASONS:
        out[f"blocks_{reason}"] = float(sum(b.stop_reason == reason for b in mdl.blocks)) if caps else math.nan
    return out


def fit_columns(result: MdlResult, mdl: MdlRecord) -> dict[str, Any]:
    """result.json eraser.fit: fit_source, n_fit, n_coded (mdl.n_coded where fit lacks it), fit rows
    per class per input dimension; eraser.rank_test (a fitted linear eraser): rank_irregular (1/0), rank_p."""
    fit, erasure = result.body.erasure.fit, result.body.erasure
    n_coded = fit.n_coded if fit.n_coded is not None else mdl.n_coded
    shape, k = at(result.body.written, "dataset", "input_shape"), mdl.num_classes
    d = math.prod(shape) if isinstance(shape, list) and all(isinstance(v, int) for v in shape) else None
    per_class = None if fit.n_fit is None or not k else fit.n_fit / k
    irregular = erasure.rank_irregular
    return {"fit_source": fit.fit_source or "", "n_fit": math.nan if fit.n_fit is None else fit.n_fit,
            "n_coded": math.nan if n_coded is None else n_coded,
            "fit_rows_per_class_dim": per_class / d if per_class is not None and d else math.nan,
            "rank_irregular": math.nan if irregular is None else float(irregular),
            "rank_p": number_or_nan(at(erasure.rank_test, "p"))}


def _result_row(result: Result, job_dir: str) -> dict[str, Any]:
    """The row of an MDL result: done; failed when its MDL is not finite; incomplete without an mdl section.
    Raises (KeyError, TypeError, ValueError) on a malformed config or mdl section (a malformed `final` is refused
    by the codec: result_codec.decode)."""
    assert isinstance(result, MdlResult) and result.config is not None
    ran_on = {"device": result.device} if result.device else {}  # what a precision computed in there (tf32: CUDA)
    row = {**_cell_from_config({**result.config, **ran_on}, result.numerics_version), "job_dir": job_dir,
           "status": "done", "commit": commit_of(result), "data": data_of(result),
           "numerics": numerics_of(result)}
    mdl = result.body.mdl
    if mdl is None:
        return {**row, "status": "incomplete", "error": "result.json has no mdl section"}
    bits, legacy = number(mdl.bits_per_sample), number(mdl.legacy)
    if bits is None or legacy is None:
        raise ValueError(f"mdl.bits_per_sample / mdl.legacy not numbers: {mdl.bits_per_sample!r}, {mdl.legacy!r}")
    if not (math.isfinite(bits) and (math.isfinite(legacy) or not mdl.has_legacy)):
        return {**row, "status": "failed", "error": f"non-finite MDL (bits_per_sample={bits}, legacy={legacy}): "
                                                      "not counted as a seed"}
    row.update(protocol=mdl.protocol or row["protocol"], bits_per_sample=bits, legacy=legacy)
    final, cert, erasure = result.body.final, result.body.certificate, result.body.erasure
    val_loss = final.val_loss_bits if final is not None else math.nan
    row["final_val_loss"] = math.nan if val_loss is None else val_loss
    row.update({key: cert.score(key) for key in [*CERT, *PROBE_NUMBERS]})  # NaN / None where an older one lacks it
    for probe in PROBES:  # its out-of-sample probes' flags
        row[f"{probe}_probe_below_chance"] = cert.flag(f"{probe}_probe_below_chance")
        row[f"{probe}_probe_verdict"] = cert.verdict(f"{probe}_probe_verdict")
    row["ref_bits"], row["ref_kind"] = _label_entropy(result, mdl)
    if result.dataset.permuted_labels:
        row["null"] = True  # a null run, whatever its config says
    row["folds_total"] = math.nan if erasure.fit.folds is None else int(erasure.fit.folds)
    row.update({**{key: erasure.report_number(key) for key in REPORT}, **budget_columns(mdl),
                **fit_columns(result, mdl)})
    row["curve"] = list(final.val_loss_curve) if final is not None else []
    return row


def failed_jobs(ledger_roots: Iterable[Path]) -> dict[str, str]:
    """job_dir -> error, from multirun ledgers (training/cli/ledger.py); the latest entry per job wins."""
    latest: dict[str, LedgerEntry] = {}
    for root in ledger_roots:
        for path in sorted(root.glob(f".multirun/*/{ENTRY_GLOB}")):  # run ids sort by time
            if (entry := read_entry(path)) is not None:
                latest[str(Path(entry.job_dir))] = entry
    return {d: e.error or "" for d, e in latest.items() if e.status == "failed"}


def _unfinished_row(cell: dict[str, Any], job_dir: Path, failed: dict[str, str]) -> dict[str, Any]:
    row = {**cell, "job_dir": str(job_dir), "status": "missing"}
    progress = _read(job_dir / "progress.json")
    if str(job_dir) in failed:
        row.update(status="failed", error=failed[str(job_dir)])
    elif progress is not None:
        try:
            blocks = len(SavedProgress.from_json(progress).blocks)
        except ValueError:
            blocks = 0
        row.update(status="partial", error=f"{blocks} block models finished")
    return row


def collect_dir(root: Path, set_aside: bool = False) -> tuple[pd.DataFrame, list[Result]]:
    """Rows of every MDL result.json under root plus failed/partial jobs found there; and all parsed results.
    A file that is not a result is a warning naming it (and a `malformed` row when its path names a job); an
    MDL result without an mdl section is `incomplete`; one whose MDL is not finite is `failed`. `set_aside`: also
    the results a job moved aside when its data changed (result.data-<fingerprint>.json; never averaged with
    the result.json beside them: their data differ)."""
    rows, results, seen = [], [], set()
    found = [*root.rglob(RESULT_FILE), *(root.rglob(SET_ASIDE.format("*")) if set_aside else ())]
    for path in sorted(found):
        result, why = _load_result(path)
        if result is not None:
            results.append(result)
            if result.task != "mdl":
                seen.add(str(path.parent))
                continue
            try:
                row = _result_row(result, str(path.parent))
                rows.append(row if path.name == RESULT_FILE else {**row, "set_aside": path.name})
                seen.add(str(path.parent))
                continue
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                why = f"malformed ({type(e).__name__}: {e})"
        if why is None:
            continue
        warn(f"skipped {path}: {why}")
        if (cell := _cell_from_path(path.parent)) is not None:
            rows.append({**cell, "job_dir": str(path.parent), "status": "malformed", "error": why})
            seen.add(str(path.parent))
    failed = failed_jobs([root, root / "runs"])
    unfinished = {str(p.parent) for p in root.rglob("progress.json")} | set(failed)
    for job_dir in sorted(unfinished - seen):
        if (cell := _cell_from_path(Path(job_dir))) is not None:
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


def collect_experiment(cfgs: list[dict[str, Any]]) -> tuple[pd.DataFrame, list[Result]]:
    """Exactly the jobs of a preset (`cfgs`, its expanded configs: training/common/sweeps.py `expand`), in launch
    order; jobs without a matching result are listed as such. Groups come from the preset's configs (a result counts
    only when its config hashes to its job's)."""
    failed = failed_jobs([d / "runs" for d in {Path(c["paths"]["out_dir"]) for c in cfgs}])
    rows: list[dict[str, Any]] = []
    results: list[Result] = []
    for cfg in cfgs:
        job_dir = Path(cfg["paths"]["job_dir"])
        path = job_dir / "result.json"
        result, why = _load_result(path)
        if why is not None:
            warn(f"skipped {path}: {why}")
        spec = spec_of(cfg)  # the edge: the config's task -> its TaskSpec
        h = config_hash(cfg, spec)  # same_config also rehashes the stored config (the hash may have changed since)
        same = result if result is not None and same_config(result, h, spec) else None
        if same is not None:
            results.append(same)
        if config_view(cfg)["task"] != "mdl":
            continue
        cell, status, error = _cell_from_config(cfg), "malformed", why
        if same is not None:
            try:
                rows.append({**_result_row(same, str(job_dir)), "settings": cell["settings"],
                             "eraser_settings": cell["eraser_settings"]})
                continue
            except (KeyError, TypeError, ValueError, AttributeError) as e:
                warn(f"skipped {path}: malformed ({type(e).__name__}: {e})")
                error = str(e)
        elif result is not None:
            status, error = "other-config", f"result.json holds config {result.config_hash or None}"
        elif why is None:
            rows.append(_unfinished_row(cell, job_dir, failed))
            continue
        rows.append({**cell, "job_dir": str(job_dir), "status": status, "error": error})
    return assign_groups(pd.DataFrame(rows)), results


