"""Validation split and the nested prequential blocks, all from the run seed."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from training.app.schema import ConfigError
from training.engine.seeding import generator
from training.tasks.mdl.code import MIN_BLOCK_SAMPLES, cumulative, most_blocks, partition_logspace


@dataclass(frozen=True)
class MdlSplit:
    val_idx: torch.Tensor  # validation set: early stopping only
    order: torch.Tensor  # the remaining samples in coding order
    block_sizes: list[int]
    redraw_seed: int | None = None  # `mdl.split=redraw`: the seed of every block model's own draw (`of_model`)

    def of_model(self, tag: object) -> MdlSplit:
        """The split model `tag` trains, validates and is coded on: this one, or with `mdl.split=redraw` (the public
        code's per-chunk draw, EleutherAI/mdl mdl/sweep.py) for block model `("block", i)` its own permutation of
        all the rows, drawn from (seed, "split", tag) and cut as this one (the same validation and block sizes): it
        trains on the first i blocks of it, validates on its validation rows and is coded on its last block."""
        if self.redraw_seed is None or not (isinstance(tag, tuple) and tag[0] == "block"):
            return self
        nv = len(self.val_idx)
        perm = torch.randperm(nv + len(self.order), generator=generator(self.redraw_seed, "split", tag))
        return MdlSplit(perm[:nv], perm[nv:], self.block_sizes)

    @property
    def cumsizes(self) -> list[int]:
        return cumulative(self.block_sizes)

    def prefix(self, i: int) -> torch.Tensor:
        """Indices of blocks 1..i (1-based)."""
        return self.order[: self.cumsizes[i - 1]]

    def block(self, i: int) -> torch.Tensor:
        """Indices of block i (1-based)."""
        cums = [0, *self.cumsizes]
        return self.order[cums[i - 1]: cums[i]]


PAPER_CODE_BATCH = 32  # the public code's `Sweep.batch_size`, which its chunk rule reads (mdl/sweep.py)


def smallest_block(min_block: int | str, num_classes: int, num_features: int) -> int:
    """`mdl.min_block`: the integer given, or `paper_code`: the public code's rule min(1024, 2·max(32, K, d))
    (EleutherAI/mdl, mdl/sweep.py: at least two of its batches of 32, K and d), which the partition then shrinks
    where the data is too small, as any other (training/tasks/mdl/code.py `partition_logspace`)."""
    if min_block == "paper_code":
        return min(1024, 2 * max(PAPER_CODE_BATCH, num_classes, num_features))
    return int(min_block)


def validation_size(n: int, val_size: int, val_frac: float) -> int:
    return max(1, min(int(val_size), round(n * float(val_frac))))


def make_split(n: int, seed: int, *, val_size: int, val_frac: float, num_blocks: int, min_block: int) -> MdlSplit:
    perm = torch.randperm(n, generator=generator(seed, "split"))
    nv = validation_size(n, val_size, val_frac)
    rest = perm[nv:]
    if num_blocks > most_blocks(len(rest)):  # the job's precheck (refusals.py) refuses this before anything is made
        raise ConfigError(f"mdl.num_blocks={num_blocks} is not allowed: {len(rest)} samples to code (after {nv} for "
                          f"validation) make at most {most_blocks(len(rest))} blocks of at least {MIN_BLOCK_SAMPLES}; "
                          "lower mdl.num_blocks")
    return MdlSplit(perm[:nv], rest, partition_logspace(len(rest), num_blocks, min_block))


def model_name(tag: object) -> str:
    """How errors name a job's model: `("block", i)` → "block model i" (trained on blocks 1..i), "full"."""
    if isinstance(tag, tuple) and len(tag) == 2 and tag[0] == "block":
        return f"block model {tag[1]}"
    return "the full-data model" if tag == "full" else str(tag)
