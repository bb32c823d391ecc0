"""The numerics contract (training/engine/numerics.py), checked where it is promised.

CPU, loop engine: a group's models are bitwise those trained one at a time. Stacked engine (CPU or GPU) and any
engine on a GPU: one optimizer step within STEP_RTOL of the parameters' scale, and final bits/sample (best
validation loss) within max(1e-3, 0.05 × the seed SD); each run prints its largest deviation against the seed SD.
A GPU report's run failed the old `==`-style check here (LeNet stacked 1.37159 vs 1.37149 nats: 1.4e-4 bits,
inside this tolerance).
"""

from __future__ import annotations

import math
import statistics

import pytest
import torch

from models import build_model
from tests.helpers import fit_settings, group_options, optimizer
from tests.test_vectorized import SHAPE, K, _arch, _data
from training.engine.fit import Member, TrainData, fit
from training.engine.group import fit_group
from training.engine.numerics import STEP_RTOL, bits_tolerance, job_numerics
from training.engine.seeding import generator, seeded_global_rng

SEEDS = (0, 1, 2)


def _members(arch: str, device: str, n: int, epochs: int) -> list[Member]:
    out = []
    for s in SEEDS:  # the members differ as seeds do: init and batch order
        with seeded_global_rng(s, "init", 0):
            model = build_model(_arch(arch), SHAPE, K).to(device)
        cfg = fit_settings(batch_size=32, patience=2, max_epochs=epochs, augment=True, progress=False)
        out.append(Member(model, optimizer(model, lr=2e-3, beta1=0.9, warmup_steps=7), torch.arange(80, 80 + n),
                          generator(s, "b", 0), cfg, val_idx=torch.arange(80)))
    return out


def _compare(arch: str, engine: str, device: str) -> tuple[float, float, float]:
    """(largest relative parameter deviation after one optimizer step, largest |Δ bits| of the trained models,
    seed SD of their bits) between one-at-a-time `fit` and `fit_group`."""
    with job_numerics("fp32", False):  # the default precision: TF32 off for matmul and cuDNN (on by default there)
        data, y, _, _ = _data(600, device=device)
        one = [_members(arch, device, 32, 1), _members(arch, device, 32, 1)]  # 32 rows, batch 32: one step
        for m in one[0]:
            fit(m, TrainData(data, y))
        fit_group(one[1], TrainData(data, y), group_options(engine=engine))
        step = max(((a - b).abs().max() / (a.abs().max() + 1e-12)).item()
                   for ma, mb in zip(*one, strict=True)
                   for a, b in zip(ma.model.state_dict().values(), mb.model.state_dict().values(), strict=True))
        seq, grp = _members(arch, device, 440, 9), _members(arch, device, 440, 9)
        bits_seq = [fit(m, TrainData(data, y)).best_val_loss / math.log(2) for m in seq]
        bits_grp = [r.best_val_loss / math.log(2)
                    for r in fit_group(grp, TrainData(data, y), group_options(engine=engine))]
    dev = max(abs(a - b) for a, b in zip(bits_seq, bits_grp, strict=True))
    sd = statistics.stdev(bits_seq)
    print(f"{arch} {engine} on {device}: one step max rel Δ {step:.2g} (bound {STEP_RTOL:g}); largest |Δ bits| "
          f"{dev:.3g} = {dev / sd:.3g} × seed SD {sd:.3g} (tolerance {bits_tolerance(sd):.3g})")
    return step, dev, sd


@pytest.mark.parametrize("arch", ["mlp", "lenet"])
def test_cpu_loop_engine_is_bitwise(arch: str) -> None:
    assert _compare(arch, "loop", "cpu")[:2] == (0.0, 0.0)


@pytest.mark.parametrize("arch", ["mlp", "lenet"])
def test_cpu_stacked_engine_within_the_contract(arch: str) -> None:
    step, dev, sd = _compare(arch, "stacked", "cpu")
    assert step <= STEP_RTOL and dev <= bits_tolerance(sd)


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["loop", "stacked"])
@pytest.mark.parametrize("arch", ["mlp", "lenet"])
def test_cuda_within_the_contract(arch: str, engine: str) -> None:
    """STEP_RTOL is a stated bound, not yet measured on a GPU: this test measures it (its printed line)."""
    step, dev, sd = _compare(arch, engine, "cuda")
    assert step <= STEP_RTOL and dev <= bits_tolerance(sd)
