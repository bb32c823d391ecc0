"""A lockstep group's state (training/engine/group.py): each member's training state (`LockstepMember`: epoch,
early stopping, curve, result) and the live members' drawn epochs and batch cursors (`_Plan`).

Per step the host does the same few operations whatever the number of rows: the batch cursors live in the plan as
one device vector and one host (numpy) vector, and which rows end an epoch or validate is found with one vectorised
comparison (no per-member Python in the step)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from training.engine.batches import DeviceData, augment_pad, draw_epoch, host_copy
from training.engine.fit import FitResult, Member, to_device
from training.engine.stopping import EarlyStopping


def _name(member: Member, index: int) -> str:
    return member.name or f"model {index}"


@dataclass
class LockstepMember:
    """One member's training state while its group runs: what `fit` keeps in local variables. Its best
    state is kept by the engine (stacked per row by the stacked engine); the step count is the group's."""

    index: int  # position in the group's member list (`on_finish`'s k)
    spec: Member  # model, optimizer, generator (batch order + augmentation), config, validation indices
    idx: Tensor  # training subset, on the data's device
    steps_per_epoch: int
    stopper: EarlyStopping  # best loss and epoch, patience bookkeeping
    epoch: int = 1
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, validation loss)
    host_idx: np.ndarray | None = None  # the training subset on the host (read once where labels are needed)
    stop_reason: str = ""
    result: FitResult | None = None  # set when it finishes

    @classmethod
    def start(cls, index: int, spec: Member, device: torch.device) -> LockstepMember:
        idx = spec.idx.to(device)
        if len(idx) == 0:
            raise ValueError("cannot fit on an empty training set")
        spe = math.ceil(len(idx) / spec.cfg.batch_size)
        return cls(index, spec, idx, spe, spec.cfg.stopper(spe))

    @property
    def size(self) -> int:
        return len(self.idx)

    @property
    def name(self) -> str:
        return _name(self.spec, self.index)

    def state_dict(self) -> dict:
        return {"size": self.size, "epoch": self.epoch,
                "stopper": dataclasses.asdict(self.stopper),
                "curve": list(self.curve), "gen": self.spec.gen.get_state()}

    def load_state_dict(self, saved: dict) -> None:
        self.epoch = int(saved["epoch"])
        self.stopper = EarlyStopping(**saved["stopper"])
        self.curve = [(int(s), float(v)) for s, v in saved["curve"]]
        self.spec.gen.set_state(saved["gen"])

    @property
    def validates_per_epoch(self) -> bool:
        return not self.spec.cfg.eval_every_steps

    def record(self, step: int, loss: float) -> None:
        self.curve.append((step, loss))
        self.stopper.record(loss, self.epoch)

    def end_epoch(self, step: int) -> bool:
        """The current epoch ended after `step` steps: True when training stops here, else the next epoch starts."""
        reason = self.stopper.end_epoch(self.epoch, step)
        if reason is None:
            self.epoch += 1
            return False
        self.stop_reason = reason
        return True

    def finish(self, step: int, seconds: float) -> FitResult:
        s = self.stopper
        self.result = FitResult(s.best_loss, s.best_epoch, self.epoch, step, self.curve, seconds, self.stop_reason)
        return self.result


class _Plan:
    """Each live member's (row's) epoch: its global sample indices, sample weights (0 = padding) and
    augmentation, padded to the longest epoch; `cursor` is the batch number within the epoch per row, on the device
    and (`batches`) on the host. With a label-dependent batch transform the host keeps the drawn indices too
    (`host_idx`), so that each step's class segments come from the host's labels (`y_host`)."""

    def __init__(self, live: Sequence[LockstepMember], data: DeviceData, y_host: np.ndarray | None = None) -> None:
        dev = data.device
        self.data, self.dev, self.y_host = data, dev, y_host
        cfg = live[0].spec.cfg
        self.augment, self.transform = cfg.augment, cfg.batch_transform
        if any(m.spec.cfg.batch_size != cfg.batch_size or m.spec.cfg.augment != self.augment
               or m.spec.cfg.batch_transform is not self.transform for m in live):
            raise ValueError("members of one group share the batch size, the augmentation flag and the batch transform")
        # The buffers below are batch-size wide: a batch larger than every member's training set (optim.batch_size
        # = 10**9) is that set, one step per epoch, so cap it there (the same batches; no 10**9-slot buffers).
        self.bs = min(cfg.batch_size, max(m.size for m in live))
        self.pad = augment_pad(data, self.augment)
        slots = max(m.steps_per_epoch for m in live) * self.bs
        self.idx = torch.stack([torch.cat([m.idx, m.idx[:1].expand(slots - m.size)]) for m in live])
        self.host_idx = None if y_host is None else host_copy(self.idx)
        self.w = torch.stack([(torch.arange(slots, device=dev) < m.size).float() for m in live])
        self.off = torch.zeros(len(live), slots, 2, dtype=torch.long, device=dev)
        self.flip = torch.zeros(len(live), slots, dtype=torch.bool, device=dev)
        self.cursor = torch.zeros(len(live), dtype=torch.long, device=dev)
        self.slot = torch.arange(self.bs, device=dev)
        # host: per row the batches taken in the current epoch, the epoch's length, its size and validation period
        self.batches = np.zeros(len(live), dtype=np.int64)
        self.spe = np.array([m.steps_per_epoch for m in live], dtype=np.int64)
        self.sizes = np.array([m.size for m in live], dtype=np.int64)
        self.every = np.array([m.spec.cfg.eval_every_steps or 0 for m in live], dtype=np.int64)
        for row, m in enumerate(live):
            self.new_epoch(m, row)

    def new_epoch(self, m: LockstepMember, row: int) -> None:
        """Member m (in `row`) starts an epoch: its batch order and augmentation drawn as `fit` draws them."""
        ep = draw_epoch(m.size, m.spec.gen, self.augment, self.pad)
        self.idx[row, :m.size] = m.idx[to_device(ep.perm, self.dev)]
        if self.host_idx is not None:
            if m.host_idx is None:
                m.host_idx = host_copy(m.idx)
            self.host_idx[row, :m.size] = m.host_idx[ep.perm.numpy()]
        if ep.offsets is not None and ep.flips is not None:
            self.off[row, :m.size] = to_device(ep.offsets, self.dev)
            self.flip[row, :m.size] = to_device(ep.flips, self.dev)
        self.batches[row] = 0

    def counts(self) -> list[int]:
        """Real samples in each row's batch this step (the loop engine's slices)."""
        return np.minimum(self.bs, self.sizes - self.batches * self.bs).tolist()

    def batch(self) -> tuple[Tensor, Tensor, Tensor]:
        """The step's batch of every row: (global indices, inputs, sample weights)."""
        pos = self.cursor[:, None] * self.bs + self.slot  # (rows, bs)
        gidx = self.idx.gather(1, pos)
        if self.augment:
            off = self.off.gather(1, pos[..., None].expand(-1, -1, 2))
            xb = self.data.batch(gidx, off, self.flip.gather(1, pos), self.pad)
        else:
            xb = self.data.batch(gidx)
        return gidx, xb, self.w.gather(1, pos)

    def labels(self) -> np.ndarray:
        """The step's labels per row (rows, bs), from the host's copies."""
        assert self.host_idx is not None and self.y_host is not None
        pos = self.batches[:, None] * self.bs + np.arange(self.bs)
        return self.y_host[np.take_along_axis(self.host_idx, pos, 1)]


    def advance(self) -> None:
        self.cursor += 1
        self.batches += 1

    def ended(self) -> list[int]:
        """Rows whose epoch ended with this step."""
        return np.flatnonzero(self.batches == self.spe).tolist()

    def validating(self, step: int) -> list[int]:
        """Rows that validate after `step` steps (`eval_every_steps`)."""
        due = (self.every > 0) & (step % np.maximum(self.every, 1) == 0)
        return np.flatnonzero(due).tolist()

    def restart(self, rows: list[int]) -> None:
        """Rows whose new epoch was drawn (`new_epoch`) read from its first batch again."""
        if rows:
            self.cursor[torch.tensor(rows, device=self.dev)] = 0

    HOST = ("batches", "spe", "sizes", "every")

    def keep(self, rows: list[int]) -> None:
        keep = torch.tensor(rows, device=self.dev)
        self.idx, self.w, self.off, self.flip, self.cursor = (t[keep] for t in (self.idx, self.w, self.off,
                                                                               self.flip, self.cursor))
        if self.host_idx is not None:
            self.host_idx = self.host_idx[rows]
        for k in self.HOST:
            setattr(self, k, getattr(self, k)[rows])

    PARTS = ("idx", "w", "off", "flip", "cursor")

    def state_dict(self) -> dict:
        """The live rows' drawn epochs and batch cursors (the batch width too: it was set by the group's first
        members, some of which may have finished since)."""
        return {"bs": self.bs, **{k: getattr(self, k).clone() for k in self.PARTS},
                "host_idx": None if self.host_idx is None else torch.from_numpy(self.host_idx.copy()),
                **{k: torch.from_numpy(getattr(self, k).copy()) for k in self.HOST}}

    def load_state_dict(self, saved: dict) -> None:
        self.bs = int(saved["bs"])
        self.slot = torch.arange(self.bs, device=self.dev)
        for k in self.PARTS:
            setattr(self, k, saved[k].to(self.dev))
        for k in self.HOST:
            setattr(self, k, saved[k].numpy().astype(np.int64))
        if self.y_host is not None:
            self.host_idx = saved["host_idx"].numpy().copy()
