"""Prequential MDL arithmetic on hand-computable cases."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.helpers import job_config
from training.app.schema import ConfigError
from training.app.tasks import job_hash, load_job
from training.tasks.mdl import code as mdl_code
from training.tasks.mdl.code import cumulative, legacy_mdl, paper_code, partition_logspace, prequential_code
from training.tasks.mdl.refusals import check_blocks
from training.tasks.mdl.splits import make_split


def test_hand_computed_code() -> None:
    sizes, ce = [2, 4, 8], [1.5, 0.25]  # models trained on 2 and 6 samples code blocks 2 and 3
    code = prequential_code(sizes, ce, num_classes=4)
    assert code.block_ce_bits == [2.0, 1.5, 0.25]  # block 1: uniform code log2(4) = 2 bits
    assert code.block_bits == [4.0, 6.0, 2.0]
    assert code.total_bits == 12.0
    assert code.bits_per_sample == pytest.approx(12.0 / 14)
    # legacy: (cumsize_2 * CE_1 + cumsize_3 * CE_2) / N = (6 * 1.5 + 14 * 0.25) / 14
    assert code.legacy == pytest.approx((6 * 1.5 + 14 * 0.25) / 14)
    with pytest.raises(ValueError):  # one model short
        prequential_code([2, 4, 8], [1.0], num_classes=2)


def test_constant_predictor_equals_uniform_code() -> None:
    sizes = partition_logspace(5000, 8, 100)
    k = 10
    code = prequential_code(sizes, [math.log2(k)] * 7, num_classes=k)
    assert code.total_bits == pytest.approx(5000 * math.log2(k))
    assert code.bits_per_sample == pytest.approx(math.log2(k))


def test_legacy_weights_inflate_on_cifar10_sizes() -> None:
    # The paper code's weights sum to ~3.44 on CIFAR-10 (50000 - 2048 samples, 10 blocks from 1024).
    sizes = partition_logspace(50000 - 2048, 10, 1024)
    assert sizes[0] == 1024 and sum(sizes) == 47952
    assert legacy_mdl(sizes, [1.0] * 9) == pytest.approx(3.444, abs=0.01)
    assert paper_code(sizes, [1.0] * 9).bits_per_sample == pytest.approx(3.444, abs=0.01)


@pytest.mark.parametrize("n,b,m", [(47952, 10, 1024), (1438, 6, 128), (100, 10, 1024), (4488, 6, 128)])
def test_partition_is_geometric_and_exact(n: int, b: int, m: int) -> None:
    sizes = partition_logspace(n, b, m)
    assert sum(sizes) == n and len(sizes) == b
    assert all(s2 >= s1 for s1, s2 in zip(sizes, sizes[1:], strict=False))
    if m * b < n:
        assert sizes[0] == m
    if sizes[0] >= 50:  # rounding dominates tiny blocks
        ratios = [s2 / s1 for s1, s2 in zip(sizes[1:], sizes[2:], strict=False)]
        assert max(ratios) - min(ratios) < 0.05


def test_split_is_nested_disjoint_and_seeded() -> None:
    s = make_split(1797, seed=3, val_size=2048, val_frac=0.2, num_blocks=6, min_block=128)
    assert len(s.val_idx) == round(1797 * 0.2)
    all_idx = torch.cat([s.val_idx, s.order])
    assert torch.equal(all_idx.sort().values, torch.arange(1797))
    assert torch.equal(s.prefix(3), torch.cat([s.block(1), s.block(2), s.block(3)]))
    again = make_split(1797, seed=3, val_size=2048, val_frac=0.2, num_blocks=6, min_block=128)
    other = make_split(1797, seed=4, val_size=2048, val_frac=0.2, num_blocks=6, min_block=128)
    assert torch.equal(s.order, again.order) and not torch.equal(s.order, other.order)
    assert cumulative(s.block_sizes)[-1] == len(s.order)


def test_config_hash_ignores_where_and_how_but_not_what() -> None:
    base = {"seed": 0, "dataset": {"name": "digits"}, "paths": {"out_dir": "a"}, "training": {"engine": "loop"}}
    assert job_hash(base) == job_hash({**base, "paths": {"out_dir": "b"}, "training": {"engine": "stacked"},
                                             "logger": {"name": "none"}, "device": "cuda"})
    assert job_hash(base) != job_hash({**base, "seed": 1})


@pytest.mark.parametrize("n_coded", [9, 10, 11, 40])
def test_block_feasibility_is_one_rule_the_partition_split_and_precheck_share(n_coded: int, tmp_path: Path) -> None:
    """`most_blocks` decides; the partition, the split and the job's precheck accept exactly up to it and refuse one
    more (each in its own words)."""
    n_val = 3
    n = n_coded + n_val
    most = mdl_code.most_blocks(n_coded)
    assert most == n_coded // 2
    for blocks, ok in ((most, True), (most + 1, False)):
        cfg = load_job(job_config(tmp_path, ["experiment=smoke", f"mdl.num_blocks={max(blocks, 2)}",
                                                f"mdl.val_size={n_val}", "mdl.val_frac=0.5"]))
        if ok:
            assert sum(partition_logspace(n_coded, blocks, 8)) == n_coded
            assert len(make_split(n, 0, val_size=n_val, val_frac=0.5, num_blocks=blocks, min_block=8).block_sizes) \
                == blocks
            check_blocks(cfg.mdl, cfg.eraser.fit_on, "toy", n, n)
            continue
        with pytest.raises(ValueError, match="cannot be cut"):
            partition_logspace(n_coded, blocks, 8)
        with pytest.raises(ConfigError, match=f"at most {most} blocks"):
            make_split(n, 0, val_size=n_val, val_frac=0.5, num_blocks=blocks, min_block=8)
        with pytest.raises(ConfigError, match=f"at most {most} blocks"):
            check_blocks(cfg.mdl, cfg.eraser.fit_on, "toy", n, n)
