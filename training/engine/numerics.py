"""What a job's numbers depend on beyond its config, and the contract they keep (docs/running.md, "Precision, the
numerics contract and the signature").

`training.precision`: fp32 (TF32 off for matmul and cuDNN convolutions), tf32 (both on; CUDA only: fp32 on CPU),
bf16 (the training forward under autocast to bfloat16; weights, gradients, optimizer state, validation and code
lengths in float32). `training.deterministic`: torch's deterministic algorithms and CUBLAS_WORKSPACE_CONFIG. The
contract: CPU, loop engine (and `fit()`): bitwise, run to run and alone vs in a group; GPU: bitwise run to run only
with `training.deterministic=true` and the same numerics signature (result.json `provenance.numerics`), else one
optimizer step within STEP_RTOL (relative) and final bits/sample within max(BITS_ATOL, BITS_SD_FRACTION × the cell's
seed SD) (`within_contract`). `training.channels_last` (speed only): auto (on CUDA, for a model with 2-d convolutions;
on CPU other kernels move the numbers slightly) | true | false; where on, `fit` and the loop engine convert the
model's parameters and each 4-d training batch (`memory_format`); the stacked engine ignores it (a log line).
`job_numerics` sets torch's process-wide flags for one job, restores them after, and yields the job's `JobNumerics`
(`FitConfig.numerics`), whose `training_forward` is the one place the training step enters autocast.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from training.common import env

log = logging.getLogger(__name__)

PRECISIONS = ("fp32", "tf32", "bf16")
CUBLAS_WORKSPACE = ":4096:8"  # what torch's reproducibility notes ask for deterministic cuBLAS
STEP_RTOL = 1e-3  # GPU, one optimizer step, relative on the parameters: a bound to check, not yet measured
BITS_ATOL = 1e-3  # GPU, final bits/sample: within max(BITS_ATOL, BITS_SD_FRACTION × the cell's seed SD)
BITS_SD_FRACTION = 0.05


def bits_tolerance(seed_sd: float | None) -> float:
    """The contract's bound on |Δ bits/sample| between two GPU runs of one cell (seed SD unknown: BITS_ATOL)."""
    sd = seed_sd if seed_sd is not None and seed_sd == seed_sd else 0.0
    return max(BITS_ATOL, BITS_SD_FRACTION * sd)


def within_contract(a: float, b: float, seed_sd: float | None) -> bool:
    return abs(a - b) <= bits_tolerance(seed_sd)


@dataclass
class JobNumerics:
    """One job's numerics (no module state): its precision and determinism, and the (engine, models trained together)
    its training used so far, for its signature. `job_numerics` makes it; the job hands it to what trains."""

    precision: str = "fp32"
    deterministic: bool = False
    groups: set[tuple[str, int]] = field(default_factory=set)  # (engine, models trained together) seen
    channels_last: Any = False  # `training.channels_last`: auto | True | False
    formats: set[str] = field(default_factory=set)  # memory formats a model of this job trained in ("channels_last")

    def memory_format(self, model: nn.Module, device: torch.device, engine: str = "fit") -> torch.memory_format | None:
        """The layout `model` trains in on `device` (torch.channels_last, recorded for the signature) or None (as
        built): `training.channels_last` true, or auto on a CUDA device, for a model with a 2-d convolution; never on
        the stacked engine (a log line)."""
        setting = str(self.channels_last).lower()
        if setting == "false" or not any(isinstance(m, nn.Conv2d) for m in model.modules()):
            return None
        if setting == "auto" and device.type != "cuda":
            return None
        if engine == "stacked":
            log.info("training.channels_last: not applied on the stacked engine (its parameters are stacked)")
            return None
        self.formats.add("channels_last")
        return torch.channels_last

    def training_forward(self, device: torch.device, engine: str = "fit", models: int = 1) -> Any:
        """The context of a training step's forward: autocast to bfloat16 under `precision=bf16`, else nothing.
        Records (engine, models trained together) for the signature."""
        self.groups.add((engine, models))
        return nullcontext() if self.precision != "bf16" else torch.autocast(device.type, dtype=torch.bfloat16)

    def forward(self, model: Callable[[Tensor], Tensor], x: Tensor) -> Tensor:
        """`model(x)` as one model's training step runs it (`fit`): bf16 logits come back float32 (a float64
        model's stay float64)."""
        with self.training_forward(x.device):
            out = model(x)
        return out.float() if out.dtype in (torch.bfloat16, torch.float16) else out

    def signature(self, device: torch.device | str, device_name: str) -> dict[str, Any]:
        """The numerics signature of this job, run on `device` (named `device_name`)."""
        dev = torch.device(device)
        cuda = dev.type == "cuda"
        engines = sorted({e for e, _ in self.groups})
        return {"device_name": device_name, "torch": torch.__version__, "cuda": torch.version.cuda if cuda else None,
                "cudnn": torch.backends.cudnn.version() if cuda and torch.backends.cudnn.is_available() else None,
                "precision": self.precision, "engine": "+".join(engines) or None,
                "models_together": max((m for _, m in self.groups), default=None),
                "deterministic": self.deterministic,
                **({"memory_format": "+".join(sorted(self.formats))} if self.formats else {})}


def effective_precision(precision: Any, device: Any) -> Any:
    """The precision a job of `training.precision` on `device` (auto, cpu, cuda[:N]) computes in: tf32 off a CUDA
    device is fp32 (TF32 exists on CUDA only), so it is that job (its hash, directory and record); else unchanged."""
    if precision != "tf32" or not isinstance(device, str):
        return precision
    cuda = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return precision if cuda else "fp32"


def _set_fp32_precision(tf32: bool) -> Callable[[], None]:
    """TF32 on/off for CUDA matmul and cuDNN convolutions; returns what restores the previous setting."""
    b = torch.backends
    conv: Any = getattr(b.cudnn, "conv", None)  # torch >= 2.9: the fp32_precision API (the legacy flags warn)
    if hasattr(b.cuda.matmul, "fp32_precision") and conv is not None:
        old = (b.cuda.matmul.fp32_precision, conv.fp32_precision)
        b.cuda.matmul.fp32_precision = conv.fp32_precision = "tf32" if tf32 else "ieee"

        def restore() -> None:
            b.cuda.matmul.fp32_precision, conv.fp32_precision = old
        return restore
    legacy = (b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32)
    b.cuda.matmul.allow_tf32 = b.cudnn.allow_tf32 = tf32

    def restore_legacy() -> None:
        b.cuda.matmul.allow_tf32, b.cudnn.allow_tf32 = legacy
    return restore_legacy


@contextmanager
def job_numerics(precision: str, deterministic: bool, channels_last: Any = False) -> Iterator[JobNumerics]:
    """One job's numerics (a cell's seeds: theirs, they train together): torch's process-wide flags set for it
    while it runs and restored after; yields its `JobNumerics`."""
    if precision not in PRECISIONS:
        raise ValueError(f"training.precision={precision!r}: use one of {', '.join(PRECISIONS)}")
    saved = (torch.are_deterministic_algorithms_enabled(), torch.backends.cudnn.benchmark,
             torch.backends.cudnn.deterministic)
    restore = _set_fp32_precision(precision == "tf32")
    restore_env: Callable[[], None] = lambda: None  # noqa: E731
    if deterministic:
        restore_env = env.setting({"CUBLAS_WORKSPACE_CONFIG": CUBLAS_WORKSPACE})
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = False, True
    try:
        yield JobNumerics(precision, deterministic, channels_last=channels_last)
    finally:
        restore()
        restore_env()
        det, torch.backends.cudnn.benchmark, torch.backends.cudnn.deterministic = saved
        torch.use_deterministic_algorithms(det)


def in_format(x: Tensor, fmt: torch.memory_format | None) -> Tensor:
    """A 4-d batch in `fmt` (on its device; None or another rank: as it is)."""
    return x if fmt is None or x.dim() != 4 else x.contiguous(memory_format=fmt)
