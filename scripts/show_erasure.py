"""The same images under every eraser, one column per eraser (paper Fig. 1), written as a PNG grid.

    python -m scripts.show_erasure                                   # MNIST-5k, all erasers
    python -m scripts.show_erasure --dataset cifar10 --data-dir data --gradient-iterations 100

Erasers are fitted on the whole dataset (or its first --limit images); the random projection removes as
many directions as ALF-QLEACE does on the same data. Erased pixels may leave [0, 1] (LEACE/QLEACE are
affine): they are clipped for display only.
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402
from torch import Tensor  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]

import erasure  # noqa: E402

TITLES = {"control": "original", "leace": "LEACE", "qleace": "QLEACE", "alf_qleace": "ALF-QLEACE",
          "gradient": "gradient", "random": "random proj."}


def main() -> None:
    from training.app.schema import group_config
    from training.data import load_dataset

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dataset", default="mnist5k")
    ap.add_argument("--data-dir", default="data")
    ap.add_argument("--limit", type=int, default=None, help="fit on the first N images only")
    ap.add_argument("--erasers", default="control,leace,qleace,alf_qleace,gradient,random")
    ap.add_argument("--images", type=int, default=6, help="rows: how many images to show")
    ap.add_argument("--gradient-iterations", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0, help="which images are shown")
    ap.add_argument("--out", type=Path, default=ROOT / "outputs" / "figures" / "erasure_grid.png")
    args = ap.parse_args()

    data = load_dataset(group_config("dataset", args.dataset, limit=args.limit), args.data_dir)
    x, y, label = data.x, data.y, data.name  # images (n, C, H, W) in [0, 1], labels
    names = args.erasers.split(",")
    gen = torch.Generator().manual_seed(args.seed)
    # one image per class first, then random ones
    firsts = [int((y == c).nonzero()[0]) for c in range(int(y.max()) + 1)]
    order = torch.tensor(firsts)[torch.randperm(len(firsts), generator=gen)].tolist()
    shown = (order + torch.randperm(len(y), generator=gen).tolist())[: args.images]

    ranks: dict[str, int] = {}  # rank removed per eraser: the source of a rank-matched baseline (`RankHint`)
    hints = {n: erasure.eraser_traits(n).rank_hint for n in names}
    ranked = {n for n, h in hints.items() if h is not None} | {h.source for h in hints.values() if h is not None}
    columns: dict[str, Tensor] = {}
    for name in names:
        opts = {"iterations": args.gradient_iterations} if "iterations" in erasure.default_options(name) else {}
        hint = hints[name]
        if hint is not None and hint.source not in ranks:
            ranks[hint.source] = erasure.erase(hint.source, x, y, {})[1]["rank_removed"]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            xe, rep = erasure.erase(name, x, y, opts, rank_hint=None if hint is None else ranks[hint.source])
        removed = rep["rank_removed"] if "rank_removed" in rep else None  # not every eraser reports one
        if removed is not None:
            ranks[name] = removed
        columns[name] = xe[shown]
        print(f"{name:10s} {rep['seconds']:7.2f} s  rank removed: {removed}")

    fig, axes = plt.subplots(len(shown), len(names), figsize=(1.6 * len(names), 1.6 * len(shown)), squeeze=False)
    for j, name in enumerate(names):
        title = TITLES.get(name, name)  # an eraser TITLES does not know: its registry name
        if name in ranked and name in ranks:
            title += f"\nrank d−{ranks[name]}"
        axes[0, j].set_title(title, fontsize=9)
        for i in range(len(shown)):
            img = columns[name][i].clamp(0, 1)
            ax = axes[i, j]
            if img.shape[0] == 1:
                ax.imshow(img[0].numpy(), cmap="gray", vmin=0, vmax=1)
            else:
                ax.imshow(img.permute(1, 2, 0).numpy())
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(f"{label}: the same images under each eraser", fontsize=10)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=150)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
