"""The eraser section's rules, read by the core's config check and job hash (training/app/loading.py, schema.py): what
it refuses, one line each (ConfigError: options that are not the eraser's options or not of their declared
types, an option it does not read with another's value, the fitting modes it cannot take), what of it enters the job
hash (`hashed_eraser`: the options that change the erased data, the fitting keys the mode reads, `after_augment` only
where something is erased per batch), and how older results spelled it (`FIT_DEFAULTS`, `legacy_fold`).
"""

from __future__ import annotations

import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from erasure import default_options
from erasure.registry import ERASERS
from erasure.traits import eraser_traits
from training.common.option_checks import ABSENT, check_typed, raw_view, shown
from training.data.generators import check_generated_size
from training.data.registry import DATASETS, DatasetCfg, dataset_traits
from training.errors import ConfigError

FIT_KEYS = ("fit_source", "fit_fraction", "repeat", "n_fit")
FOLD_KEY, REPEAT_KEY = "eraser.fold", "eraser.repeat"  # a result written before eraser.repeat names it eraser.fold
# Keys added after the first results were written, with their defaults in conf/config.yaml, not in the schema: a
# result written before them ran exactly like these values (the eraser fitted on the coded data, no repeats, true
# labels, erased before augment).
FIT_DEFAULTS = {"eraser.fit_on": "all", "eraser.fit_source": "split", "eraser.fit_fraction": 0.2, REPEAT_KEY: 0,
                "eraser.n_fit": None, "eraser.after_augment": False, "dataset.permute_labels": False,
                "eraser.fit_labels": "coded"}


def legacy_fold(flat: dict[str, Any]) -> dict[str, Any]:
    """eraser.fold (a flat config written before eraser.repeat) read as eraser.repeat, in place."""
    if FOLD_KEY in flat:
        flat.setdefault(REPEAT_KEY, flat.pop(FOLD_KEY))
    return flat


def fit_keys_used(fit_on: Any, fit_source: Any) -> tuple[str, ...]:
    """The eraser fitting keys a mode reads (conf/config.yaml); the others do not enter the job hash."""
    if fit_on == "oracle":
        return ("n_fit",)
    if fit_on == "population":  # the exact class moments, coding the rows `self` and `holdout` code
        return ("fit_source", "fit_fraction", "repeat")
    if fit_on in ("self", "holdout"):
        return ("fit_source", "n_fit", "repeat") if fit_source == "pool" else ("fit_source", "fit_fraction", "repeat")
    return ()


@dataclass(frozen=True)
class _RawEraser:
    name: Any = None
    options: Any = ABSENT
    fit_on: Any = ABSENT
    fit_source: Any = None


@dataclass(frozen=True)
class _RawDataset:
    zscore: Any = False
    zscore_order: Any = None


def hashed_eraser(section: dict[str, Any], dataset: Any) -> dict[str, Any]:
    """The eraser section (of a semantic config) as the job hash covers it; `dataset`: the dataset section."""
    eraser = raw_view(_RawEraser, section)
    if isinstance(eraser.options, dict):  # the options that change the erased data: all but its `runtime_options`
        runtime = eraser_traits(str(eraser.name)).runtime_options if str(eraser.name) in ERASERS else ()
        section["options"] = {k: v for k, v in eraser.options.items() if k not in runtime}
    if eraser.fit_on is not ABSENT:  # keys the fitting mode does not read: not hashed
        used = fit_keys_used(eraser.fit_on, eraser.fit_source)
        section = {k: v for k, v in section.items() if k not in FIT_KEYS or k in used}
    if not batch_erasing(str(eraser.name), dataset):
        section.pop("after_augment", None)  # nothing is erased per batch: the key changes nothing
    return section


def batch_erasing(name: str, dataset: Any) -> bool:
    """Whether `eraser.after_augment` can change a job's numbers: not for an eraser that edits the dataset once nor
    for the identity control, unless a z-score follows it per batch (`dataset.zscore_order=after`)."""
    if name not in ERASERS:
        return True
    traits = eraser_traits(name)
    if not traits.has_map:
        return False
    if not traits.identity:
        return True
    if not isinstance(dataset, Mapping):
        return False
    view = raw_view(_RawDataset, dataset)
    return bool(view.zscore) and view.zscore_order == "after"


def check_eraser_options(name: str, options: Mapping[str, Any]) -> None:
    """Eraser options are the fields of its options dataclass (`eraser_traits(name).options`: its fitter's keyword
    arguments or the dataclass it declares), checked against their types."""
    known = default_options(name)
    for k in options:
        if k not in known:
            raise ConfigError(f"eraser.options.{k} is not allowed: not an option of eraser {name}; known: "
                              f"{', '.join(sorted(known))}")
    try:
        hints = typing.get_type_hints(eraser_traits(name).options)
    except (NameError, TypeError):  # an annotation that does not resolve: checked by name only
        hints = {}
    for k, v in options.items():
        if k in hints and isinstance(x := check_typed(f"eraser.options.{k}", v, hints[k]), (int, float)) and x < 0:
            raise ConfigError(f"eraser.options.{k}={shown(v)} is not allowed: every number an eraser takes (a "
                              f"tolerance, rank, count, weight or seed) is ≥ 0; leave it at {shown(known[k])}")
    unread = eraser_traits(name).unread_option(options)
    if unread is not None:  # hashed, not read: it would change the job's hash, not its numbers
        key, when, values = unread
        here = {**known, **options}[when]
        raise ConfigError(f"eraser.options.{key}={shown(options[key])} is not allowed: eraser {name} reads {key} only "
                          f"with eraser.options.{when}={' or '.join(map(shown, values))} (here {shown(here)}); leave "
                          f"it at {shown(known[key])} or set eraser.options.{when}={shown(values[0])}")


def check_eraser_fitting(values: Mapping[str, Any]) -> None:
    name, fit_on = values["name"], values["fit_on"]
    meta = ERASERS.meta(name)
    if meta["kind"] == "edit" and fit_on != "all":
        raise ConfigError(f"eraser.fit_on={fit_on} is not allowed: eraser {name} edits each sample and has no map "
                          "to apply to other data; use eraser.fit_on=all")
    if fit_on == "self" and values["fit_source"] == "pool":
        raise ConfigError("eraser.fit_source=pool is not allowed with eraser.fit_on=self: self fits on the coded rows, "
                          "which pool does not shrink (that is eraser.fit_on=all); use eraser.fit_source=split")
    if fit_on in ("oracle", "population") and "from_moments" not in meta:
        able = ", ".join(e.name for e in ERASERS if "from_moments" in e.meta)
        streamed = "streamed " if fit_on == "oracle" else ""
        raise ConfigError(f"eraser.fit_on={fit_on} is not allowed: eraser {name} cannot be fitted from {streamed}"
                          f"moments; use one of {able}")
    if fit_on in ("oracle", "population") and values["after_augment"]:
        raise ConfigError(f"eraser.after_augment=true is not allowed with eraser.fit_on={fit_on} (generator data is "
                          "not augmented); use eraser.after_augment=false")
    if fit_on == "population" and values["fit_source"] == "pool":
        raise ConfigError("eraser.fit_source=pool is not allowed with eraser.fit_on=population: population codes the "
                          "rows a split's self and holdout code; use eraser.fit_source=split")
    if values["fit_labels"] == "shuffled":
        if fit_on in ("oracle", "population"):
            raise ConfigError(f"eraser.fit_labels=shuffled is not allowed with eraser.fit_on={fit_on}: it shuffles the "
                              "labels of fit rows, which this mode has none of; use eraser.fit_on=self, holdout or all")
        if meta["kind"] == "edit" or eraser_traits(name).identity:
            raise ConfigError(f"eraser.fit_labels=shuffled is not allowed with eraser={name}: it fits no map to apply "
                              "to the true-label data; use a fitted map eraser (leace, qleace, alf_qleace)")


def check_fit_data(fit_on: str, fit_source: str, n_fit: int | None, dataset: DatasetCfg, permute_labels: bool) -> None:
    """The fitting modes that need a kind of dataset (`dataset.name`, its `options`): oracle a generator (fresh draws),
    pool a `dataset.limit`; and a generator's draw must fit in memory."""
    name, limit = dataset.name, dataset.limit
    if fit_on in ("oracle", "population") and not dataset_traits(name).generator:
        generators = ", ".join(n for n in DATASETS.names() if dataset_traits(n).generator)
        need = "fresh draws need" if fit_on == "oracle" else "exact class statistics need"
        raise ConfigError(f"eraser.fit_on={fit_on} is not allowed: dataset {name} is not a generator ({need} "
                          f"one: {generators}); use eraser.fit_on=holdout or all")
    if fit_on in ("oracle", "population") and permute_labels:
        raise ConfigError(f"dataset.permute_labels=true is not allowed with eraser.fit_on={fit_on} (its fit keeps "
                          "the true labels, so the null would fit one law and code another); use "
                          "eraser.fit_on=holdout or all for the null")
    if fit_on == "oracle" and n_fit is not None and n_fit < 2:
        raise ConfigError(f"eraser.n_fit={n_fit} is not allowed with eraser.fit_on=oracle: the fit needs at least 2 "
                          "rows of every class (their means and covariances); set eraser.n_fit ≥ 2, or null "
                          "(200 rows per class and input dimension)")
    check_generated_size(name, dataset.options)
    if fit_on in ("self", "holdout") and fit_source == "pool" and limit is None:
        raise ConfigError("eraser.fit_source=pool is not allowed: the pool is the rows beyond dataset.limit, which is "
                          "not set; set dataset.limit (e.g. dataset.limit=20000) or use eraser.fit_source=split")
