"""Measurements that tools/gpu_report.py runs in fresh subprocesses (clean peak memory, a crash stays contained).

    python -m tools.gpu_report_work <kind> '<json payload>'

prints `RESULT {json}` as its last line. Kinds: `device` (CUDA device properties, asked here so the report's own
process holds no CUDA context), `job` (python -m training.run with the process's peak GPU memory), `erasers`
(float64 eraser fits on the device vs on CPU), `throughput` (train/eval samples/s per architecture through the
harness's own Trainer), `loop` (a fixed-duration training loop, several started at once to see how many jobs
share one GPU).
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import sys
import time
from pathlib import Path
from typing import Any

from tools.gpu_report_payload import Payload

ROOT = Path(__file__).resolve().parents[1]
NUM_CLASSES = 10


def _sync(device: Any) -> None:
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def _memory(device: Any) -> dict[str, float]:
    """Peak allocated/reserved memory of this process and the device's total and used memory (MB), on CUDA."""
    import torch

    if torch.device(device).type != "cuda":
        import resource

        return {"peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}
    free, total = torch.cuda.mem_get_info()
    reserved = torch.cuda.memory_reserved()
    return {"peak_allocated_mb": torch.cuda.max_memory_allocated() / 2**20,
            "peak_reserved_mb": torch.cuda.max_memory_reserved() / 2**20,
            "device_used_mb": (total - free) / 2**20, "device_total_mb": total / 2**20,
            # what the device holds for this process beyond torch's cache: the CUDA context, cuBLAS/cuDNN work space
            "context_mb": max(0.0, (total - free - reserved) / 2**20)}


def compose(overrides: list[str]) -> Any:  # a training.app.schema.JobConfig
    """The job config `python -m training.run <overrides>` would run, resolved and checked."""
    from hydra import compose as hydra_compose
    from hydra import initialize_config_dir

    import training  # noqa: F401  (registers the resolvers conf/ uses)
    from training.app.tasks import load_job
    from training.common.conf import resolved_dict

    with initialize_config_dir(str(ROOT / "conf"), version_base="1.3"):
        cfg = hydra_compose("config", overrides=overrides)
    return load_job(resolved_dict(cfg))


def cifar_like(n: int, shape: tuple[int, int, int], seed: int = 0) -> tuple[Any, Any]:
    """CIFAR-like data (uint8 pixels / 255, class-dependent mean), as tools/bench_mdl.py uses."""
    import torch

    g = torch.Generator().manual_seed(seed)
    d = math.prod(shape)
    y = torch.randint(0, NUM_CLASSES, (n,), generator=g)
    proto = torch.rand(NUM_CLASSES, d, generator=g)
    x = (0.5 * torch.rand(n, d, generator=g) + 0.5 * proto[y]).mul_(255).round_().div_(255)
    return x.reshape(n, *shape), y


# ---------------------------------------------------------------------------------------------------- kinds


def job(p: Payload) -> dict[str, Any]:
    """`python -m training.run <overrides>` in this process; its peak GPU memory goes to p.memory_file."""
    import runpy

    import torch

    sys.argv = [str(ROOT / "training" / "run.py"), *p.overrides]
    cuda = torch.cuda.is_available() and p.device.startswith("cuda")
    try:  # as `python -m training.run`: Hydra finds conf/ relative to the __main__ module's file
        runpy.run_module("training.run", run_name="__main__", alter_sys=True)
    finally:
        Path(p.memory_file).write_text(json.dumps(_memory("cuda" if cuda else "cpu")))
    return {}


def erasers(p: Payload) -> dict[str, Any]:
    """LEACE, QLEACE and ALF-QLEACE fitted in float64 on the device and on CPU from the same data: fit seconds
    on each and the largest difference of the erased data."""

    import erasure
    from tools.bench_erasers import make_data

    device = p.device
    x, y = make_data(p.n, p.d, p.k, 0, 1.5, 0.3)
    scale = float(x.abs().max())
    out: dict[str, Any] = {"n": p.n, "d": p.d, "k": p.k, "device": device, "data_max_abs": scale}
    for name, options in (("leace", {}), ("qleace", {}), ("alf_qleace", {"max_rank": p.alf_max_rank})):
        res: dict[str, Any] = {}
        erased = {}
        for where in ("cpu", device):
            xs, ys = x.to(where), y.to(where)
            _sync(where)
            t0 = time.perf_counter()
            e = erasure.fit(name, xs, ys, **options)
            _sync(where)
            res[f"fit_s_{'cpu' if where == 'cpu' else 'device'}"] = time.perf_counter() - t0
            erased[where] = (e.apply_in_sample(xs, ys) if e.needs_labels else e(xs)).double().cpu()
            report = e.report()
            for key in ("barycenter_iterations", "barycenter_residual", "rank", "final_worst_deviation"):
                if key in report and isinstance(report[key], int | float):
                    res[f"{key}_{'cpu' if where == 'cpu' else 'device'}"] = report[key]
            if where == device and device == "cpu":
                break
        other = erased[device]  # the CPU fit itself when the device is the CPU
        diff = float((erased["cpu"] - other).abs().max())
        res["max_abs_diff"] = diff
        res["max_rel_diff"] = diff / scale
        out[name] = res
        print(f"{name}: {res}", flush=True)
    return out


def _arch_cfg(arch: str, p: Payload) -> Any:
    c, s = p.shape[0], p.shape[1]
    return compose([f"arch={arch}", *p.arch_overrides[arch], "dataset=synthetic", f"dataset.n={p.n}",
                    f"dataset.channels={c}", f"dataset.size={s}", f"dataset.num_classes={NUM_CLASSES}",
                    "dataset.augment=true", "logger=none", "progress=false", f"device={p.device}",
                    *p.overrides])


def throughput(p: Payload) -> dict[str, Any]:
    """Per architecture, through the job's own Trainer: seconds per epoch of one model trained by `fit()` (as a job
    trains one model) on a `subset` of the resident data (validation included), training samples/s, evaluation
    samples/s, and for the architectures a job trains as one vectorised group, one epoch of `group` models at once
    through `fit_group` (the job's engine). `training.channels_last` as a job resolves it (auto: on for a model with
    2-d convolutions on a GPU); where it was on, `train_sps_channels_last_off` is the one-model figure without it."""
    import torch

    from training.engine.fit import cross_entropy_sum, fit
    from training.engine.group import GroupOptions, fit_group, why_not_vectorized
    from training.engine.numerics import JobNumerics
    from training.tasks.mdl.splits import make_split
    from training.tasks.mdl.trainer import Trainer

    device = torch.device(p.device)
    x, y = cifar_like(p.n, (p.shape[0], p.shape[1], p.shape[2]))
    out: dict[str, Any] = {}
    for arch in p.archs:
        try:
            cfg = _arch_cfg(arch, p)
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            split = make_split(len(y), 0, val_size=p.val, val_frac=0.5, num_blocks=2, min_block=p.subset)
            trainer = Trainer(cfg, x, y, NUM_CLASSES, split, device,
                              numerics=JobNumerics(channels_last=cfg.training.channels_last))
            subset = split.order[: p.subset]
            opts = cfg.training

            def epochs(k: int, models: int, trainer: Trainer = trainer, subset: Any = subset,
                       opts: Any = opts) -> float:
                members = []
                for j in range(models):
                    m = trainer.member(subset, ("throughput", j))
                    fc = dataclasses.replace(m.cfg, patience=k, max_epochs=k, progress=False, warmup_steps=0,
                                             min_steps=0, patience_min_steps=0)
                    members.append(dataclasses.replace(m, cfg=fc))
                _sync(device)
                t0 = time.perf_counter()
                if models == 1:  # as a job trains one model (Trainer.train): fit(), not a group of one
                    fit(members[0], trainer.train_set(), trainer.regularizer)
                else:
                    fit_group(members, trainer.train_set(),  # the stacked engine: one group, whatever the device
                              GroupOptions(engine="stacked", workers=opts.workers, compile=opts.compile,
                                           progress=False, fused_optimizer=False, rows=None,
                                           poll_every=opts.poll_every))
                _sync(device)
                return time.perf_counter() - t0

            def per_epoch(models: int) -> float:
                if p.quick:  # toy: the path, not the figure
                    return epochs(1, models)
                one, three = epochs(1, models), epochs(3, models)
                return (three - one) / 2 if three > one else three / 3  # start-up cost removed when measurable

            if not p.quick:
                epochs(1, 1)  # warm-up: kernels, allocator, cuDNN autotuning
            res: dict[str, Any] = {"subset": len(subset), "val": len(split.val_idx), "epoch_s": per_epoch(1)}
            model = trainer.member(subset, ("eval", 0)).model.eval()
            everything = torch.arange(len(y))
            cross_entropy_sum(model, trainer.data.all(everything[:2048]), trainer.y[:2048])  # warm-up
            _sync(device)
            t0 = time.perf_counter()
            cross_entropy_sum(model, trainer.data.all(everything), trainer.y)
            _sync(device)
            res["eval_sps"] = len(y) / (time.perf_counter() - t0)
            val_s = len(split.val_idx) / res["eval_sps"]
            res["train_sps"] = len(subset) / max(res["epoch_s"] - val_s, 1e-9)
            res["channels_last"] = bool(trainer.numerics is not None and trainer.numerics.formats)
            if res["channels_last"] and not p.quick:  # the same figure in the default layout: what it gains
                trainer.numerics = JobNumerics(channels_last=False)
                res["train_sps_channels_last_off"] = len(subset) / max(per_epoch(1) - val_s, 1e-9)
                trainer.numerics = JobNumerics(channels_last=cfg.training.channels_last)
            probe = trainer.member(subset, ("probe", 0))
            # whether the architecture can train as one stacked group (the engine's own verdict), and whether a job
            # groups its block models by default (`training.parallel_models=auto`, with the engine the job resolves
            # for it: the loop engine where the registry says it does not vectorise)
            why = why_not_vectorized(probe.model, probe.optimizer, trainer.regularizer, "stacked")
            res["vectorises"] = why is None
            res["grouped_by_default"] = why_not_vectorized(probe.model, probe.optimizer, trainer.regularizer,
                                                           trainer.engine) is None
            res["engine_by_default"] = trainer.engine
            if why is not None:
                res["why_not_vectorised"] = why
            if res["vectorises"] and p.group > 1:
                res["group_models"] = p.group
                res["group_epoch_s"] = per_epoch(p.group)
                res["group_model_sps"] = p.group * len(subset) / res["group_epoch_s"]
            res["params"] = sum(t.numel() for t in model.parameters())
            res.update(_memory(device))
            out[arch] = res
            del trainer, model
        except Exception as err:  # one architecture failing does not lose the others
            out[arch] = {"error": f"{type(err).__name__}: {err}".splitlines()[0][:300]}
        print(f"{arch}: {out[arch]}", flush=True)
    return out


def loop(p: Payload) -> dict[str, Any]:
    """Train one model (batch 128, augmentation) in a plain loop for `seconds`, after the others are ready:
    touches p.ready, waits for p.go, then counts samples. Several at once share the device."""
    import torch

    from training.engine.augment import crop_flip
    from training.tasks.mdl.splits import make_split
    from training.tasks.mdl.trainer import Trainer

    device = torch.device(p.device)
    x, y = cifar_like(p.n, (p.shape[0], p.shape[1], p.shape[2]))
    cfg = _arch_cfg(p.arch, p)
    split = make_split(len(y), 0, val_size=p.val, val_frac=0.5, num_blocks=2, min_block=p.subset)
    trainer = Trainer(cfg, x, y, NUM_CLASSES, split, device)
    m = trainer.member(split.order, ("loop", 0))
    model, opt = m.model.train(), m.optimizer
    opt.train()  # type: ignore[attr-defined]  # schedule-free's train()/eval(); the library is untyped
    gen, crops = torch.Generator(device=device).manual_seed(0), torch.Generator().manual_seed(1)  # crops: CPU
    bs = 128

    def step() -> None:
        idx = torch.randint(0, len(y), (bs,), device=device, generator=gen)
        loss = torch.nn.functional.cross_entropy(model(crop_flip(trainer.data.all(idx), crops)), trainer.y[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    for _ in range(10):
        step()
    _sync(device)
    Path(p.ready).touch()
    t_wait = time.monotonic()
    while not Path(p.go).exists():
        if time.monotonic() - t_wait > p.wait_s:
            raise TimeoutError("no go signal from the report")
        time.sleep(0.01)
    t0, steps = time.perf_counter(), 0
    while True:
        for _ in range(10):
            step()
        steps += 10
        _sync(device)
        if time.perf_counter() - t0 >= p.seconds:
            break
    seconds = time.perf_counter() - t0
    return {"arch": p.arch, "steps": steps, "seconds": seconds, "sps": steps * bs / seconds, **_memory(device)}


def device(p: Payload) -> dict[str, Any]:
    import torch

    d = torch.device(p.device)
    props = torch.cuda.get_device_properties(d)
    return {"type": "cuda", "name": torch.cuda.get_device_name(d), "total_memory_gb": props.total_memory / 1e9,
            "capability": f"{props.major}.{props.minor}", "multiprocessors": props.multi_processor_count,
            "count": torch.cuda.device_count()}


KINDS = {"device": device, "job": job, "erasers": erasers, "throughput": throughput, "loop": loop}


def main() -> None:
    kind, payload = sys.argv[1], Payload.from_json(sys.argv[2])
    if payload.threads is not None:
        import torch

        torch.set_num_threads(payload.threads)
    result = KINDS[kind](payload)
    sys.stdout.flush()
    print("RESULT " + json.dumps(result), flush=True)


if __name__ == "__main__":
    os.environ.setdefault("WANDB_MODE", "disabled")
    main()
