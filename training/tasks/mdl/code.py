"""Prequential MDL arithmetic (Voita & Titov 2020) and the paper code's legacy weighting (EleutherAI/mdl).

Pure functions on sizes and losses, so the code lengths can be checked by hand.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from itertools import accumulate

MIN_BLOCK_SAMPLES = 2  # the smallest block: `mdl.min_block` shrinks to this when the data is too small for it


def most_blocks(n: int) -> int:
    """The most blocks `n` samples can be cut into: the one feasibility rule that the partition, the split and the
    job's precheck (training/tasks/mdl/splits.py, refusals.py) apply."""
    return n // MIN_BLOCK_SAMPLES


def partition_logspace(n: int, num_blocks: int, min_block: int) -> list[int]:
    """Split n into num_blocks sizes that grow geometrically from min_block and sum exactly to n.

    The ratio r solves min_block * (r^B - 1) / (r - 1) = n (bisection); sizes are rounded with the
    largest-remainder rule so the sum is preserved. min_block shrinks when n is too small for it.
    """
    if num_blocks < 2:
        raise ValueError("prequential MDL needs at least 2 blocks")
    if num_blocks > most_blocks(n):
        raise ValueError(f"{n} samples cannot be cut into {num_blocks} blocks")
    start = min(min_block, n // (MIN_BLOCK_SAMPLES * num_blocks)) if min_block * num_blocks >= n else min_block

    def total(r: float) -> float:
        return start * num_blocks if r == 1.0 else start * (r**num_blocks - 1) / (r - 1)

    lo, hi = 1.0, 2.0
    while total(hi) < n:
        hi *= 2
    for _ in range(200):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if total(mid) < n else (lo, mid)
    r = (lo + hi) / 2
    real = [start * r**i for i in range(num_blocks)]
    sizes = [math.floor(v) for v in real]
    short = n - sum(sizes)
    for i in sorted(range(num_blocks), key=lambda i: real[i] - sizes[i], reverse=True)[:short]:
        sizes[i] += 1
    if sum(sizes) != n or min(sizes) < 1:
        raise AssertionError(f"partition failed: {sizes} for n={n}")
    return sizes


def cumulative(sizes: list[int]) -> list[int]:
    return list(accumulate(sizes))


@dataclass(frozen=True)
class MdlCode:
    protocol: str
    block_sizes: list[int]
    block_ce_bits: list[float]  # mean code length (bits/sample) of each coded block; block 1 = log2 K
    block_bits: list[float]  # total bits of each block
    total_bits: float
    bits_per_sample: float
    legacy: float

    def as_dict(self) -> dict[str, object]:  # result.json's mdl section (its code part)
        return {"protocol": self.protocol, "block_sizes": self.block_sizes, "block_ce_bits": self.block_ce_bits,
                "block_bits": self.block_bits, "total_bits": self.total_bits, "bits_per_sample": self.bits_per_sample,
                "legacy": self.legacy}


def legacy_mdl(block_sizes: list[int], model_ce_bits: list[float]) -> float:
    """The paper code's number: Σ_i cumsize_{i+1} · CE_i / N for the models i = 1..B-1.

    Its weights sum to more than 1 (≈3.44 on CIFAR-10), which is why the paper's values exceed log2 K.
    """
    cums = cumulative(block_sizes)
    if len(model_ce_bits) != len(block_sizes) - 1:
        raise ValueError("need one CE per block model (B - 1)")
    return sum(c * ce for c, ce in zip(cums[1:], model_ce_bits, strict=True)) / cums[-1]


def prequential_code(block_sizes: list[int], model_ce_bits: list[float], num_classes: int) -> MdlCode:
    """Block 1 with the uniform code, block i ≥ 2 with the model trained on blocks 1..i-1.

    model_ce_bits[i] is the mean cross-entropy in bits of model i+1 (trained on the first i+1 blocks)
    on block i+2.
    """
    uniform = math.log2(num_classes)
    ce = [uniform, *model_ce_bits]
    if len(ce) != len(block_sizes):
        raise ValueError(f"{len(block_sizes)} blocks need {len(block_sizes) - 1} block models, "
                         f"got {len(model_ce_bits)}")
    bits = [s * c for s, c in zip(block_sizes, ce, strict=True)]
    total = float(sum(bits))
    return MdlCode("prequential", block_sizes, ce, bits, total, total / sum(block_sizes),
                   legacy_mdl(block_sizes, model_ce_bits))


def paper_code(block_sizes: list[int], model_ce_bits: list[float]) -> MdlCode:
    """The paper protocol: every model is scored on the same held-out last block; no uniform code.

    total_bits/bits_per_sample hold the paper's weighted number (it is not a code length).
    """
    legacy = legacy_mdl(block_sizes, model_ce_bits)
    n = sum(block_sizes)
    return MdlCode("paper", block_sizes, list(model_ce_bits), [c * ce for c, ce in
                   zip(cumulative(block_sizes)[1:], model_ce_bits, strict=True)], legacy * n, legacy, legacy)
