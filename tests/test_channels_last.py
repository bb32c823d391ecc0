"""`training.channels_last` (training/engine/numerics.py `JobNumerics.memory_format`): auto is
off on CPU and changes no number; true trains LeNet and ConvNeXt with their convolution weights and batches in
channels_last (checked inside the training step), on `fit()` and the loop engine, within a CPU tolerance of the
default layout, and the numerics signature records it only then; a model without 2-d convolutions ignores it."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers import job_config, result_of
from tests.test_cell import _numbers
from training.engine.numerics import JobNumerics
from training.tasks.mdl.aggregate_collect import numerics_of
from training.tasks.mdl.job import run_job

SMALL = ["experiment=smoke", "dataset.limit=200", "mdl.max_epochs=2", "mdl.patience=1", "optim.warmup_steps=0"]
TINY = {"lenet": ["arch=lenet", "arch.width=16"], "convnext": ["arch=convnext", "arch.width=8", "arch.depth=1"],
        "mlp": ["arch=mlp", "arch.width=16"]}
# |Δ bits/sample| of a job, channels_last vs the default layout on CPU (other oneDNN convolution kernels: float32
# rounding). Measured (Nov 2026, this harness's CPU): ≤ 3e-9 bits/sample and ≤ 5e-9 per block over 15 epochs of LeNet
# and ConvNeXt on 600 digits (docs/speed.md); the bound is 1e-6, far under the GPU contract's BITS_ATOL (1e-3).
CPU_BITS_TOL = 1e-6


class ConvSpy:
    """Every Conv2d call of a training step (gradients on; a shape probe runs under no_grad): whether its weight was
    channels_last (the channel stride 1: a one-input-channel weight reads as both layouts by `is_contiguous`) and
    whether its input was."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.seen: list[tuple[bool, bool]] = []
        original = nn.Conv2d._conv_forward

        def spy(conv: nn.Conv2d, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
            if conv.training and torch.is_grad_enabled():
                cl = torch.channels_last
                self.seen.append((weight.stride(1) == 1 and weight.is_contiguous(memory_format=cl),
                                  x.is_contiguous(memory_format=cl)))
            return original(conv, x, weight, bias)

        monkeypatch.setattr(nn.Conv2d, "_conv_forward", spy)


def _run(out: Path, arch: str, *extra: str) -> dict[str, Any]:
    return result_of(run_job(job_config(out, [*SMALL, *TINY[arch], *extra])))


def test_auto_is_off_on_cpu_and_a_model_without_convolutions_ignores_true(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    spy = ConvSpy(monkeypatch)
    auto = _run(tmp_path / "auto", "lenet", "training.channels_last=auto")
    assert spy.seen and not any(w for w, _ in spy.seen)  # LeNet's convolutions ran, in the default layout
    off = _run(tmp_path / "off", "lenet", "training.channels_last=false")
    assert _numbers(auto) == _numbers(off)
    assert "memory_format" not in auto["provenance"]["numerics"] and auto["config_hash"] == off["config_hash"]
    on = _run(tmp_path / "mlp-on", "mlp", "training.channels_last=true")  # a model without convolutions ignores it
    off = _run(tmp_path / "mlp-off", "mlp", "training.channels_last=false")
    assert "memory_format" not in on["provenance"]["numerics"]
    assert _numbers(on) == _numbers(off)


@pytest.mark.parametrize("arch", ["lenet", "convnext"])
@pytest.mark.parametrize("group", ["1", "auto"])  # fit() one at a time | the loop engine's group
def test_true_trains_in_channels_last_within_the_cpu_tolerance(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              arch: str, group: str) -> None:
    extra = (f"training.parallel_models={group}", "training.engine=loop")
    off = _run(tmp_path / "off", arch, *extra, "training.channels_last=false")
    spy = ConvSpy(monkeypatch)
    on = _run(tmp_path / "on", arch, *extra, "training.channels_last=true")
    assert spy.seen and all(w and x for w, x in spy.seen)  # every training convolution: weight and input
    assert on["provenance"]["numerics"]["memory_format"] == "channels_last"
    assert on["provenance"]["numerics"]["engine"] == ("fit" if group == "1" else "loop")
    assert "memory_format" not in off["provenance"]["numerics"] and on["config_hash"] == off["config_hash"]
    a, b = on["mdl"], off["mdl"]
    assert abs(a["bits_per_sample"] - b["bits_per_sample"]) <= CPU_BITS_TOL
    assert a["block_ce_bits"] == pytest.approx(b["block_ce_bits"], abs=CPU_BITS_TOL)


def test_memory_format_resolves_from_the_model_device_and_engine() -> None:
    conv, mlp = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten()), nn.Sequential(nn.Linear(4, 2))
    cpu, cuda = torch.device("cpu"), torch.device("cuda")  # a device object: no GPU needed
    for setting, device, model, engine, want in [
            ("auto", cuda, conv, "loop", torch.channels_last), ("auto", cpu, conv, "loop", None),
            (True, cpu, conv, "fit", torch.channels_last), (False, cuda, conv, "fit", None),
            ("auto", cuda, mlp, "fit", None), (True, cuda, conv, "stacked", None)]:
        job = JobNumerics(channels_last=setting)
        assert job.memory_format(model, device, engine) == want, (setting, device, engine)
        assert ("memory_format" in job.signature(device, "x")) == (want is not None)


def test_the_aggregate_compares_the_memory_format_and_reads_an_absent_one_as_before() -> None:
    base = {"device_name": "cpu", "torch": "2", "cuda": None, "cudnn": None, "precision": "fp32", "engine": "loop",
            "models_together": 6, "deterministic": False}

    def of(sig: dict[str, Any]) -> str | None:
        return numerics_of(SimpleNamespace(provenance=SimpleNamespace(raw={"numerics": sig})))  # type: ignore[arg-type]

    assert of(base) == of({**base, "memory_format": None})
    assert of(base) != of({**base, "memory_format": "channels_last"})
    assert (of(base) or "").endswith("memory_format=None")


@pytest.mark.parametrize("setting, on", [("true", True), ("auto", False)])  # auto: off on this CPU
def test_gpu_report_throughput_measures_with_and_without_it_where_it_is_on(setting: str, on: bool) -> None:
    from tools.gpu_report_steps import Payload, throughput

    p = Payload(device="cpu", archs=["lenet"], n=300, shape=[3, 16, 16], arch_overrides={"lenet": ["arch.width=16"]},
                subset=128, val=64, group=1, overrides=[f"training.channels_last={setting}"])
    res = throughput(p)["lenet"]
    assert "error" not in res and res["channels_last"] is on
    assert ("train_sps_channels_last_off" in res) is on and res.get("train_sps_channels_last_off", 1) > 0
