"""μP coordinate check for every registered architecture: PNG plots + fitted slopes (μP vs standard parametrisation).

    python -m scripts.coord_check                      # all archs, sklearn digits (8×8), outputs/coord_checks/
    python -m scripts.coord_check --arch mlp lenet --data random32 --seeds 3

Each architecture runs with the settings it declares where it registers (`coord=CoordSettings(...)`,
models/registry.py: overrides of its yaml, the widths, lr and steps). For each width the model is built by
`models.build_model`, trained for a few steps of the μP schedule-free AdamW (`models.make_optimizer`) on one
fixed batch, and the mean |activation| of every submodule is recorded. The printed slope is the least-squares
slope of log(mean |activation|) against log(width) at the last step: ≈ 0 under μP, clearly positive under SP.
`max|slope|` is over all submodules.
"""

from __future__ import annotations

import argparse
import json
import math
import os
from pathlib import Path

import torch

from models.coord import LOGITS, CoordResult, coord_check
from models.registry import ARCHS, arch_traits
from training.app.schema import group_config


def batch(kind: str, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    if kind == "digits":
        from sklearn.datasets import load_digits

        d = load_digits()
        x = torch.tensor(d.data[:n], dtype=torch.float32).reshape(-1, 1, 8, 8) / 16.0
        return x, torch.tensor(d.target[:n])
    g = torch.Generator().manual_seed(0)
    return torch.rand(n, 3, 32, 32, generator=g), torch.randint(0, 10, (n,), generator=g)


def plot(result: CoordResult, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    nsteps = len(next(iter(result.l1.values()))[0])
    fig, axes = plt.subplots(1, nsteps, figsize=(4 * nsteps, 3.6), sharey=True)
    cmap = plt.get_cmap("viridis")
    names = sorted(result.l1)
    for t, ax in enumerate(axes):
        for i, name in enumerate(names):
            ys = [row[t] for row in result.l1[name]]
            if all(y > 0 for y in ys):
                style = {"color": "red", "lw": 2} if name == LOGITS else {"color": cmap(i / len(names)), "lw": 0.8}
                ax.plot(result.widths, ys, **style)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log", base=2)
        ax.set_title(f"step {t}")
        ax.set_xlabel("width")
    axes[0].set_ylabel("mean |activation|  (red: logits)")
    fig.suptitle(f"{result.arch} {result.parametrization}: max|slope| {result.max_abs_slope:.2f}, "
                 f"logits slope {result.logits_slope:.2f} (last step)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--arch", nargs="+", default=ARCHS.names(), choices=ARCHS.names())
    ap.add_argument("--data", default="digits", choices=["digits", "random32"])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--out", type=Path, default=Path("outputs/coord_checks"))
    args = ap.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))
    args.out.mkdir(parents=True, exist_ok=True)
    data = batch(args.data)
    summary = {}
    print(f"{'arch':9s} {'param':5s} {'max|slope|':>10s} {'max slope':>10s} {'logits':>8s}  worst module")
    for name in args.arch:
        s = arch_traits(name).coord
        for param in ("mup", "sp"):
            arch = group_config("arch", name, **s.arch)
            r = coord_check(arch, s, data, parametrization=param, seeds=tuple(range(args.seeds)), num_classes=10)
            worst = max(r.slopes, key=lambda k: abs(r.slopes[k]))
            print(f"{name:9s} {param:5s} {r.max_abs_slope:10.2f} {r.max_slope:10.2f} {r.logits_slope:8.2f}  "
                  f"{worst} ({r.slopes[worst]:+.2f})", flush=True)  # fmt: skip
            plot(r, args.out / f"{name}_{param}_{args.data}.png")
            summary[f"{name}/{param}"] = {"widths": r.widths, "lr": s.lr, "nsteps": s.nsteps,
                                          "max_abs_slope": r.max_abs_slope, "max_slope": r.max_slope,
                                          "logits_slope": r.logits_slope,
                                          "slopes": {k: v for k, v in r.slopes.items() if math.isfinite(v)}}
    (args.out / f"slopes_{args.data}.json").write_text(json.dumps(summary, indent=1))
    print(f"plots and slopes_{args.data}.json in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
