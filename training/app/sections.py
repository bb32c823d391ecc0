"""The typed config sections: one frozen dataclass per config group, each field declaring its type, check, default
and whether it enters the job hash (`hash=False`). training/app/loading.py builds them from a composed config;
training/app/schema.py hashes them and is where callers import them from."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

from erasure.registry import ERASERS
from training.app.task_spec import TaskSpec
from training.app.typed import (
    NAME_ALLOWED,
    SUBPATH_ALLOWED,
    auto_or_positive_int,
    field_spec,
    flag,
    nonneg_int,
    one_of,
    path_part,
    path_refusal,
    positive_float,
    positive_int,
    spec,
    unit_interval,
)
from training.data.registry import DATASETS, dataset_traits
from training.engine.regularizers import REGULARIZERS, regularizer_traits


def _device_name(v: str) -> bool:
    kind, _, index = v.partition(":")
    return v in ("auto", "cpu", "cuda") or (kind == "cuda" and index.isdigit())


@dataclass(frozen=True, kw_only=True)
class Section:
    """A config group: frozen, typed fields read as attributes. `to_dict()` gives it back as composed (what
    result.json stores and the job hash covers)."""

    _GIVEN: ClassVar[str | None] = None  # the field holding keys kept as composed (a member's or task's options)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name.startswith("_") or field_spec(f).typed_view:
                continue
            v = getattr(self, f.name)
            if field_spec(f).omit_empty and not v:
                continue  # as composed: only the groups that carry it (dataset.paper_lr)
            out[f.name] = v.to_dict() if isinstance(v, Section) else _plain(v)
        return {**out, **_plain(getattr(self, self._GIVEN) if self._GIVEN else {})}


def _options_view() -> Any:
    """The group member's own options (a dataclass declared next to the module that registers it), typed."""
    return spec(None, typed_view=True, hash=False, compare=False, repr=False)


def _given() -> Any:
    return spec(default_factory=dict, repr=False)


@dataclass(frozen=True, kw_only=True)
class OptionsSection(Section):
    """A group whose members declare their own options (flat keys in the yaml, e.g. `arch.activation`): the
    registered options dataclass validates them and `.options` reads them typed."""

    options: Any = _options_view()
    _options: dict[str, Any] = _given()  # the option keys as composed
    _GIVEN = "_options"


@dataclass(frozen=True, kw_only=True)
class DatasetConfig(OptionsSection):
    name: str = spec(kind=str, check=lambda v: v in DATASETS.names(), allowed="a registered dataset")
    tag: str = path_part(hash=False)  # names the job directory
    augment: bool = flag(False)
    zscore: bool = flag(False)
    limit: int | None = positive_int(None, optional=True)
    zscore_order: str = one_of("before", "before", "after")  # standardise before erasure (ours) or after (paper code)
    root: str | None = spec(None, kind=str, optional=True, hash=False)  # where the files are, not what they are
    download: bool = flag(True, hash=False)
    # the paper's lr per arch: a table conf/optim interpolates into optim.lr (hashed itself), so not hashed
    paper_lr: dict[str, Any] = spec(default_factory=dict, kind=dict, omit_empty=True, hash=False)
    permute_labels: bool = spec(kind=bool, allowed="true or false")  # default: conf/config.yaml


FIT_ON = ("all", "self", "holdout", "oracle", "population")  # eraser.fit_on: how an eraser is fitted


@dataclass(frozen=True, kw_only=True)
class EraserConfig(Section):
    """An eraser and how it is fitted; the fitting keys' defaults are in conf/config.yaml."""

    name: str = spec(kind=str, check=lambda v: v in ERASERS.names(), allowed="a registered eraser")
    options: dict[str, Any] = spec(default_factory=dict, kind=dict)  # the fitter's keyword options (checked)
    fit_on: str = spec(choices=FIT_ON)
    fit_source: str = spec(choices=("split", "pool"))
    fit_fraction: float = spec(kind=(int, float), check=lambda v: 0 < v < 1, allowed="a number in (0, 1)")
    repeat: int = spec(kind=int, check=lambda v: v >= 0, allowed="an integer ≥ 0")
    n_fit: int | None = positive_int(None, optional=True)
    after_augment: bool = spec(kind=bool, allowed="true or false")
    # shuffled: fitted on permuted fit labels, applied to the true-label data (hashed only away from its default)
    fit_labels: str = one_of("coded", "coded", "shuffled", hash_default=False)


# A model's layers are Python objects, built before any memory check can weigh them (3 KiB and 0.3 ms a layer, even
# shape-only): ten million take an hour and 30 GiB before the job could refuse. The paper's grid ends at 8.
MAX_DEPTH = 1000
DEPTH_ALLOWED = f"an integer ≥ 1 and at most {MAX_DEPTH} (a deeper model takes minutes and gigabytes just to build)"


@dataclass(frozen=True, kw_only=True)
class ArchConfig(OptionsSection):
    name: str = spec(kind=str, check=lambda v: v in _archs(), allowed="a registered architecture")
    tag: str = path_part(hash=False)
    width: int = positive_int()
    depth: int = spec(kind=int, check=lambda v: 1 <= v <= MAX_DEPTH, allowed=DEPTH_ALLOWED)
    base_width: int | None = positive_int(None, optional=True)
    base_depth: int = spec(2, kind=int, check=lambda v: 1 <= v <= MAX_DEPTH, allowed=DEPTH_ALLOWED)
    parametrization: str = one_of("mup", "mup", "sp")
    # read by conf/optim (lr per eraser family): a table interpolated into optim.* (hashed themselves), so not hashed
    paper_optim: dict[str, Any] = spec(default_factory=dict, kind=dict, hash=False)


@dataclass(frozen=True, kw_only=True)
class OptimConfig(Section):
    lr: float = positive_float()
    beta1: float = unit_interval()
    beta2: float = unit_interval(0.999)
    weight_decay: float = spec(0.0, kind=(int, float), check=lambda v: v >= 0 and math.isfinite(v),
                               allowed="a finite number ≥ 0")
    warmup_steps: int = nonneg_int(0)
    batch_size: int = positive_int(128)
    depth_lr_rule: bool = flag(True)
    # schedulefree (evaluated at its averaged iterate) | adamw (evaluated as trained, with `schedule`); μP groups
    name: str = one_of("schedulefree", "schedulefree", "adamw", hash_default=False)
    schedule: str = one_of("constant", "constant", "cosine", hash_default=False)  # adamw: cosine over mdl.max_epochs


@dataclass(frozen=True, kw_only=True)
class MdlConfig(Section):
    protocol: str = one_of("prequential", "prequential", "paper")
    num_blocks: int = spec(10, kind=int, check=lambda v: v >= 2, allowed="an integer ≥ 2")
    # an integer ≥ 1, or paper_code: the public code's rule min(1024, 2·max(32, K, d)) (training/tasks/mdl/splits.py)
    min_block: Any = spec(1024, check=lambda v: v == "paper_code" or (
        isinstance(v, int) and not isinstance(v, bool) and v >= 1), allowed="an integer ≥ 1 or paper_code")
    val_size: int = positive_int(2048)
    val_frac: float = spec(0.2, kind=(int, float), check=lambda v: 0 < v < 1, allowed="a number in (0, 1)")
    patience: int = positive_int(100)
    max_epochs: int = positive_int(30000)
    eval_every_steps: int | None = positive_int(None, optional=True)
    full_run: bool = flag(True)
    calibrate_temperature: bool = flag(False)
    stop_after_warmup: bool = flag(True)  # step-aware early stopping (training/engine/stopping.py)
    min_steps: int = nonneg_int(0)
    patience_min_steps: int = nonneg_int(0)
    # backtrack: after every epoch without a new best, the best model and optimizer state again (the paper code's)
    stopping: str = one_of("patience", "patience", "backtrack", hash_default=False)
    batch_order: str = one_of("shuffled", "shuffled", "fixed", hash_default=False)  # fixed: the same order each epoch
    # once: one validation set and nested blocks for every block model | redraw (the public code's; protocol=paper
    # only): each block model draws its own validation set, training rows and scored block (splits.py `of_model`)
    split: str = one_of("once", "once", "redraw", hash_default=False)


@dataclass(frozen=True, kw_only=True)
class RegularizerConfig(OptionsSection):
    name: str = spec(kind=str, check=lambda v: v in REGULARIZERS.names(), allowed="a registered regularizer")


@dataclass(frozen=True, kw_only=True)
class LoggerConfig(Section):
    name: str = one_of("none", "none", "wandb")
    project: str = spec("erasure-mdl", kind=str)
    entity: str | None = spec(None, kind=str, optional=True)
    mode: str = one_of("offline", "offline", "online", "disabled")


@dataclass(frozen=True, kw_only=True)
class TrainingConfig(Section):
    """How models train. `precision` changes the numbers (hashed when not fp32); the other keys are speed only,
    under the numerics contract (training/engine/numerics.py): bitwise on CPU with the loop engine; on a GPU within
    a stated tolerance, bitwise run to run only with `deterministic` and the same numerics signature."""

    parallel_models: Any = auto_or_positive_int(hash=False)
    # a lockstep group's host reads which models stopped every this many steps (auto: 1 loop, 16 stacked engine)
    poll_every: Any = auto_or_positive_int(hash=False)
    engine: str = one_of("auto", "auto", "loop", "stacked", hash=False)
    workers: Any = auto_or_positive_int(hash=False)
    storage: str = one_of("auto", "auto", "float32", "float16", "uint8", hash=False)
    compile: Any = one_of(False, False, True, "default", "reduce-overhead", "max-autotune", hash=False)
    fused_optimizer: Any = one_of(False, False, True, "numba", "compile", "eager", hash=False)
    channels_last: Any = one_of("auto", "auto", True, False, hash=False)  # conv models: auto (on CUDA) | true | false
    # fp32 (TF32 off for matmul and cuDNN) | tf32 | bf16 (autocast forward, fp32 weights and optimizer state)
    precision: str = one_of("fp32", "fp32", "tf32", "bf16", hash_default=False)
    # deterministic algorithms + CUBLAS_WORKSPACE_CONFIG: GPU runs bitwise run to run (slower); recorded, not hashed
    deterministic: bool = flag(False, hash=False)


@dataclass(frozen=True, kw_only=True)
class PathsConfig(Section):
    out_dir: str = spec("outputs", kind=str)
    data_dir: str = spec("data", kind=str)
    cache_dir: str = spec("outputs/cache", kind=str)
    job_dir: str = spec("outputs/job", kind=str)
    legacy_job_dir: str | None = spec(None, kind=str, optional=True)
    # the parts of a job's path built from config: checked by typed.path_refusal, as dataset.tag and arch.tag
    cell: str | None = spec(None, kind=str, optional=True, check=lambda v: path_refusal(v, single=True) is None,
                            allowed=NAME_ALLOWED)
    job_subdir: str | None = spec(None, kind=str, optional=True, check=lambda v: path_refusal(v, single=False) is None,
                                  allowed=SUBPATH_ALLOWED)
    by_task: dict[str, Any] = spec(default_factory=dict, kind=dict, omit_empty=True,  # a job_subdir per task
                                   check=lambda v: all(isinstance(p, str) and path_refusal(p, single=False) is None
                                                       for p in v.values()),
                                   allowed=f"a group of task: job_subdir, each {SUBPATH_ALLOWED}")


@dataclass(frozen=True, kw_only=True)
class JobConfig(Section):
    task: str = spec("mdl", kind=str)  # its TaskSpec is handed to load_config (`task_spec` below)
    seed: int = nonneg_int(0)
    # the device is checked where the job runs, not here (a sweep for GPUs may be composed on a login node)
    device: str = spec("auto", kind=str, check=_device_name, allowed="auto, cpu, cuda or cuda:N (N a GPU index)",
                       hash=False)
    force: bool = flag(False, hash=False)
    experiment_name: str | None = spec(None, kind=str, optional=True, hash=False)
    progress: bool = flag(True, hash=False)
    certificate: bool = flag(True)
    # the paper's claims the preset tests (training/tasks/mdl/claims.py)
    claims: list[str] | None = spec(None, kind=list, optional=True, hash=False)
    dataset: DatasetConfig = spec(kind=DatasetConfig)
    eraser: EraserConfig = spec(kind=EraserConfig)
    arch: ArchConfig = spec(kind=ArchConfig)
    optim: OptimConfig = spec(kind=OptimConfig)
    mdl: MdlConfig = spec(kind=MdlConfig)
    regularizer: RegularizerConfig = spec(kind=RegularizerConfig)
    training: TrainingConfig = spec(kind=TrainingConfig, hash_default=False)  # its hashed keys: precision
    logger: LoggerConfig = spec(kind=LoggerConfig, hash=False)
    paths: PathsConfig = spec(kind=PathsConfig, hash=False)
    task_options: Any = _options_view()  # the task's own group (gs), typed by the task's registry entry
    _task_group: dict[str, Any] = _given()  # that group as composed, under its name
    # the task's declaration, handed to load_config with the config: what the hash and the lifecycle read of it
    task_spec: TaskSpec = spec(None, typed_view=True, hash=False, compare=False, repr=False)
    _GIVEN = "_task_group"


# ---- the architectures, looked up lazily (conf composition should not import every model) -------------------
def _archs() -> list[str]:
    from models.registry import ARCHS

    return ARCHS.names()


def _member_options(kind: str, name: str) -> type[Any] | None:
    """The options dataclass a dataset, architecture or regularizer declares in its registry entry (None: it
    takes no options of its own)."""
    if kind == "arch":
        from models.registry import arch_traits

        return arch_traits(name).options
    return (dataset_traits if kind == "dataset" else regularizer_traits)(name).options


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    return [_plain(x) for x in v] if isinstance(v, (list, tuple)) else v


# composed alongside a job's config, not part of it (`seeds`: a cell's, training/common/cells.py)
NON_CONFIG_KEYS = ("hydra", "seeds")

S = TypeVar("S", bound=Section)
GROUPS: dict[str, type[Section]] = {"dataset": DatasetConfig, "eraser": EraserConfig, "arch": ArchConfig,
                                    "optim": OptimConfig, "mdl": MdlConfig, "regularizer": RegularizerConfig,
                                    "logger": LoggerConfig, "paths": PathsConfig}
