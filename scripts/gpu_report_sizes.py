"""scripts/gpu_report.py: the sizes of the GPU run and of the CPU toy run (everything that differs)."""

from __future__ import annotations

import dataclasses

ARCHS = ("mlp", "lenet", "convnext", "swin")


@dataclasses.dataclass(frozen=True)
class EraserSizes:
    """erasers_device: n × d data of k classes, ALF-QLEACE's max_rank."""

    n: int
    d: int
    k: int
    alf_max_rank: int


@dataclasses.dataclass(frozen=True)
class ThroughputSizes:
    """throughput and the sweep-cost loops: rows trained on, validation rows, models in one vectorised group."""

    subset: int
    val: int
    group: int
    quick: bool = False  # toy: one epoch per figure, no warm-up


@dataclasses.dataclass(frozen=True)
class Sizes:
    """Everything that differs between the GPU run and the CPU toy run."""

    pytest_args: tuple[str, ...]
    job_data: tuple[str, ...]  # dataset overrides of the architecture jobs
    job_mdl: tuple[str, ...]  # mdl overrides (capped epoch budget)
    arch: dict[str, tuple[str, ...]]  # per-architecture overrides (GPU: none, the presets' base sizes)
    shape: tuple[int, int, int]
    n: int
    eraser: EraserSizes
    bench_erasers: tuple[str, ...]  # shared args of both bench_erasers runs
    bench_erasers_device_methods: str
    bench_erasers_cpu_methods: str
    bench_mdl: tuple[str, ...]
    throughput: ThroughputSizes
    loop_archs: tuple[str, ...]
    loop_procs: tuple[int, ...]
    loop_seconds: float
    timeouts: dict[str, float]


GPU_EPOCHS = 2
GPU = Sizes(
    pytest_args=(),  # the marker expression is --pytest-m (default "not slurm": slow and gpu tests included)
    job_data=("dataset=synthetic", "dataset.n=50000", "dataset.channels=3", "dataset.size=32",
              "dataset.num_classes=10", "dataset.augment=true"),
    # the epoch cap is the budget: no step floor keeps a small block (or the MLP's 1000-step warm-up) going
    job_mdl=("mdl=prequential", f"mdl.max_epochs={GPU_EPOCHS}", f"mdl.patience={GPU_EPOCHS}",
             "mdl.stop_after_warmup=false"),
    arch={a: () for a in ARCHS},
    shape=(3, 32, 32), n=50_000,
    eraser=EraserSizes(n=20_000, d=1024, k=10, alf_max_rank=64),
    bench_erasers=("--n", "50000", "--d", "3072", "--k", "10"),
    bench_erasers_device_methods="ours_leace,ours_qleace,ours_alf",
    bench_erasers_cpu_methods="ce_leace,ce_qleace",
    bench_mdl=("--repeats", "1"),
    throughput=ThroughputSizes(subset=10_000, val=2048, group=10),
    loop_archs=ARCHS, loop_procs=(1, 4), loop_seconds=5.0,
    # each step's own cap (the H100 run, 2026-11-27: gpu tests 49 s, jobs 17-109 s, throughput 40 s, 5-seed sweep 53 s);
    # the whole report's default budget (scripts/gpu_report.py DEFAULT_BUDGET) decides what one call reaches
    timeouts={"tests": 150, "job": 180, "erasers_device": 120, "bench_erasers_device": 90,
              "bench_erasers_cpu_reference": 150, "bench_mdl": 150, "throughput": 120,
              "sweep_cost": 150, "cell": 150},
)
TOY = Sizes(
    pytest_args=("tests/test_mdl_math.py",),
    job_data=("dataset=synthetic", "dataset.n=400", "dataset.channels=3", "dataset.size=8",
              "dataset.num_classes=10", "dataset.augment=true"),
    job_mdl=("mdl=quick", "mdl.num_blocks=2", "mdl.min_block=64", "mdl.val_size=64", "mdl.max_epochs=1",
             "mdl.patience=1", "mdl.min_steps=0", "mdl.patience_min_steps=0", "mdl.stop_after_warmup=false"),
    arch={"mlp": ("arch.width=16",), "lenet": ("arch.width=16",),
          "convnext": ("arch.width=8", "arch.depth=1", "arch.base_width=8", "arch.base_depth=1"),
          "swin": ("arch.width=8", "arch.depth=1", "arch.base_width=8", "arch.base_depth=1")},
    shape=(3, 8, 8), n=400,
    eraser=EraserSizes(n=600, d=24, k=3, alf_max_rank=4),
    bench_erasers=("--n", "600", "--d", "24", "--k", "3", "--rank", "4"),
    bench_erasers_device_methods="ours_leace,ce_leace",  # the device is the CPU: both in one run
    bench_erasers_cpu_methods="",
    bench_mdl=("--n", "1500", "--d", "12", "--epochs", "1", "--seeds", "1", "--repeats", "1", "--threads", "1"),
    throughput=ThroughputSizes(subset=128, val=64, group=2, quick=True),
    loop_archs=("mlp",), loop_procs=(1,), loop_seconds=0.3,
    timeouts={"tests": 60, "job": 60, "erasers_device": 60, "bench_erasers_device": 60,
              "bench_erasers_cpu_reference": 60, "bench_mdl": 60, "throughput": 60,
              "sweep_cost": 60, "cell": 120},
)
