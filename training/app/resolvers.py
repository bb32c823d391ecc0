"""The OmegaConf resolvers conf/ uses, registered when the `training` package is imported: `${cell_hash:}` (here:
it hashes the job's config as its task's), `${first_seed:}` (training/common/cells.py) and the plain ones of
training/common/conf.py (`suffix`, `eraser_family`)."""

from __future__ import annotations

from typing import Any

from omegaconf import DictConfig, OmegaConf

from training.app.schema import NON_CONFIG_KEYS
from training.app.tasks import job_cell_hash
from training.common.cells import first_seed
from training.common.conf import eraser_family, suffix


def _cell_hash(*, _root_: DictConfig) -> str:
    """`${cell_hash:}`: 8 hex digits of the job's semantic config without the seed (training/app/schema.py)."""
    plain: dict[str, Any] = {}
    for key in _root_:
        if key in NON_CONFIG_KEYS or key == "paths":
            continue
        node = _root_[key]
        plain[str(key)] = OmegaConf.to_container(node, resolve=True) if isinstance(node, DictConfig) else node
    return job_cell_hash(plain)  # the edge: the config's task named by its `task` key


def register() -> None:
    for name, fn in (("suffix", suffix), ("eraser_family", eraser_family), ("cell_hash", _cell_hash),
                     ("first_seed", first_seed)):
        if not OmegaConf.has_resolver(name):
            OmegaConf.register_new_resolver(name, fn)
