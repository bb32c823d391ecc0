"""An MDL job's refusals and its memory estimate: what the job checks once its data is loaded, before it takes its
directory's lock or writes anything (`precheck`): the samples suit the eraser and the architecture, the coded data can
be cut into `mdl.num_blocks` blocks, `training.storage` holds it exactly, and its data and models fit in the memory it
has (`estimate_memory`). Each refusal is one line naming the key (exit 2; a single run leaves no directory behind).

`precheck` returns the data it loaded, which the lifecycle hands to the job's body (`JobRun.loaded`), so it is
loaded once; the lifecycle does not call it for a job that already finished with this configuration (a SKIP). The
checks and the data steps are handed the config sections they read, not the whole config.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from erasure import resolve_options
from erasure.traits import eraser_traits
from models import make_spec, param_count
from models.mup_utils import on_meta
from models.registry import arch_traits
from training.app.schema import ArchConfig, ConfigError, DatasetConfig, EraserConfig, JobConfig, MdlConfig
from training.common import env
from training.data import LoadedData
from training.engine.backends import VAL_CHUNK
from training.engine.batches import compact
from training.engine.devices import available_memory
from training.engine.group import check_options, module_refusal, resolve_engine
from training.errors import Refused
from training.inputs.erase import after_augment_refusal
from training.inputs.fit_settings import fit_config
from training.inputs.plan import ALL, FitPlan, fit_plan, with_permuted_labels
from training.inputs.store import Store
from training.tasks.mdl.code import MIN_BLOCK_SAMPLES, most_blocks
from training.tasks.mdl.splits import validation_size

log = logging.getLogger(__name__)
GiB = 2**30
CPU = torch.device("cpu")
# what a model training in a row holds at most, in float32 copies of its weights, by engine (measured: docs/speed.md,
# tests/test_memory_estimate.py): the fit loop (one model at a time) and the loop engine its weights, gradients, the
# optimizer's two state tensors (schedule-free AdamW: z and the second moment), its best-so-far snapshot, the step's
# temporary (the optimizer's denominator) and what the allocator keeps for reuse (up to about one more); the stacked
# engine its module, its stacked row, z, the second moment, the best snapshot, the step's gradients and the
# temporaries of vmap's batched kernels (7.3 to 8.6 copies measured)
MODEL_COPIES = {"loop": 7, "stacked": 10}
HELD_COPIES = 1  # a model of a lockstep group not in a row: its weights (waiting, or finished with its best loaded)
# what a process adds as it trains beyond the tensors counted here (autograd's and the thread pools' buffers, the
# allocator's arenas): 20 to 60 MiB measured
WORKING_BYTES = 64 * 2**20
PLAN_BYTES_PER_SLOT = 8 + 4 + 16 + 1  # the lockstep plan per training sample: index, weight, crop offset, flip


def precheck(cfg: JobConfig, device: torch.device, data: LoadedData | None = None, store: Store | None = None,
             cell: Sequence[JobConfig] = ()) -> LoadedData:
    """Refuse (one line) a job that cannot run on its data or device, before anything is made (see the module
    docstring); returns the data it loaded, or checked: `data`, what the lifecycle's fingerprint check read again.
    `store`: its cell's (what the seeds share), else the job's own; `cell`: the configs of its cell's seeds (the memory
    estimate counts their models and data)."""
    t, e, d = cfg.training, cfg.eraser, cfg.dataset
    check_options(t.engine, t.workers, t.fused_optimizer, device, arch_traits(cfg.arch.name).vectorises)
    check_one_at_a_time(cfg)
    store = store or Store.of(cfg.paths)
    data = store.load(d) if data is None else data
    permuted = with_permuted_labels(data, d.permute_labels, cfg.seed)
    plan = fit_plan(e, d, cfg.seed, permuted, store)
    coded = None if plan is None else plan.coded_idx  # the rows the job codes (None: all), as the pipeline picks them
    n_coded = len(data.y) if coded is None else len(coded)
    check_input(d, e.name, cfg.arch, data)
    check_blocks(cfg.mdl, e.fit_on, data.name, len(data.y), n_coded)
    check_storage(t.storage, e.name, d.zscore, data, coded)
    check_after_augment(e, permuted, plan)
    check_memory(cfg, data, n_coded, device, cell)
    return data


def check_one_at_a_time(cfg: JobConfig) -> None:
    """`optim.name=adamw` and `mdl.stopping=backtrack` train through the fit loop, one model at a time (the loop
    engine's arithmetic); the stacked engine and the fused optimizer step are schedule-free AdamW kernels that never
    reload a state: asking for them is refused."""
    o, m, t = cfg.optim, cfg.mdl, cfg.training
    why = "optim.name=adamw" if o.name == "adamw" else "mdl.stopping=backtrack" if m.stopping == "backtrack" else None
    if why is None:
        return
    if t.engine == "stacked":
        raise ConfigError(f"training.engine=stacked is not allowed with {why}: the stacked engine steps schedule-free "
                          "AdamW only and never reloads a state; set training.engine=loop (or auto)")
    if t.fused_optimizer is not False:
        raise ConfigError(f"training.fused_optimizer={t.fused_optimizer} is not allowed with {why}: the fused step is "
                          "schedule-free AdamW's; set training.fused_optimizer=false")


def check_input(dataset: DatasetConfig, eraser: str, arch: ArchConfig, data: LoadedData) -> None:
    """What the samples rule out, in one line: augmentation (random crops and flips of images) of vectors, which
    would zero most of each one, an eraser that cannot take their values (`input_range`), and an architecture that
    cannot take their shape (LeNet below 4×4)."""
    c, h, w = data.input_shape
    if dataset.augment and h == 1:
        raise ConfigError(f"dataset.augment=true is not allowed with dataset={dataset.name}: its samples are "
                          f"vectors ({w} numbers) and augmentation crops and flips images; set dataset.augment=false")
    bounds = eraser_traits(eraser).input_range
    if bounds is not None and (float(data.x.min()) < bounds[0] or float(data.x.max()) > bounds[1]):
        raise ConfigError(f"eraser={eraser} is not allowed with dataset={dataset.name}: it takes "
                          f"samples in [{bounds[0]:g}, {bounds[1]:g}], these lie in [{float(data.x.min()):.3g}, "
                          f"{float(data.x.max()):.3g}]; use an image dataset or another eraser")

    try:
        on_meta(make_spec(arch, data.input_shape, data.num_classes).build)
    except ValueError as err:
        raise ConfigError(f"arch={arch.name} is not allowed with dataset={dataset.name} (samples of shape "
                          f"{c}×{h}×{w}): {err}; use arch=mlp") from err


def check_blocks(m: MdlConfig, fit_on: str, name: str, n: int, n_coded: int) -> None:
    """`mdl.num_blocks` must leave at least 2 samples a block (training/tasks/mdl/code.py `most_blocks`)."""
    n_val = validation_size(n_coded, m.val_size, m.val_frac)
    rest = n_coded - n_val
    if m.num_blocks <= most_blocks(rest):
        return
    coded = "" if n_coded == n else f", {n_coded} coded (eraser.fit_on={fit_on})"
    raise ConfigError(f"mdl.num_blocks={m.num_blocks} is not allowed: {name} has {n} samples{coded}, {rest} to code "
                      f"after {n_val} for validation: at most {most_blocks(rest)} blocks (of at least "
                      f"{MIN_BLOCK_SAMPLES} samples; mdl.min_block={m.min_block} shrinks to fit); lower "
                      "mdl.num_blocks or use more data")


def check_storage(storage: str, eraser: str, zscore: bool, data: LoadedData, coded: torch.Tensor | None) -> None:
    """`training.storage=uint8|float16` with the identity (control) eraser stores the data itself: it must hold it
    exactly. (Other erasers: the schema refuses map erasers and z-scoring up front; an edit eraser's output is
    checked when it is stored.)"""
    if storage not in ("uint8", "float16") or not eraser_traits(eraser).identity or zscore:
        return
    try:
        compact(data.x if coded is None else data.x[coded], storage)
    except ValueError:
        raise ConfigError(f"training.storage={storage!r} is not allowed: training.storage must be auto or float32 "
                          f"for {data.name} (its images are not exactly representable as {storage}, so storing them "
                          "so would change the numbers; auto keeps the smallest exact storage)") from None


def check_after_augment(e: EraserConfig, data: LoadedData, plan: FitPlan | None) -> None:
    """`eraser.after_augment=true` with an eraser whose fit may add noise (`EraserTraits.batch_noise`, QLEACE's
    coupling): refused when the fit would add it (singular classes), predicted from the fit's data (`data`, labels
    permuted for a null, fitted as `plan` says) without fitting (erasure/qleace.py `coupling_noise_ranks`: seconds,
    no barycenter). The prediction replaces the barycenter by the pooled covariance; where it misses, the fitted
    eraser is refused with the same line (training/inputs/erase.py `BatchEraser`)."""
    noise = eraser_traits(e.name).batch_noise
    if not e.after_augment or noise is None:
        return

    options = resolve_options(e.name, dict(e.options))
    if not noise.applies(options):
        return
    plan = plan or ALL
    rows = plan.fit_rows(data)  # None: oracle and population draw their own; predicted on the coded rows
    fit = plan.labelled(plan.coded(data) if rows is None else rows)
    try:
        ranks = noise.ranks(fit.x.reshape(len(fit.x), -1), fit.y, **options)
    except ValueError:
        return  # a fit fold the fit itself refuses (too few rows): its own line says so
    singular = [c for c, q in enumerate(ranks) if q > 0]
    if singular:
        raise ConfigError(after_augment_refusal(fit.name, singular))


@dataclass(frozen=True)
class MemoryEstimate:
    data: int  # the data on the device, its validation copy
    models: int  # the models trained at once, with gradients, optimizer state and best snapshot; those waiting
    batches: int  # their batch activations (forward and backward), the lockstep plan, and an evaluation's chunk
    num_models: int

    @property
    def total(self) -> int:
        return self.data + self.models + self.batches + WORKING_BYTES


def models_at_once(parallel_models: Any, models: int, not_vectorised: str | None, room: int | None = None) -> int:
    """How many of the job's `models` train together, as `Trainer.group_size` decides it: `training.parallel_models`
    (auto: all, or as many as fit in memory at once: `room`, None: no figure), 1 where the group engine cannot take
    them (`not_vectorised`)."""
    want = parallel_models
    if not_vectorised is not None:
        return 1
    if want == "auto":
        return models if room is None else max(1, min(models, room))
    return max(1, min(int(want), models))


def estimate_memory(cfg: JobConfig, data: LoadedData, n_coded: int, device: torch.device = CPU,
                    free: int | None = None, cell: Sequence[JobConfig] = ()) -> MemoryEstimate:
    """What the job holds at most at once on its device beyond what it held when it loaded its data: an upper bound of
    the measured peak (see MODEL_COPIES; tests/test_memory_estimate.py). `cell`: the configs of the seeds that train
    together (training/tasks/mdl/cell.py; none: this job alone), whose models are seeds × blocks. `free`: the memory
    the device has free (None: no figure); `training.parallel_models=auto` trains as many rows as fit in it."""
    seeds = max(1, len(cell))
    m, t = cfg.mdl, cfg.training
    n_val = validation_size(n_coded, m.val_size, m.val_frac)
    n_train = n_coded - n_val
    models = seeds * (m.num_blocks - 1 + int(m.full_run))
    params, acts, widest, model = _model_size(cfg.arch, data.input_shape, data.num_classes)
    data_bytes = _data_bytes(cfg, data, n_coded, n_val, seeds, shares_data(cfg, cell))
    numel = int(data.x[0].numel())
    batch = min(cfg.optim.batch_size, n_train)
    # a row's batch: activations of forward and backward (the loop engine holds every row's graph until its one
    # backward over the rows' summed losses, as the stacked engine holds its batched one) and its lockstep plan
    row_bytes = batch * (numel + 2 * acts) * 4 + n_train * PLAN_BYTES_PER_SLOT
    engine = resolve_engine(t.engine, device, arch_traits(cfg.arch.name).vectorises)
    # validation and coding, without gradients: a chunk of VAL_CHUNK samples through a model holds its input and about
    # three of the widest layer's outputs (a block's input, a layer's input and output); the stacked engine validates
    # a cell's seeds' rows of one block together
    eval_bytes = min(VAL_CHUNK, n_coded) * (numel + 3 * widest) * 4 * (seeds if engine == "stacked" else 1)
    # r rows hold r × MODEL_COPIES models' worth of weights and r batches, the models not in a row HELD_COPIES each
    fixed = data_bytes + eval_bytes + WORKING_BYTES + models * HELD_COPIES * params * 4
    room = None if free is None else (free - fixed) // ((MODEL_COPIES[engine] - HELD_COPIES) * params * 4 + row_bytes)
    # `why_not_vectorized` on what the config and a shape-only model tell (the optimizer is always schedule-free)
    stacked_regularizer = cfg.regularizer.name != "none" and engine == "stacked"
    why = ("a regularizer with the stacked engine" if stacked_regularizer else module_refusal(model, engine)) \
        or fit_config(cfg, 0).one_at_a_time()
    at_once = models_at_once(t.parallel_models, models, why, room)
    # a group of fewer rows than models builds them all up front; one model at a time (the fit loop) builds each as
    # it starts and lets the finished one go
    held = (models - at_once) * HELD_COPIES if at_once > 1 else 0
    copies = MODEL_COPIES[engine if at_once > 1 else "loop"]
    return MemoryEstimate(data_bytes, (at_once * copies + held) * params * 4, at_once * row_bytes + eval_bytes,
                          at_once)


def shares_data(cfg: JobConfig, cell: Sequence[JobConfig]) -> bool:
    """Whether a cell's seeds train on one copy of the data (training/tasks/mdl/cell.py `cell_data`): one dataset, the
    eraser fitted on every row with the labels coded, labels not permuted."""
    e, d = cfg.eraser, cfg.dataset
    return (e.fit_on == "all" and e.fit_labels == "coded" and not d.permute_labels
            and all(c.dataset == d for c in cell))


def _data_bytes(cfg: JobConfig, data: LoadedData, n_coded: int, n_val: int, seeds: int, shared: bool) -> int:
    """The data a job (a cell of `seeds`) adds on its device: the coded images as stored, the unerased ones the
    batches are drawn from (`eraser.after_augment`), the validation images decoded (float32); the seeds' data once
    where they share it (`shared`), else each seed's and their concatenation. A group decodes the validation images
    of each validation set its members hold: a cell's one per seed, with `mdl.split=redraw` one per model."""
    numel, e = int(data.x[0].numel()), cfg.eraser
    x = n_coded * numel * _storage_bytes(cfg.training.storage, e.name, cfg.dataset.zscore, data)
    raw = n_coded * numel * 4 if e.after_augment and not eraser_traits(e.name).identity else 0
    val = n_val * numel * 4
    models = seeds * (cfg.mdl.num_blocks - 1 + int(cfg.mdl.full_run))
    group_val = models * val if cfg.mdl.split == "redraw" else seeds * val if seeds > 1 else 0
    if seeds == 1:
        return x + raw + val + group_val
    return (x + seeds * (raw + val) if shared else seeds * (2 * x + 2 * raw + val)) + group_val


def _storage_bytes(storage: str, eraser: str, zscore: bool, data: LoadedData) -> int:
    if storage in ("uint8", "float16", "float32"):
        return {"uint8": 1, "float16": 2, "float32": 4}[storage]
    if not eraser_traits(eraser).identity or zscore:
        return 4  # erased (or standardised) data is stored as float32 (an edit eraser's may be smaller: rough)
    return compact(data.x[:256]).element_size()  # what `auto` picks, judged on a probe


def _model_size(arch: ArchConfig, input_shape: tuple[int, int, int], num_classes: int
                ) -> tuple[int, int, int, torch.nn.Module]:
    """(parameters, activation floats per sample, the widest layer's, the model) of one model, from a shape-only
    build (no memory, no RNG)."""
    model = on_meta(make_spec(arch, input_shape, num_classes).build)
    params = param_count(model)
    acts = widest = 0

    def count(module: torch.nn.Module, inputs: Any, output: Any) -> None:
        nonlocal acts, widest
        if isinstance(output, torch.Tensor):
            acts += output.numel()
            widest = max(widest, output.numel())

    hooks = [mod.register_forward_hook(count) for mod in model.modules() if not list(mod.children())]
    for mod in model.modules():
        if hasattr(mod, "width_mult"):  # a μP readout without base shapes (shape-only model): its scale is moot
            mod.width_mult = lambda: 1.0  # type: ignore[assignment]  # torch types Module.__setattr__ for tensors/modules
    try:
        with torch.no_grad():
            model(torch.zeros(1, *input_shape, device="meta"))
    except Exception as err:  # noqa: BLE001 - a model that cannot run on meta tensors: count its parameters only
        log.debug("activation estimate skipped (%s: %s)", type(err).__name__, err)
        acts = widest = 0
    finally:
        for h in hooks:
            h.remove()
    return params, acts, widest, model


def _size(n: float) -> str:
    if n >= 0.1 * GiB:
        return f"{n / GiB:.1f} GiB"
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 2**10:.0f} KiB"


def memory_free(device: torch.device) -> int | None:
    """What the memory estimate compares with: the device's free memory (None: no figure, or the check is off)."""
    return available_memory(device) if env.memory_check() else None


def check_memory(cfg: JobConfig, data: LoadedData, n_coded: int, device: torch.device,
                 cell: Sequence[JobConfig] = ()) -> None:
    """Refuse a job (its cell: `cell`, the seeds that train together) whose data and models cannot fit in the memory
    its device has free (`available_memory`); `ERASURE_MDL_MEMORY_CHECK=0` skips the check."""
    if not env.memory_check():
        return
    free = available_memory(device)
    if free is None:
        return
    est = estimate_memory(cfg, data, n_coded, device, free, cell)
    if est.total <= free:
        return
    where = "the machine has" if device.type == "cpu" else f"{device} has"
    models = f"{est.num_models} model{'s' if est.num_models > 1 else ''}"  # parallel_models=auto: as many as fit
    what = "this job" if len(cell) < 2 else f"this cell ({len(cell)} seeds)"
    raise Refused(f"{what} needs about {_size(est.total)} (data {_size(est.data)}, {models} "
                  f"{_size(est.models)}, batches {_size(est.batches)}, working memory {_size(WORKING_BYTES)}) but "
                  f"{where} {_size(free)} available: lower optim.batch_size, training.parallel_models, arch.width or "
                  f"arch.depth, use dataset.limit, or run it where more memory is free ({env.MEMORY_CHECK}=0 skips "
                  "this rough check)")
