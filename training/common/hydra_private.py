"""Every use of Hydra's private API (hydra-core 1.3, pinned in pyproject.toml): what the harness needs of Hydra that
Hydra does not export. tests/test_layers.py refuses a private module of Hydra or its plugins imported elsewhere."""

from __future__ import annotations

import traceback
from collections.abc import Callable, Sequence
from contextlib import suppress
from typing import Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra.core.global_hydra import GlobalHydra
from hydra.core.override_parser.types import Override
from hydra.core.utils import JobReturn
from omegaconf import DictConfig


def split_arguments(overrides: list[Override]) -> list[list[list[str]]]:
    """The basic sweeper's jobs of the parsed overrides, in batches: each job a list of `key=value` strings."""
    return BasicSweeper.split_arguments(overrides, None)


def is_config_group() -> Callable[[str], bool]:
    """Whether a key names a config group of the initialised Hydra's repository (else an override sets a value)."""
    loader = GlobalHydra.instance().config_loader()
    assert isinstance(loader, ConfigLoaderImpl)
    return loader.repository.group_exists


def apply_value_overrides(overrides: Sequence[Override], cfg: DictConfig) -> None:
    """Hydra's own application of value overrides (`key=value`, `+key=`, `~key`) to a composed config, in place."""
    ConfigLoaderImpl._apply_overrides_to_config(list(overrides), cfg)


def wrap_run_job(wrap: Callable[[Any], Any]) -> None:
    """Hydra's `run_job` replaced, once, by `wrap(run_job)` where it is defined and in each launcher's module that
    imported it by name (Hydra's plugin scan re-executes those imports: they then find the wrapper)."""
    import hydra._internal.core_plugins.basic_launcher as basic
    import hydra.core.utils

    if getattr(hydra.core.utils.run_job, "__wrapped__", None) is None:
        hydra.core.utils.run_job = wrap(hydra.core.utils.run_job)
    basic.run_job = hydra.core.utils.run_job
    with suppress(ImportError):  # the plugin is not installed
        import hydra_plugins.hydra_joblib_launcher._core as joblib_launcher
        joblib_launcher.run_job = hydra.core.utils.run_job
    with suppress(ImportError):
        import hydra_plugins.hydra_submitit_launcher.submitit_launcher as submitit_launcher
        submitit_launcher.run_job = hydra.core.utils.run_job


def raised_by_a_job(err: BaseException) -> bool:
    """Whether Hydra raised `err` out of a job that ran (`JobReturn.return_value` re-raises the job's exception),
    rather than while reading the command line or composing the config."""
    code = JobReturn.return_value.fget.__code__  # type: ignore[attr-defined]
    return any(frame.f_code is code for frame, _ in traceback.walk_tb(err.__traceback__))
