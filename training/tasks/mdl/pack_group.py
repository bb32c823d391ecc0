"""A pack group (`hydra/launcher=packed`, `training.pack_group`): the block models of a pack's jobs in one lockstep
group, members = jobs x blocks.

The jobs of a pack differ only in seed and run one after another, each through its own lifecycle (directory, lock,
result.json, resume). Where their training data is the same for every seed (`eraser.fit_on=all`, labels neither
permuted nor shuffled for the fit), the first job to train also trains the block models of the pack's later jobs in its
own group (each member keeps its seed's init, split, batch order and validation set), and leaves their finished
models in the pack (`Pack.ahead`, training/data/shared.py: the object the packed launcher hands each job). A later
job takes its models from there, checks they were trained on exactly what it would train them on (config hash,
training rows, validation rows, data, labels, and with `eraser.after_augment` the unerased images and the batch
eraser), and codes them as if it had trained them itself; anything else it trains as alone. Per-batch erasure
(`eraser.after_augment`, every paper preset): the eraser is fitted on all rows with their labels, the same map for
every seed, so the group's members share the first job's batch eraser and unerased images and each validates on its
own seed's rows of the erased images. With the loop engine on CPU a member's arithmetic does not depend on its group,
so the numbers are bitwise those of lone jobs (tests/test_pack_group.py). The stacked engine, and any engine on a
GPU, picks kernels by the group's shape (10 vs 50 models sum in another order): there the numbers are those of lone
jobs within the numerics contract's tolerance (training/engine/numerics.py), and result.json's numerics signature
records the group size (`models_together`).

Later jobs that are done, or have progress of their own (an earlier attempt), train alone. The memory estimate says how
many jobs' models fit at once (`room`, refusals.py `jobs_that_fit`): the group has that many jobs' worth
of rows, and with more jobs than that their models wait in the group's queue, equal blocks of the jobs side by side
(training/engine/lockstep_state.py `RowSchedule`): a row whose model stops takes the next one, so the rows stay full
across the pack's jobs. If the group fails, the job's own unfinished models train again alone, so a
failure of another seed's model never becomes this job's (its own failure is then raised as it would be alone).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import torch
from torch import Tensor, nn

from training.app.lifecycle import PROGRESS_FILE
from training.app.results import RESULT_FILE
from training.app.schema import JobConfig, config_hash
from training.app.sections import TrainingConfig
from training.common import interrupt
from training.data.shared import Pack
from training.engine.batches import DeviceData
from training.engine.checkpoint import PATTERN as CHECKPOINT_PATTERN
from training.engine.fit import FitResult, Member, TrainData, snapshot
from training.engine.group import GroupOptions, fit_group
from training.engine.numerics import JobNumerics
from training.inputs.erase import BatchEraser
from training.tasks.mdl.job_paths import JobPath
from training.tasks.mdl.splits import model_name

log = logging.getLogger(__name__)
FitJob = tuple[Tensor, object, "int | None"]  # (training rows, tag, eval_every_steps), as Trainer.train_many takes
OnFinish = Callable[[int, nn.Module, FitResult], None]


class Trainer(Protocol):
    """What a pack group reads of a job's trainer (trainer.py's `Trainer` has it; this module does not
    import it, the trainer imports this one)."""

    cfg: JobConfig
    opts: TrainingConfig
    device: torch.device
    x: Tensor  # the images as given and the labels on the device (what a later seed's models must have seen)
    y: Tensor
    data: DeviceData  # `x` on the device (what the models validate on)
    train_data: DeviceData  # what the training batches are drawn from: `x`, or `raw` with eraser.after_augment
    raw: Tensor | None
    batch_transform: BatchEraser | None
    numerics: JobNumerics | None  # the job's (its signature records how its models trained)
    pack: Pack | None  # what the job shares with its pack (None: a lone job)

    def member(self, idx: Tensor, tag: object, eval_every_steps: int | None = None) -> Member: ...

    def for_seed(self, cfg: JobConfig) -> Trainer: ...

    def all_models(self) -> list[FitJob]: ...

    def group_options(self, on_finish: OnFinish) -> GroupOptions: ...


@dataclass(frozen=True)
class TrainedAhead:
    """A later job's model, trained in an earlier job's group: its best state and fit, and what it was trained on."""

    state: dict[str, Tensor]
    result: FitResult
    idx: Tensor
    val_idx: Tensor | None
    x: Tensor  # the (erased) images and labels its group trained on (the shared tensors: no copy)
    y: Tensor
    groups: frozenset[tuple[str, int]] = frozenset()  # how it trained: the numerics signature's engine, group size
    raw: Tensor | None = None  # eraser.after_augment: the unerased images its batches were drawn from ...
    batch_map: tuple[Tensor, ...] = ()  # ... and what their batch eraser is made of (`BatchEraser.tensors`)
    formats: frozenset[str] = frozenset()  # the memory format it trained in (training.channels_last)

    def fits(self, member: Member, trainer: Trainer) -> bool:
        """Whether it is exactly the model `member` would train in `trainer`'s job, on its images, labels and batches
        (its init and batch order come from the config hash, which keyed it)."""
        mine = _batch_map(trainer.batch_transform)
        return same(self.idx, member.idx) and same(self.val_idx, member.val_idx) and same(self.x, trainer.x) \
            and same(self.y, trainer.y) and same(self.raw, trainer.raw) and len(mine) == len(self.batch_map) \
            and all(same(a, b) for a, b in zip(self.batch_map, mine, strict=True))


def same(a: Tensor | None, b: Tensor | None) -> bool:
    """Both None, or the same tensor, or equal in shape, dtype and every element."""
    if a is None or b is None:
        return a is b
    return a is b or (a.shape == b.shape and a.dtype == b.dtype and torch.equal(a.cpu(), b.cpu()))


def _batch_map(transform: BatchEraser | None) -> tuple[Tensor, ...]:
    """What a job's batch eraser is made of, with its eraser's class (none without one)."""
    if transform is None:
        return ()
    kind = torch.tensor(list(type(transform.eraser).__name__.encode()), dtype=torch.uint8)
    return (kind, *transform.tensors())


def wanted(trainer: Trainer) -> bool:
    """`training.pack_group`: true, false, or auto = on a GPU, whichever engine (on CPU the loop engine's per-member
    kernels gain nothing from a larger group: tools/bench_sweep.py --pack-group measures it)."""
    flag = trainer.opts.pack_group
    if flag == "auto":
        return trainer.device.type == "cuda"
    return bool(flag)


def seed_free(cfg: JobConfig) -> str | None:
    """None when every seed of the job's configuration trains on the same data and labels, else why not."""
    if cfg.dataset.permute_labels:
        return "dataset.permute_labels draws each seed's labels"
    if cfg.eraser.fit_on != "all":
        return f"eraser.fit_on={cfg.eraser.fit_on} splits each seed's rows"
    if cfg.eraser.fit_labels == "shuffled":
        return "eraser.fit_labels=shuffled draws each seed's fit labels"
    return None


def take_trained(trainer: Trainer, jobs: Sequence[FitJob], on_finish: OnFinish) -> list[int]:
    """Report (`on_finish`) every model of `jobs` an earlier job of the pack trained for this one; returns the
    indices of the others (all of them outside a pack)."""
    pack = trainer.pack
    if pack is None or not pack.ahead:
        return list(range(len(jobs)))
    key, rest, used = config_hash(trainer.cfg), [], 0
    for k, job in enumerate(jobs):
        found = pack.take(key, _name(job[1]))
        if found is None:
            rest.append(k)
            continue
        member = trainer.member(*job)
        if not found.fits(member, trainer):
            log.warning("the %s trained ahead in this pack does not fit this job (other rows or data): trained "
                        "again", member.name)
            rest.append(k)
            continue
        member.model.load_state_dict(found.state)
        member.model.eval()
        if trainer.numerics is not None:
            trainer.numerics.note(found.groups, found.formats)
        on_finish(k, member.model, found.result)
        used += 1
    if used:
        log.info("%d of this job's %d models were trained in an earlier seed's pack group (hydra/launcher=packed, "
                 "training.pack_group)", used, len(jobs))
    return rest


@dataclass(frozen=True)
class Companion:
    """A later job of the pack whose models join this job's group."""

    seed: int
    cfg_hash: str
    trainer: Trainer
    jobs: list[FitJob]


def companions(trainer: Trainer) -> list[Companion]:
    """The pack's later jobs whose models can train in this job's group: same data for every seed, not done, no
    progress of their own; each trains all its models (`Trainer.all_models`), also where this job resumes."""
    pack, cfg = trainer.pack, trainer.cfg
    if pack is None or not wanted(trainer) or seed_free(cfg) is not None:
        return []
    out: list[Companion] = []
    for seed in pack.later(cfg.seed):
        job_dir = JobPath.sibling(cfg.paths.job_dir, seed)
        if job_dir is None:
            return []
        if not pack.same_cell(seed, str(Path(job_dir).absolute())):
            log.info("pack group: seed %d's job is another configuration (a key follows the seed, e.g. "
                     "dataset.data_seed): it trains in its own job", seed)
            continue
        if not cfg.force and _started(job_dir):
            continue
        other = dataclasses.replace(cfg, seed=seed, paths=dataclasses.replace(cfg.paths, job_dir=str(job_dir)))
        sibling = trainer.for_seed(other)
        out.append(Companion(seed, config_hash(other), sibling, sibling.all_models()))
    return out


def _started(job_dir: Path) -> bool:
    """Whether the job is done or an attempt of it saved progress (then it resumes alone, from its own files)."""
    return any((job_dir / f).exists() for f in (RESULT_FILE, PROGRESS_FILE)) or any(job_dir.glob(CHECKPOINT_PATTERN))


def train_together(trainer: Trainer, first: Member, jobs: Sequence[FitJob], others: list[Companion],
                   on_finish: OnFinish, alone: Callable[[list[FitJob], OnFinish], None], room: int) -> None:
    """This job's models (`first` built, then the rest of `jobs`) and the pack's later seeds' (`others`) in one
    lockstep group of `room` jobs' worth of rows (the others' models wait for a row); theirs are kept in the pack for
    their jobs. If the group fails, this job's unfinished models train `alone` (its own failure is raised then, as it
    would be alone)."""
    own = [first] + [trainer.member(*job) for job in jobs[1:]]
    theirs = [(c, job, m) for c in others for job, m in zip(c.jobs, members_of(c), strict=True)]
    finished: set[int] = set()

    def done(k: int, model: nn.Module, res: FitResult) -> None:
        if k < len(own):
            on_finish(k, model, res)
            finished.add(k)
        else:
            companion, job, member = theirs[k - len(own)]
            keep_for_later(companion, job, model, res, member)

    total = len(own) + len(theirs)
    rows = None if room * len(own) >= total else max(1, room) * len(own)  # None: a row each, as many as fit
    log.info("pack group: this job's %d models and %d of seed(s) %s train in one lockstep group%s", len(own),
             len(theirs), ", ".join(str(c.seed) for c in others),
             "" if rows is None else f" of {rows} rows ({room} job(s) fit in memory at once; a stopped model's row "
                                     "takes the next one)")
    try:
        fit_group(own + [m for _, _, m in theirs],  # each validates on its seed's rows of the (erased) images
                  TrainData(trainer.train_data, trainer.y, val_data=trainer.data),
                  dataclasses.replace(trainer.group_options(done), rows=rows))
    except Exception as err:  # noqa: BLE001 - any failure: this job's own models train alone (interrupts pass)
        interrupt.stop_behind(err)  # a stop torch.save turned into a RuntimeError passes too
        left = [k for k in range(len(jobs)) if k not in finished]
        log.warning("the pack group failed (%s: %s); this job's %d unfinished model(s) train alone",
                    type(err).__name__, err, len(left))
        alone([jobs[k] for k in left], lambda k, model, res: on_finish(left[k], model, res))


def members_of(companion: Companion) -> list[Member]:
    """A companion's members, named after their seed (a group's member names are unique: its checkpoint)."""
    members = [companion.trainer.member(*job) for job in companion.jobs]
    return [dataclasses.replace(m, name=f"seed {companion.seed} {m.name}") for m in members]


def keep_for_later(companion: Companion, job: FitJob, model: nn.Module, result: FitResult, member: Member) -> None:
    pack, numerics = companion.trainer.pack, companion.trainer.numerics
    assert pack is not None
    t = companion.trainer
    pack.ahead[(companion.cfg_hash, _name(job[1]))] = TrainedAhead(
        snapshot(model), result, member.idx, member.val_idx, t.x, t.y,
        frozenset() if numerics is None else numerics.trained_with(), t.raw, _batch_map(t.batch_transform),
        frozenset() if numerics is None else frozenset(numerics.formats))


def _name(tag: object) -> str:
    return model_name(tag)
