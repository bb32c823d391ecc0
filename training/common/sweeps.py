"""Expand an experiment preset's `hydra.sweeper.params` into the job configs it will run, with Hydra's own expansion
(the basic sweeper's `split_arguments` on the preset's params followed by the command-line overrides):
`expand(name)` lists exactly the jobs of `python -m training.run -m experiment=name`. Composing needs no data (the
CIFAR/SVHN presets expand without the datasets); the `training` package's import registers conf/'s resolvers.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from hydra import compose, initialize_config_dir
from hydra.core.config_loader import ConfigLoader
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import OmegaConf

from training.common.cells import seed_configs
from training.common.conf import CONF_DIR
from training.common.hydra_private import split_arguments
from training.errors import ConfigError, first_line


def presets() -> list[str]:
    """Names of the experiment presets (conf/experiment/*.yaml)."""
    return sorted(p.stem for p in (CONF_DIR / "experiment").glob("*.yaml"))


@contextmanager
def composing() -> Iterator[None]:
    """Hydra initialised on conf/ for `compose` inside (as it is, where it already is)."""
    if GlobalHydra.instance().is_initialized():
        yield
    else:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            yield


def split_sweep(args: Sequence[str], loader: ConfigLoader | None) -> list[list[str]]:
    """The basic sweeper's override list of every job, in launch order; raises ConfigError (one line naming the
    key) for a value it cannot sweep or that sweeps over nothing (an empty range, a glob that matches no option)."""
    parser = OverridesParser.create(config_loader=loader)
    for arg in args:  # each value alone first: a bad one is named with its key, not a sweeper's traceback
        key = arg.split("=", 1)[0]
        try:
            values = split_arguments(parser.parse_overrides([arg]))
        except Exception as err:  # noqa: BLE001 - Hydra raises ValueError, HydraException, OverrideParseException
            why = first_line(err)
            raise ConfigError(f"{arg} cannot be swept ({why}): write {key}=a,b,c (a list), range(start,stop,step) "
                              "with a step that is not 0, or choice(a,b,c); interval() needs a search sweeper "
                              "plugin (e.g. Optuna), not this one") from err
        if not any(values):
            options = loader.get_group_options(key.lstrip("+~")) if loader is not None and "glob(" in arg else []
            raise ConfigError(f"{arg} sweeps over no value, so the sweep has no job: give {key} at least one value"
                              + (f" (a glob must match one of its options: {', '.join(options)})" if options else ""))
    return [list(c) for batch in split_arguments(parser.parse_overrides(list(args))) for c in batch]


def sweeper_params(experiment: str, extra: Sequence[str] = ()) -> dict[str, str]:
    """The preset's `hydra.sweeper.params` (key -> comma-separated values), unresolved; refuses a launcher that
    is gone (as `python -m training.run -m` does)."""
    parser = OverridesParser.create()
    fixed = [o.input_line for o in parser.parse_overrides(list(extra)) if not o.is_sweep_override()]
    overrides = [f"experiment={experiment}", *[f for f in fixed if f is not None]]
    with composing():
        cfg = compose("config", overrides=overrides, return_hydra_config=True)
    if (removed := OmegaConf.select(cfg, "hydra.launcher.removed", default=None)) is not None:
        raise ConfigError(str(removed))  # conf/hydra/launcher/packed.yaml
    params = OmegaConf.to_container(cfg.hydra.sweeper.params, resolve=False) or {}
    assert isinstance(params, dict)
    return {str(k): str(v) for k, v in params.items()}


def sweep_overrides(experiment: str, extra: Sequence[str] = ()) -> list[list[str]]:
    """One override list per job, in launch order: the sweeper params x `experiment=...` and `extra`
    (which may itself sweep, e.g. `seed=0,1`, and overrides a param of the same key, as on the command line)."""
    params = sweeper_params(experiment, extra)
    args = [f"{k}={v}" for k, v in params.items()] + [f"experiment={experiment}", *extra]
    with composing():
        return split_sweep(args, GlobalHydra.instance().config_loader())


def expand(experiment: str, extra: Sequence[str] = (), limit: int | None = None) -> list[dict[str, Any]]:
    """Resolved job configs (plain dicts) of every seed of every cell in the experiment's sweep (of its first `limit`
    cells: each is one Hydra compose, ~0.1 s)."""
    combos = sweep_overrides(experiment, extra)[:limit]
    jobs = []
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        for combo in combos:
            jobs += seed_configs(compose("config", overrides=combo))
    return jobs
