"""Every key a job hashes is read, for every eraser: the generic walk of tests/test_task_keys.py
over the registered erasers (and their conf/eraser variants), at the data level (no training).

Every hashed `eraser.*` leaf (the options included) of a small MDL job, checked, prechecked and prepared up to the
tensors it trains and codes on (`_seen`), is set to another value. Where that changes the hash, the job must refuse
it in one line (ConfigError, "is not allowed"), or a sweep over both values must be refused (`duplicate_jobs`: a key
hashed for compatibility that changes nothing for this job), or those tensors must differ. The variants share the
base's cache, as a sweep's jobs do: a cache key that ignored the key would show it dead.

Some keys bind only on some data (QLEACE's coupling seed fills singular classes only): each eraser is walked over the
data bases DATA (they differ in the data only), and a key that changes nothing on one of them passes where another
shows it read. The fitting keys (`eraser.fit_*`, `repeat`, `n_fit`) are the harness's: walked over every mode of
FIT_ON with one eraser.
"""

from __future__ import annotations

import copy
import functools
import hashlib
from pathlib import Path
from typing import Any

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, OmegaConf

from erasure.registry import ERASERS
from erasure.traits import eraser_traits
from tests.helpers import CONF, job_config
from tests.test_task_keys import _other
from training.app.schema import FIT_ON, ConfigError, duplicate_jobs, flatten
from training.app.tasks import job_hash, job_semantic, load_job, spec_of
from training.inputs.pipeline import prepare_inputs
from training.inputs.store import Store
from training.tasks.mdl.refusals import CPU, precheck

# The data bases: a gaussian wider than a Lanczos run (ALF-QLEACE's seed and eig_rtol bind above 64 dimensions) with
# full-rank classes, and the digits (pixels in [0, 1], for gradient erasure; classes singular where QLEACE's coupling
# keys bind). Two blocks, no certificate: only the erased tensors are compared.
QUICK = ["mdl=quick", "mdl.num_blocks=2", "certificate=false"]
DATA = {"gaussian": ["dataset=gaussian", "dataset.num_classes=3", "dataset.dim=72", "dataset.rows_per_dim=2", *QUICK],
        "digits": ["dataset=digits", *QUICK]}
# Options made cheap (so that each of the walk's fits takes milliseconds), per eraser.
CHEAP = {"gradient": ["eraser.options.iterations=12", "eraser.options.progress=false", "dataset.limit=500"]}
# Another value where the generic rule (tests/test_task_keys.py `_other`: flip a bool, ×0.5 a float, +1 an int) does
# not fit or would not bind on these small data (a Lanczos run of 64 steps is exact in 6 dimensions either way).
OTHER: dict[str, Any] = {
    "eraser.options.rank": 1, "eraser.options.max_rank": 1, "eraser.options.rtol": 0.5,
    "eraser.options.leace_rtol": 0.5, "eraser.options.lanczos_steps": 2, "eraser.options.eig_rtol": 0.5,
    "eraser.options.stop_norm": "frobenius", "eraser.options.rank_deficient": "truncate",
    "eraser.options.class_rtol": 0.5, "eraser.options.support_rtol": 0.5, "eraser.options.null_rtol": 0.5,
    "eraser.options.objective_rtol": 0.5, "eraser.options.tol": 0.5, "eraser.options.max_iter": 1,
    "eraser.options.quantize_mode": "truncate", "eraser.options.loss": "norm", "eraser.options.dtype": "float32",
    "eraser.options.iterations": 2, "eraser.options.history_size": 1, "eraser.options.logit_eps": 0.1,
    "eraser.n_fit": 20, "eraser.fit_source": "pool",
}
SKIP = {"eraser.name": "another eraser altogether (walked as its own)"}
# The fitting modes that fit on rows other than all of them, each with what it needs (pool: rows beyond the limit).
FIT_BASES = {
    "holdout": ["eraser.fit_on=holdout"],
    "holdout_pool": ["eraser.fit_on=holdout", "eraser.fit_source=pool", "dataset.limit=240"],
    "self": ["eraser.fit_on=self"],
    "oracle": ["eraser.fit_on=oracle"],
    "population": ["eraser.fit_on=population"],
}
FIT_ERASER = "leace"


def _value(key: str, value: Any) -> Any:
    """Another value for `key`: OTHER's, else the generic rule's (parsed as Hydra parses the override)."""
    if key in OTHER:
        return OTHER[key]
    override = _other("mdl", key, value)
    assert override is not None and override.startswith("++"), (key, override)
    (parsed,) = OverridesParser.create().parse_overrides([override])
    return parsed.value()


def _set(cfg: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    out = copy.deepcopy(cfg)
    node = out
    *path, last = key.split(".")
    for part in path:
        node = node[part]
    node[last] = value
    return out


def _seen(cfg: dict[str, Any]) -> str:
    """A digest of what the job codes and trains on: its coded labels, the erased images, and the training batches'
    images as the batch eraser erases them (`eraser.after_augment`: per batch, from the unerased images)."""
    job = load_job(cfg)
    data = precheck(job, CPU)
    inputs = prepare_inputs(job, Store.of(job.paths), data)
    coded, x, batches = inputs.data, inputs.x, inputs.batches
    trained = x if batches is None else batches.transform(batches.raw, coded.y)
    h = hashlib.sha256()
    for t in (coded.y, x, trained):
        h.update(t.detach().contiguous().numpy().tobytes())
    return h.hexdigest()


def _outcome(base: dict[str, Any], cfg: dict[str, Any], key: str, base_seen: str | None = None) -> str:
    """unhashed | refused | duplicate (a sweep over both is refused) | read | dead (`base_seen`: `_seen(base)`)."""
    if job_hash(cfg) == job_hash(base):
        return "unhashed"
    try:
        seen = _seen(cfg)
    except ConfigError as err:
        line = str(err)
        assert "\n" not in line and "is not allowed" in line, line
        return "refused"
    same = seen == (base_seen or _seen(base))
    pair = [(0, base, spec_of(base)), (1, cfg, spec_of(cfg))]
    if duplicate_jobs(pair) is not None:  # a sweep over both is refused: they must be the same
        assert same, f"a sweep over {key} is refused although it changes the erased data"
        return "duplicate"
    return "dead" if same else "read"


def _walk(choice: str, bases: dict[str, list[str]], tmp_path: Path, keys: set[str] | None = None,
          only_fit: bool = False) -> dict[str, dict[str, str]]:
    """{key: {base: outcome}} for every hashed `eraser.*` leaf (or those in `keys`) of `eraser=<choice>` over the
    bases."""
    outcomes: dict[str, dict[str, str]] = {}
    eraser = str(_name(choice))
    for tag, given in bases.items():
        base = job_config(tmp_path / tag, [f"eraser={choice}", *CHEAP.get(eraser, []), *given,
                                           f"paths.cache_dir={tmp_path / 'cache'}"])
        try:
            seen = _seen(base)
        except ConfigError as err:  # these data refused for this eraser in one line (gradient: samples in [0, 1])
            assert "\n" not in str(err) and "is not allowed" in str(err), err
            outcomes.setdefault("(bases the eraser refuses)", {})[tag] = str(err)
            continue
        for key, value in sorted(flatten(job_semantic(base)).items()):
            if not key.startswith("eraser.") or key in SKIP or value == {} or (keys is not None and key not in keys):
                continue
            if only_fit and not key.startswith(("eraser.fit_", "eraser.repeat", "eraser.n_fit")):
                continue
            outcomes.setdefault(key, {})[tag] = _outcome(base, _set(base, key, _value(key, value)), key, seen)
    return outcomes


def _dead(outcomes: dict[str, dict[str, str]]) -> list[str]:
    """Keys dead on some base and read on none (read on one base: the data decide where it binds)."""
    return [f"{k} ({', '.join(b for b, o in by.items() if o == 'dead')})" for k, by in outcomes.items()
            if "dead" in by.values() and "read" not in by.values()]


def _name(choice: str) -> str | None:
    """The eraser an `eraser=<choice>` config names (its own `name`, else its parent's: qleace_paper -> qleace)."""
    node = OmegaConf.load(CONF / "eraser" / f"{choice}.yaml")
    assert isinstance(node, DictConfig)
    if "name" in node:
        return str(node["name"])
    parents = [d for d in node.get("defaults", []) if d != "_self_"]
    return _name(str(parents[0])) if parents else None


def _choices(eraser: str) -> list[str]:
    """The `eraser=` choices (conf/eraser/*.yaml) of registered eraser `eraser`: its own and its variants
    (qleace_paper: rank_deficient=shrinkage, which reads other options)."""
    return sorted(p.stem for p in (CONF / "eraser").glob("*.yaml") if _name(p.stem) == eraser)


@pytest.mark.parametrize("eraser", ERASERS.names())
def test_every_hashed_eraser_key_is_read_or_refused(eraser: str, tmp_path: Path) -> None:
    choices = _choices(eraser)
    assert eraser in choices, f"registered eraser {eraser} has no conf/eraser/{eraser}.yaml"
    for choice in choices:
        outcomes = _walk(choice, DATA, tmp_path / choice)
        assert outcomes, f"eraser={choice}: no hashed eraser key walked"
        assert not _dead(outcomes), f"eraser={choice}: keys that change the hash but not the erased data: " \
            f"{_dead(outcomes)} (all outcomes: {outcomes})"
        if eraser_traits(eraser).defaults():  # an eraser with options reads some of them
            assert any("read" in by.values() for by in outcomes.values()), outcomes


def test_every_hashed_fitting_key_is_read_or_refused(tmp_path: Path) -> None:
    outcomes = _walk(FIT_ERASER, {m: [*DATA["gaussian"], *extra] for m, extra in FIT_BASES.items()}, tmp_path,
                     only_fit=True)
    assert {m for m in FIT_ON if m != "all"} <= {b.split("_")[0] for b in FIT_BASES}, "a fitting mode not walked"
    assert {"eraser.fit_fraction", "eraser.repeat", "eraser.n_fit", "eraser.fit_source"} <= set(outcomes), outcomes
    assert not _dead(outcomes), f"fitting keys that change the hash but not the erased data: {_dead(outcomes)} " \
        f"(all outcomes: {outcomes})"


def test_the_walk_catches_a_dead_key(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk fails on a hashed option that changes nothing: LEACE's rtol, were the fitter to ignore it."""
    entry = ERASERS.entry("leace")

    @functools.wraps(entry.obj)
    def ignoring_rtol(*args: Any, rtol: float | None = None, **kwargs: Any) -> Any:
        return entry.obj(*args, **kwargs)

    meta = {**entry.meta, "needs_labels": False}  # what the fitter's return annotation says
    monkeypatch.setitem(ERASERS._entries, "leace", type(entry)(entry.name, ignoring_rtol, meta, entry.declared))
    outcomes = _walk("leace", DATA, tmp_path, keys={"eraser.options.rtol"})
    assert set(outcomes["eraser.options.rtol"].values()) == {"dead"}, outcomes
    assert _dead(outcomes) and _dead(outcomes)[0].startswith("eraser.options.rtol ("), outcomes


def test_fit_rows_are_what_the_walk_compares(tmp_path: Path) -> None:
    """The walk's digest sees the rows coded: another holdout split (eraser.repeat) codes other rows."""
    base = job_config(tmp_path, ["eraser=leace", *DATA["gaussian"], *FIT_BASES["holdout"]])
    assert _seen(base) == _seen(copy.deepcopy(base))
    assert _seen(_set(base, "eraser.repeat", 1)) != _seen(base)


@pytest.mark.parametrize(("overrides", "refused"), [
    (["eraser=qleace", "eraser.options.ridge=0.001"], "ridge"),  # coupling
    (["eraser=qleace", "eraser.options.rank_deficient=ridge", "eraser.options.ridge=0.001"], None),
    (["eraser=qleace_paper", "eraser.options.seed=1"], "seed"),  # shrinkage reads tol, max_iter and anderson only
    (["eraser=qleace_paper", "eraser.options.class_rtol=0.5"], "class_rtol"),
    (["eraser=qleace", "eraser.options.rank_deficient=truncate", "eraser.options.class_rtol=0.5"], None),
    (["eraser=qleace", "eraser.options.rank_deficient=truncate", "eraser.options.null_rtol=0.5"], "null_rtol"),
    (["eraser=qleace", "eraser.options.null_rtol=0.5"], None),
    (["eraser=qleace_paper", "eraser.options.ridge=1e-6"], None),  # its default (the yaml's value): accepted
    (["eraser=gradient", "eraser.options.quantize_mode=truncate"], "quantize_mode"),
    (["eraser=gradient_paper"], None),  # quantize=true, quantize_mode=truncate
])
def test_an_eraser_option_is_refused_only_where_it_is_not_read(tmp_path: Path, overrides: list[str],
                                                               refused: str | None) -> None:
    cfg = job_config(tmp_path, [*DATA["digits"], *overrides])
    if refused is None:
        load_job(cfg)
        return
    says = rf"^eraser\.options\.{refused}=\S+ is not allowed: eraser \w+ reads {refused} only with "
    with pytest.raises(ConfigError, match=says + r"eraser\.options\.\w+=\S+ .*; leave it at \S+ or set "):
        load_job(cfg)


def test_qleace_ridge_is_read_with_rank_deficient_ridge(tmp_path: Path) -> None:
    """Where the ridge is accepted, it changes the erased data (the digits' classes are singular)."""
    base = job_config(tmp_path, ["eraser=qleace", "eraser.options.rank_deficient=ridge", *DATA["digits"],
                                 f"paths.cache_dir={tmp_path / 'cache'}"])
    assert _outcome(base, _set(base, "eraser.options.ridge", 0.1), "eraser.options.ridge") == "read"
