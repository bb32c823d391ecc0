"""Benchmark: cold vs warm start of a job whose eraser is cached (training.data.cache.cached_erase).

    .venv/bin/python -m tools.bench_cache                          # QLEACE on MNIST-5k (offline)
    .venv/bin/python -m tools.bench_cache --eraser leace --dataset digits

Each repeat runs the same tiny job (1 epoch per block model, no full run, no certificate: start-up + erasure) twice in
fresh subprocesses: "cold" with an empty cache directory, then "warm" with that cache and a fresh run directory, which
must fit nothing (calls to `erasure.erase` are counted; a warm fit fails the bench). Job wall time, the job's erase_s
and peak memory per variant, medians over repeats.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from tools.bench_worker import job_config, peak_mb, run_worker


def worker(cache: str, out: str, eraser: str, dataset: str, device: str) -> dict[str, Any]:
    import erasure
    from training.app.tasks import decode_result as decode
    from training.tasks.mdl.job import run_job

    fits = 0
    real_erase = erasure.erase

    def counting_erase(*a: Any, **k: Any) -> Any:
        nonlocal fits
        fits += 1
        return real_erase(*a, **k)

    erasure.erase = counting_erase  # training.inputs.erase calls it as erasure.erase, at call time
    cfg = job_config([f"paths.out_dir={out}", "logger=none", "progress=false", f"dataset={dataset}",
                      f"eraser={eraser}", "mdl=quick", "mdl.max_epochs=1", "mdl.full_run=false",
                      "certificate=false", f"paths.cache_dir={cache}", f"device={device}", "force=true"])
    t0 = time.perf_counter()
    result = run_job(cfg).result
    seconds = time.perf_counter() - t0
    assert result is not None, "the bench job skipped (force=true should rerun it)"
    return {"seconds": seconds, "erase_s": result["timings"]["erase_s"], "cache_hit": result["eraser"]["cache_hit"],
            "fits": fits, "peak_mb": peak_mb(str(decode(result).device).startswith("cuda"))}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--eraser", default="qleace", help="eraser config name (conf/eraser/)")
    p.add_argument("--dataset", default="mnist5k", help="dataset config name (offline: digits, mnist5k, ...)")
    p.add_argument("--device", default="cpu", help="auto | cpu | cuda")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--worker", help=argparse.SUPPRESS)  # JSON: worker()'s arguments
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(**json.loads(args.worker))))
        return
    print(f"bench_cache: eraser={args.eraser} on {args.dataset}, device {args.device}; job = quick MDL with 1 epoch "
          "per block model, no full run, no certificate; each run in a fresh process")
    rows: dict[str, list[dict[str, Any]]] = {"cold": [], "warm": []}
    with tempfile.TemporaryDirectory(prefix="bench_cache_") as tmp:
        for r in range(args.repeats):
            cache = str(Path(tmp) / f"cache{r}")
            for variant in ("cold", "warm"):
                job = dict(cache=cache, out=str(Path(tmp) / f"out{r}_{variant}"), eraser=args.eraser,
                           dataset=args.dataset, device=args.device)
                res = run_worker(__file__, job, threads=os.environ.get("OMP_NUM_THREADS", "1"))
                rows[variant].append(res)
                print(f"  repeat {r + 1}/{args.repeats} {variant}: job {res['seconds']:.2f} s "
                      f"(erase {res['erase_s']:.2f} s), cache_hit={res['cache_hit']}, eraser fits={res['fits']}, "
                      f"peak {res['peak_mb']:.0f} MB", flush=True)
                if variant == "warm" and (res["fits"] or not res["cache_hit"]):
                    raise SystemExit("FAIL: the warm start fitted the eraser")
                if variant == "cold" and res["fits"] != 1:
                    raise SystemExit(f"FAIL: the cold start should fit once, fitted {res['fits']} times")

    def med(v: str, key: str) -> float:
        return statistics.median(x[key] for x in rows[v])

    print(f"median job time: cold {med('cold', 'seconds'):.2f} s, warm {med('warm', 'seconds'):.2f} s → "
          f"{med('cold', 'seconds') / med('warm', 'seconds'):.1f}× faster warm; erase step: cold "
          f"{med('cold', 'erase_s'):.3f} s, warm {med('warm', 'erase_s'):.3f} s "
          f"({med('cold', 'erase_s') / max(med('warm', 'erase_s'), 1e-9):.0f}×); warm fits: 0")
    print(f"peak memory: cold {med('cold', 'peak_mb'):.0f} MB, warm {med('warm', 'peak_mb'):.0f} MB")


if __name__ == "__main__":
    main()
