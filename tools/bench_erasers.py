"""Fit time and peak memory of our erasers vs concept-erasure 0.2.4 (float64), and ALF-QLEACE vs a dense
d³-update variant, on synthetic class-conditional Gaussians with a CIFAR-like power-law spectrum.

    python -m tools.bench_erasers                      # d=1024, k=10, n=20000 on CPU
    python -m tools.bench_erasers --d 3072 --device cuda

Every method runs in its own subprocess (clean peak memory: RSS on CPU, max_memory_allocated on CUDA) on
the same data file. Accuracy is compared too: QLEACE maps vs concept-erasure's, both barycenters'
stationarity residual ‖Σ_k w_k T_k⁻¹ − I‖_F/√d, and the ALF subspaces. concept-erasure is only a
reference here; erasure/ never imports it. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from tools.bench_worker import rss_mb, run_worker, write_json

ALPHA, HET = 1.5, 0.3  # the spectrum's power-law exponent, the class covariances' heterogeneity
METHODS = ["ours_leace", "ce_leace", "ce_qleace", "ours_qleace", "ours_qleace_eq", "ours_alf", "dense_alf"]


def make_data(n: int, d: int, k: int, seed: int = 0, alpha: float = ALPHA, het: float = HET) -> tuple[Tensor, Tensor]:
    """Power-law spectrum i^-alpha in a random basis, class-specific distortions I + het·sym(noise)/√d."""
    g = torch.Generator().manual_seed(seed)
    f64 = torch.float64
    scale = torch.arange(1, d + 1, dtype=f64) ** (-alpha / 2)
    basis, _ = torch.linalg.qr(torch.randn(d, d, generator=g, dtype=f64))
    y = torch.arange(n) % k
    x = torch.empty(n, d, dtype=f64)
    for c in range(k):
        noise = torch.randn(d, d, generator=g, dtype=f64) * het / d**0.5
        mix = torch.eye(d, dtype=f64) + (noise + noise.T) / 2
        idx = (y == c).nonzero().flatten()
        z = torch.randn(len(idx), d, generator=g, dtype=f64) * scale
        mean = 0.3 * torch.randn(d, generator=g, dtype=f64) * scale
        x[idx] = (z @ basis.T + mean) @ mix.T
    perm = torch.randperm(n, generator=g)
    return x[perm], y[perm]


def dense_alf(x: Tensor, y: Tensor, rank: int) -> Tensor:
    """Reference ALF-QLEACE: dense P Σ_k P products and a full eigh per class at every step (O(k·d³))."""
    import erasure

    xl = erasure.fit("leace", x, y)(x)
    k = int(y.max()) + 1
    covs = torch.stack([torch.cov(xl[y == c].T) for c in range(k)])
    priors = torch.bincount(y, minlength=k).to(covs) / len(y)
    avg = torch.einsum("k,kij->ij", priors, covs)
    p = torch.eye(x.shape[1], dtype=covs.dtype, device=covs.device)
    dirs = []
    for _ in range(rank):
        vals, vecs = torch.linalg.eigh(p @ covs @ p - p @ avg @ p)
        worst = vals.abs().amax(-1)
        c = int(worst.argmax())
        v = vecs[c, :, int(vals[c].abs().argmax())]
        dirs.append(v)
        p = p - torch.outer(v, v)
    return torch.stack(dirs, 1)


def stationarity(maps: Tensor, priors: Tensor) -> float:
    """‖Σ_k w_k T_k⁻¹ − I‖_F / √d: zero iff the common target of the maps is the barycenter."""
    inv = torch.cholesky_inverse(torch.linalg.cholesky((maps + maps.mT) / 2))
    eye = torch.eye(maps.shape[-1], dtype=maps.dtype, device=maps.device)
    resid = torch.einsum("k,kij->ij", priors.to(maps), inv) - eye
    return float(torch.linalg.matrix_norm(resid)) / maps.shape[-1] ** 0.5


class _RssSampler(threading.Thread):
    """Peak resident memory (MB) above the level at start, sampled every 5 ms."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.base = self.peak = rss_mb()
        self.running = True

    def run(self) -> None:
        while self.running:
            self.peak = max(self.peak, rss_mb())
            time.sleep(0.005)

    def stop(self) -> float:
        self.running = False
        self.join()
        return max(self.peak, rss_mb()) - self.base


def _warm_up(device: str) -> None:
    """First LAPACK/BLAS calls pay one-off initialisation; keep it out of the timings."""
    a = torch.randn(64, 64, dtype=torch.float64, device=device)
    a = a @ a.T + torch.eye(64, dtype=torch.float64, device=device)
    torch.linalg.eigh(a), torch.linalg.eigvalsh(a), torch.linalg.svd(a), torch.linalg.cholesky(a)
    torch.linalg.lstsq(a, a[:, :2])


def worker(method: str, data: str, out: str, device: str, rank: int, threads: int, tol: float | None = None) -> dict:
    import erasure

    if threads:
        torch.set_num_threads(threads)
    out_dir = Path(out)
    x, y = torch.load(data, weights_only=True)
    x, y = x.to(device), y.to(device)
    k = int(y.max()) + 1
    priors = torch.bincount(y, minlength=k).double() / len(y)
    _warm_up(device)
    cuda = x.is_cuda
    if cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        base = torch.cuda.memory_allocated()
    sampler = _RssSampler()
    sampler.start()
    t0 = time.perf_counter()
    result: dict = {"method": method}
    if method == "ours_leace":
        erasure.fit("leace", x, y)
    elif method == "ce_leace":
        from concept_erasure import LeaceFitter

        z = torch.nn.functional.one_hot(y, k).to(x)
        _ = LeaceFitter.fit(x, z, shrinkage=False, constrain_cov_trace=False, svd_tol=1e-9).eraser
    elif method in ("ours_qleace", "ours_qleace_eq"):
        e = erasure.fit("qleace", x, y, **({"tol": tol} if tol is not None else {}))
        assert isinstance(e, erasure.qleace.QleaceEraser)
        maps = e.maps_full()
        rep = e.report()
        result.update(iterations=rep["barycenter_iterations"], residual=rep["barycenter_residual"])
    elif method == "ce_qleace":
        from concept_erasure import QuadraticFitter

        maps = QuadraticFitter.fit(x, y, shrinkage=False).eraser.ot_maps
    elif method == "ours_alf":
        e = erasure.fit("alf_qleace", x, y, target=1.0, max_rank=rank)
        dirs = e.state["directions"]
        result["final_worst_deviation"] = e.report()["final_worst_deviation"]
    elif method == "dense_alf":
        dirs = dense_alf(x, y, rank)
    else:
        raise ValueError(method)
    if cuda:
        torch.cuda.synchronize()
    result["seconds"] = time.perf_counter() - t0
    rss = sampler.stop()
    result["peak_mb"] = (torch.cuda.max_memory_allocated() - base) / 2**20 if cuda else rss
    if "qleace" in method:
        result["stationarity"] = stationarity(maps, priors)
        torch.save(maps.cpu(), out_dir / f"{method}.pt")
    if method.endswith("alf"):
        torch.save(dirs.cpu(), out_dir / f"{method}.pt")
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--d", type=int, default=1024)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--n", type=int, default=20000)
    ap.add_argument("--rank", type=int, default=32, help="ALF directions for the dense comparison")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    ap.add_argument("--methods", default=",".join(METHODS))
    ap.add_argument("--json", help="also write the per-method results to this JSON file")
    ap.add_argument("--worker", help=argparse.SUPPRESS)  # JSON: worker()'s arguments
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.worker:
        print(json.dumps(worker(**json.loads(args.worker))))
        return
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp)
        x, y = make_data(args.n, args.d, args.k)
        ev = torch.linalg.eigvalsh(torch.cov(x.T))
        print(f"data: n={args.n} d={args.d} k={args.k} alpha={ALPHA} het={HET} "
              f"cond(Σ)={float(ev[-1] / ev[0]):.2e} device={args.device} threads={args.threads or 'default'}")
        torch.save((x, y), out / "data.pt")
        del x, y
        results: dict[str, Any] = {}
        for method in args.methods.split(","):
            job = dict(method=method, data=str(out / "data.pt"), out=str(out), device=args.device, rank=args.rank,
                       threads=args.threads)
            if method == "ours_qleace_eq":  # stop at the accuracy concept-erasure reached
                if "ce_qleace" not in results:
                    continue
                job["tol"] = results["ce_qleace"]["stationarity"]
            try:
                r = results[method] = run_worker(__file__, job, threads=None, label=method)
            except RuntimeError as err:
                print(err)
                continue
            extra = {key: v for key, v in r.items() if key not in ("method", "seconds", "peak_mb")}
            print(f"  {method:12s} {r['seconds']:8.2f} s  peak {r['peak_mb']:8.0f} MB  {extra}", flush=True)
            if args.json:  # after every method: a run stopped later keeps the methods that finished
                write_json(Path(args.json), {"n": args.n, "d": args.d, "k": args.k, "device": args.device,
                                             "cond": float(ev[-1] / ev[0]), "results": results})
        _summary(results, out, args)


def _summary(results: dict, out: Path, args: argparse.Namespace) -> None:
    print("\nqleace: our default tol; 'qleace =acc': ours stopped at the stationarity concept-erasure reached")
    print("method        ours (s / MB)       reference (s / MB)     speed-up  memory ratio  accuracy")
    pairs = [("leace", "ours_leace", "ce_leace", "concept-erasure"),
             ("qleace", "ours_qleace", "ce_qleace", "concept-erasure"),
             ("qleace =acc", "ours_qleace_eq", "ce_qleace", "concept-erasure"),
             (f"alf r={args.rank}", "ours_alf", "dense_alf", "dense d³ variant")]
    for label, ours, ref, ref_name in pairs:
        if ours not in results or ref not in results:
            continue
        a, b = results[ours], results[ref]
        acc = ""
        if label.startswith("qleace"):
            m1, m2 = torch.load(out / f"{ours}.pt"), torch.load(out / f"{ref}.pt")
            rel = float(torch.linalg.matrix_norm(m1 - m2).max() / torch.linalg.matrix_norm(m2).max())
            acc = (f"maps rel diff {rel:.1e}; stationarity ours {a['stationarity']:.1e} "
                   f"vs ref {b['stationarity']:.1e}; iterations {a['iterations']}")
        if label.startswith("alf"):
            v1, v2 = torch.load(out / f"{ours}.pt"), torch.load(out / f"{ref}.pt")
            acc = f"projector diff {float(torch.linalg.matrix_norm(v1 @ v1.T - v2 @ v2.T)):.1e}"
        ratio_mem = b["peak_mb"] / a["peak_mb"] if a["peak_mb"] > 0 else float("nan")
        print(f"{label:12s} {a['seconds']:7.2f} / {a['peak_mb']:6.0f}   {b['seconds']:7.2f} / {b['peak_mb']:6.0f} "
              f"({ref_name})  {b['seconds'] / a['seconds']:6.1f}x  {ratio_mem:6.2f}x  {acc}")


if __name__ == "__main__":
    main()
