"""A lockstep group's state (training/engine/group.py): each member's training state (`LockstepMember`), the live
members' drawn epochs and batch cursors (`_Plan`) and which member holds each row (`RowSchedule`). Per step the host
does the same few operations whatever the number of rows (the cursors are one device and one host vector).
"""

from __future__ import annotations

import dataclasses
import math
from collections import deque
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
    """One member's training state while its group runs: what `fit` keeps in local variables (its best state is the
    engine's). Its own step count is the group's step minus `first_step`."""

    index: int  # position in the group's member list (`on_finish`'s k)
    spec: Member  # model, optimizer, generator (batch order + augmentation), config, validation indices
    idx: Tensor  # training subset, on the data's device
    steps_per_epoch: int
    stopper: EarlyStopping  # best loss and epoch, patience bookkeeping
    epoch: int = 1
    curve: list[tuple[int, float]] = field(default_factory=list)  # (step, validation loss)
    host_idx: np.ndarray | None = None  # `host()`
    stop_reason: str = ""
    stop_step: int = 0  # its own steps when it stopped (read from the group's RowStopping)
    result: FitResult | None = None  # set when it finishes
    first_step: int = 0  # the group's step when this member took its row
    started_s: float = 0.0  # the group's elapsed seconds then

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
        return {"size": self.size, "epoch": self.epoch, "first_step": self.first_step, "started_s": self.started_s,
                "stopper": dataclasses.asdict(self.stopper),
                "curve": list(self.curve), "gen": self.spec.gen.get_state()}

    def load_state_dict(self, saved: dict) -> None:
        self.epoch, self.first_step = int(saved["epoch"]), int(saved["first_step"])
        self.started_s = float(saved["started_s"])
        self.stopper = EarlyStopping(**saved["stopper"])
        self.curve = [(int(s), float(v)) for s, v in saved["curve"]]
        self.spec.gen.set_state(saved["gen"])

    def host(self) -> np.ndarray:
        """The training subset on the host (read once, where labels are needed)."""
        if self.host_idx is None:
            self.host_idx = host_copy(self.idx)
        return self.host_idx

    def finish(self, elapsed: float) -> FitResult:
        """Its result (its stop polled: best loss and epoch, epochs, steps, reason), `elapsed` seconds into the
        group."""
        s = self.stopper
        self.result = FitResult(s.best_loss, s.best_epoch, self.epoch, self.stop_step, self.curve,
                                elapsed - self.started_s, self.stop_reason)
        return self.result


class RowSchedule:
    """Which members hold the group's `rows` rows: with fewer rows than members, the largest training sets start and
    the others queue, largest first (equal sets side by side: they validate at the same steps), a stopped member's
    row taking the next one; else the members' own order. Counts the row-steps that did work (`occupancy` = work /
    (rows × steps)) and the steps with a validation (`validations`: each one validation call of the engine)."""

    def __init__(self, sizes: Sequence[int], rows: int | None = None) -> None:
        n = len(sizes)
        self.rows = n if rows is None else max(1, min(int(rows), n))
        order = list(range(n)) if self.rows >= n else sorted(range(n), key=lambda k: (-sizes[k], k))
        self.first = order[:self.rows]
        self.queue = deque(order[self.rows:])
        self.steps = 0  # the group's steps
        self.work = 0  # Σ over steps of the rows holding a member
        self.validations = 0  # steps at which some row validated

    def step(self, live: int) -> None:
        self.steps += 1
        self.work += live

    def idle(self, row_steps: int) -> None:
        """Row-steps a stopped member held its row before the host polled it: no work."""
        self.work -= row_steps

    def next(self) -> int | None:
        """The next pending member (its index), or None when none is left."""
        return self.queue.popleft() if self.queue else None

    @property
    def occupancy(self) -> float:
        return self.work / (self.rows * self.steps) if self.steps else math.nan

    def state_dict(self) -> dict:
        return {"rows": self.rows, "queue": list(self.queue), "steps": self.steps, "work": self.work,
                "validations": self.validations}

    def load_state_dict(self, saved: dict) -> None:
        self.rows, self.steps, self.work = int(saved["rows"]), int(saved["steps"]), int(saved["work"])
        self.validations = int(saved["validations"])
        self.queue = deque(int(k) for k in saved["queue"])


def replay(steps: Sequence[int], sizes: Sequence[int], rows: int | None = None, poll: int = 1,
           every: Sequence[int] | None = None) -> RowSchedule:
    """The schedule a group of members with these step counts (and training-set sizes) runs through `rows` rows, as
    the group runs it: a member stopping at group step s is seen at the host's next poll (the first multiple of `poll`
    from s), where its row takes the next member (held without work until then). `every`: each member validates
    every this many of its steps while it holds its row, counted in `validations`."""
    sched = RowSchedule(sizes, rows)
    held = [(steps[k], k) for k in sched.first]  # (the group step at which the row's member stops, the member)
    due: set[int] = set()
    while held:
        now = min(-(-end // poll) * poll for end, _ in held)  # the next poll that frees a row
        for t in range(sched.steps, now):
            sched.step(sum(end > t for end, _ in held))
        kept = []
        for end, k in held:
            if end > now:
                kept.append((end, k))
                continue
            if every is not None:
                due.update(range(end - steps[k] + every[k], now + 1, every[k]))  # until the poll: it cannot tell
            if (j := sched.next()) is not None:
                kept.append((now + steps[j], j))
        held = kept
    sched.validations = len(due)
    return sched


def balanced_parts(costs: Sequence[float], n: int) -> list[list[int]]:
    """Indices split into at most n parts of about equal summed cost: largest first to the lightest part,
    then single moves and pairwise swaps between parts while they lower the heavier part's load."""
    def load(p: list[int]) -> float:
        return sum(costs[i] for i in p)

    parts: list[list[int]] = [[] for _ in range(n)]
    for k in sorted(range(len(costs)), key=lambda k: (-costs[k], k)):
        min(parts, key=load).append(k)

    improved = True
    while improved:
        improved = False
        for a in parts:
            for b in parts:
                gap = load(a) - load(b)
                if gap <= 0:
                    continue
                # move i from a to b, or swap i (in a) with j (in b): the best that shrinks the gap
                options: list[tuple[float, int, int | None]] = [(abs(gap - 2 * costs[i]), i, None) for i in a]
                options += [(abs(gap - 2 * (costs[i] - costs[j])), i, j) for i in a for j in b]
                best, i, j = min(options, key=lambda o: o[0])
                if best < gap - 1e-9:
                    a.remove(i)
                    b.append(i)
                    if j is not None:
                        b.remove(j)
                        a.append(j)
                    improved = True
    return [sorted(p) for p in parts if p]


class _Plan:
    """Each live member's (row's) epoch: its global sample indices, sample weights (0 = padding) and augmentation,
    padded to the longest epoch; `cursor` is the batch number per row, on the device and (`batches`) on the host.
    With a label-dependent batch transform the host keeps the drawn indices (`host_idx`) for the step's class
    segments. Each row's next epoch is drawn one ahead (`next_*`), from the member's generator in `fit`'s order."""

    def __init__(self, live: Sequence[LockstepMember], data: DeviceData, y_host: np.ndarray | None = None,
                 pending: Sequence[LockstepMember] = ()) -> None:
        dev = data.device
        self.data, self.dev, self.y_host = data, dev, y_host
        cfg = live[0].spec.cfg
        self.augment, self.transform = cfg.augment, cfg.batch_transform
        every = [*live, *pending]  # the buffers fit every member that may take a row (`replace`)
        if any(m.spec.cfg.batch_size != cfg.batch_size or m.spec.cfg.augment != self.augment
               or m.spec.cfg.batch_transform is not self.transform for m in every):
            raise ValueError("members of one group share the batch size, the augmentation flag and the batch transform")
        # a batch larger than every member's training set (optim.batch_size=10**9) is that set: capped (same batches)
        self.bs = min(cfg.batch_size, max(m.size for m in every))
        self.pad = augment_pad(data, self.augment)
        self.slots = max(m.steps_per_epoch for m in every) * self.bs
        n, self.slot = len(live), torch.arange(self.bs, device=dev)
        self.idx = torch.zeros(n, self.slots, dtype=live[0].idx.dtype, device=dev)
        self.w = torch.zeros(n, self.slots, dtype=torch.float32, device=dev)
        self.off = torch.zeros(n, self.slots, 2, dtype=torch.long, device=dev)
        self.flip = torch.zeros(n, self.slots, dtype=torch.bool, device=dev)
        self.next_idx, self.next_off, self.next_flip = self.idx.clone(), self.off.clone(), self.flip.clone()
        self.host_idx = None if y_host is None else np.zeros((n, self.slots), dtype=host_copy(live[0].idx[:1]).dtype)
        self.next_host_idx = None if self.host_idx is None else self.host_idx.copy()
        self.cursor = torch.zeros(n, dtype=torch.long, device=dev)
        # host, per row: batches taken this epoch, steps per epoch, size, validation period, its member's first step
        self.batches, self.spe, self.sizes, self.every, self.start = (np.zeros(n, dtype=np.int64) for _ in range(5))
        for row, m in enumerate(live):
            self.replace(row, m)

    def replace(self, row: int, m: LockstepMember) -> None:
        """Member m takes `row` and draws its first epoch, and the second one ahead; no read back."""
        for idx, off, flip in ((self.idx, self.off, self.flip), (self.next_idx, self.next_off, self.next_flip)):
            idx[row] = torch.cat([m.idx, m.idx[:1].expand(self.slots - m.size)])  # padded to the longest epoch
            off[row] = 0
            flip[row] = False
        self.w[row] = (torch.arange(self.slots, device=self.dev) < m.size).float()
        self.cursor[row] = 0
        if self.host_idx is not None and self.next_host_idx is not None:  # read once per member, outside the steps
            self.host_idx[row] = np.concatenate([m.host(), np.repeat(m.host()[:1], self.slots - m.size)])
            self.next_host_idx[row] = self.host_idx[row]
        self.spe[row], self.sizes[row] = m.steps_per_epoch, m.size
        self.every[row], self.start[row] = m.spec.cfg.eval_every_steps or 0, m.first_step
        self._draw(m, row, ahead=False)
        self._draw(m, row, ahead=True)
        self.batches[row] = 0

    def new_epoch(self, m: LockstepMember, row: int) -> None:
        """Member m (in `row`) starts its next epoch, the one drawn ahead (a copy on the device), and draws the one
        after (sent to the device without blocking)."""
        self.idx[row] = self.next_idx[row]
        self.off[row] = self.next_off[row]
        self.flip[row] = self.next_flip[row]
        if self.host_idx is not None and self.next_host_idx is not None:
            self.host_idx[row] = self.next_host_idx[row]
        self._draw(m, row, ahead=True)
        self.batches[row] = 0

    def _draw(self, m: LockstepMember, row: int, ahead: bool) -> None:
        """An epoch of m's batch order and augmentation, drawn as `fit` draws it, into the row's current or next
        epoch."""
        idx, off, flip, host = (self.next_idx, self.next_off, self.next_flip, self.next_host_idx) if ahead else \
            (self.idx, self.off, self.flip, self.host_idx)
        ep = draw_epoch(m.size, m.spec.gen, self.augment, self.pad)
        idx[row, :m.size] = m.idx[to_device(ep.perm, self.dev)]
        if host is not None:
            host[row, :m.size] = m.host()[ep.perm.numpy()]
        if ep.offsets is not None and ep.flips is not None:
            off[row, :m.size] = to_device(ep.offsets, self.dev)
            flip[row, :m.size] = to_device(ep.flips, self.dev)

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
        """Rows that validate after group step `step` (each after its own `eval_every_steps` steps)."""
        due = (self.every > 0) & ((step - self.start) % np.maximum(self.every, 1) == 0)
        return np.flatnonzero(due).tolist()

    def restart(self, rows: list[int]) -> None:
        """Rows that started a new epoch (`new_epoch`) read from its first batch again."""
        if rows:
            self.cursor[torch.tensor(rows, device=self.dev)] = 0

    HOST = ("batches", "spe", "sizes", "every", "start")
    PARTS = ("idx", "w", "off", "flip", "cursor", "next_idx", "next_off", "next_flip")

    def keep(self, rows: list[int]) -> None:
        keep = torch.tensor(rows, device=self.dev)
        for k in self.PARTS:
            setattr(self, k, getattr(self, k)[keep])
        if self.host_idx is not None and self.next_host_idx is not None:
            self.host_idx, self.next_host_idx = self.host_idx[rows], self.next_host_idx[rows]
        for k in self.HOST:
            setattr(self, k, getattr(self, k)[rows])

    def state_dict(self) -> dict:
        """The live rows' drawn epochs and batch cursors (the batch width too: it was set by the group's first
        members, some of which may have finished since)."""
        return {"bs": self.bs, "slots": self.slots, **{k: getattr(self, k).clone() for k in self.PARTS},
                **{k: None if getattr(self, k) is None else torch.from_numpy(getattr(self, k).copy())
                   for k in ("host_idx", "next_host_idx")},
                **{k: torch.from_numpy(getattr(self, k).copy()) for k in self.HOST}}

    def load_state_dict(self, saved: dict) -> None:
        self.bs, self.slots = int(saved["bs"]), int(saved["slots"])
        self.slot = torch.arange(self.bs, device=self.dev)
        for k in self.PARTS:
            setattr(self, k, saved[k].to(self.dev))
        for k in self.HOST:
            setattr(self, k, saved[k].numpy().astype(np.int64))
        if self.y_host is not None:
            self.host_idx, self.next_host_idx = saved["host_idx"].numpy().copy(), saved["next_host_idx"].numpy().copy()
