"""What `training.precision=bf16` changes in bits/sample, against seed noise, on experiment=demo's cells (CPU:
autocast to bfloat16 runs there).

    python -m tools.measure_precision --erasers control,leace --seeds 0,1,2 --out /tmp/precision

Runs `python -m training.run -m experiment=demo` for each precision (fp32, bf16) over the given erasers and seeds,
then prints per cell: the fp32 mean ± seed SD, the bf16 mean, the paired per-seed differences (bf16 − fp32), and
|mean difference| / seed SD. Reuses finished jobs in --out (a rerun only tables).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
from pathlib import Path

from training.app.result_codec import config_view

ROOT = Path(__file__).resolve().parents[1]


def run(out: Path, erasers: str, seeds: str, precision: str, extra: list[str]) -> None:
    cmd = [sys.executable, "-m", "training.run", "-m", "experiment=demo", "logger=none", "progress=false",
           f"eraser={erasers}", f"seed={seeds}", f"training.precision={precision}", f"paths.out_dir={out}", *extra]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    subprocess.run(cmd, cwd=ROOT, env=env, check=True)


def collect(out: Path) -> dict[tuple[str, str], dict[int, float]]:
    """(eraser, precision) -> seed -> bits/sample of every finished result under `out`."""
    found: dict[tuple[str, str], dict[int, float]] = {}
    for path in out.rglob("result.json"):
        res = json.loads(path.read_text())
        cfg = config_view(res["config"])  # every declared key, at its default where the result lacks it
        key = (str(cfg["eraser.name"]), str(res["provenance"]["numerics"]["precision"]))  # the signature's
        found.setdefault(key, {})[int(cfg["seed"])] = float(res["mdl"]["bits_per_sample"])
    return found


def table(found: dict[tuple[str, str], dict[int, float]]) -> list[str]:
    lines = ["| eraser | fp32 mean ± seed SD | bf16 mean ± seed SD | bf16 − fp32 per seed | |mean Δ| / seed SD |",
             "|---|---|---|---|---|"]
    for eraser in sorted({e for e, _ in found}):
        a, b = found.get((eraser, "fp32"), {}), found.get((eraser, "bf16"), {})
        seeds = sorted(set(a) & set(b))
        if len(seeds) < 2:
            continue
        fa, fb = [a[s] for s in seeds], [b[s] for s in seeds]
        sd = statistics.stdev(fa)
        diffs = [y - x for x, y in zip(fa, fb, strict=True)]
        ratio = abs(statistics.mean(diffs)) / sd if sd > 0 else math.inf
        lines.append(f"| {eraser} | {statistics.mean(fa):.4f} ± {sd:.4f} | {statistics.mean(fb):.4f} ± "
                     f"{statistics.stdev(fb):.4f} | {' '.join(f'{d:+.4f}' for d in diffs)} | {ratio:.2f} |")
    return lines


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--erasers", default="control,leace,qleace,alf_qleace,gradient,random")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--out", default="outputs/precision")
    p.add_argument("override", nargs="*", help="extra training.run overrides")
    args = p.parse_args(argv)
    out = Path(args.out).resolve()
    for precision in ("fp32", "bf16"):
        run(out, args.erasers, args.seeds, precision, args.override)
    print("\n".join(table(collect(out))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
