"""A cell: one configuration and its seeds, the unit a job runs (conf/config.yaml `seeds`, `seed`).

A composed config names its cell's seeds with `seeds` (a count n: seeds 0..n-1; or a list) while `seed` keeps its
default `${first_seed:${seeds}}`; a `seed` given a value (`seed=3`, a sweep's `-m seed=0,1,2`) makes a one-seed cell.
`seed_configs` resolves the config once per seed, as that seed's job (its `paths.job_dir` .../c<cell hash>/seed<k>,
its hash): exactly the job a one-seed cell of it would run.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf, open_dict

from training.common.conf import resolved_dict
from training.errors import ConfigError

SEEDS_HINT = ("seeds must be a count n ≥ 1 (seeds 0..n-1) or a list of distinct integers ≥ 0, e.g. seeds=5 or "
              "seeds=[0,3]")


def seed_list(seeds: Any) -> list[int]:
    """`seeds` as the cell's seeds: a count n -> 0..n-1, a list as given; ConfigError (one line) otherwise."""
    if isinstance(seeds, ListConfig):
        seeds = list(seeds)
    if isinstance(seeds, int) and not isinstance(seeds, bool):
        if seeds < 1:
            raise ConfigError(f"seeds={seeds} is not allowed: {SEEDS_HINT}")
        return list(range(seeds))
    if isinstance(seeds, list | tuple) and seeds and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                          for s in seeds) and len(set(seeds)) == len(seeds):
        return [int(s) for s in seeds]
    raise ConfigError(f"seeds={seeds!r} is not allowed: {SEEDS_HINT}")


def first_seed(seeds: Any) -> int:
    """`${first_seed:${seeds}}`: `seed` of a cell's config before it is resolved per seed (its first seed). A bad
    `seeds` gives 0 here, where Hydra resolves its run directory (an error there is Hydra's traceback): the job
    refuses it in one line when it lists its seeds (`cell_seeds`)."""
    try:
        return seed_list(seeds)[0]
    except ConfigError:
        return 0


def cell_seeds(cfg: DictConfig) -> list[int]:
    """The seeds of a composed config's cell: [seed] where `seed` was given a value, else its `seeds`."""
    if "seed" in cfg and not OmegaConf.is_interpolation(cfg, "seed"):
        return [cfg.seed]
    return seed_list(cfg.seeds if "seeds" in cfg else 1)


@contextmanager
def as_seed(cfg: DictConfig, seed: int) -> Iterator[DictConfig]:
    """`cfg` with `seed` set to `seed` inside (its interpolations resolve as that seed's job), restored after."""
    node = cfg._get_node("seed")
    before = node._value() if node is not None else None
    with open_dict(cfg):
        cfg.seed = seed
    try:
        yield cfg
    finally:
        with open_dict(cfg):
            if node is None:
                del cfg["seed"]
            else:
                cfg.seed = before


def seed_configs(cfg: DictConfig) -> list[dict[str, Any]]:
    """One resolved job config (a plain dict, without `hydra`) per seed of the cell of the composed `cfg`."""
    out = []
    for seed in cell_seeds(cfg):
        with as_seed(cfg, seed):
            resolved = resolved_dict(cfg)
        resolved.pop("hydra", None)
        out.append(resolved)
    return out


def seed_job_dirs(cfg: DictConfig) -> list[str]:
    """`paths.job_dir` of every seed of the cell of `cfg` (a Hydra job's config: `hydra` is left unresolved)."""
    dirs = []
    for seed in cell_seeds(cfg):
        with as_seed(cfg, seed):
            dirs.append(str(OmegaConf.select(cfg, "paths.job_dir", default="")))
    return dirs
