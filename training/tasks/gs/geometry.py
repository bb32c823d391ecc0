"""Decision-boundary geometry of a 2-D classifier: input-space margins and how curved the boundary is.

The zero level set of the logit is traced on a grid (contourpy, linear interpolation along cell edges).
A ReLU net's logit is piecewise linear, so its Hessian is zero almost everywhere and analytic curvature
says nothing; we measure the traced boundary instead:

- margin of a point: distance to the nearest boundary segment, negative when the point is misclassified;
- turning: total absolute turning angle (radians) of the boundary inside the data's bounding box, after
  resampling at a fixed arc length (a straight boundary has 0, a half circle π);
- line_rms: RMS distance of those boundary points from their best-fitting straight line.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

Logit = Callable[[np.ndarray], np.ndarray]  # (m, 2) points -> (m,) logits (> 0 means class 1)


@dataclass
class Grid:
    xs: np.ndarray  # (n,)
    ys: np.ndarray  # (n,)
    z: np.ndarray  # (n, n) logits, z[i, j] at (xs[j], ys[i])


def point_segment_distances(points: np.ndarray, lines: list[np.ndarray]) -> np.ndarray:
    """Distance from each point to the nearest segment of any polyline (inf when there is none)."""
    if not lines:
        return np.full(len(points), np.inf)
    a = np.concatenate([ln[:-1] for ln in lines])
    b = np.concatenate([ln[1:] for ln in lines])
    ab = b - a
    best = np.full(len(points), np.inf)
    for start in range(0, len(points), 256):  # bounded memory: 256 points x all segments at a time
        p = points[start: start + 256, None, :]
        t = np.clip(((p - a) * ab).sum(-1) / np.maximum((ab * ab).sum(-1), 1e-300), 0.0, 1.0)
        d = np.linalg.norm(p - (a + t[..., None] * ab), axis=-1)
        best[start: start + 256] = d.min(axis=1)
    return best


def _resample(line: np.ndarray, step: float) -> np.ndarray:
    seg = np.linalg.norm(np.diff(line, axis=0), axis=1)
    s = np.concatenate([[0.0], np.cumsum(seg)])
    if s[-1] < 2 * step:
        return line[[0, -1]]
    t = np.linspace(0.0, s[-1], int(s[-1] / step) + 1)
    return np.stack([np.interp(t, s, line[:, 0]), np.interp(t, s, line[:, 1])], axis=1)


def curvature_stats(lines: list[np.ndarray], lo: np.ndarray, hi: np.ndarray, step: float = 0.05) -> dict[str, float]:
    pieces = []
    for ln in lines:  # the parts of the polylines whose vertices lie inside the box [lo, hi], resampled
        inside = np.all((ln >= lo) & (ln <= hi), axis=1)
        edges = np.flatnonzero(np.diff(np.concatenate([[0], inside.astype(np.int8), [0]])))
        pieces += [_resample(ln[s:e], step) for s, e in zip(edges[::2], edges[1::2], strict=True) if e - s >= 2]
    if not pieces:
        return {"turning": float("nan"), "line_rms": float("nan"), "length": 0.0}
    turning = 0.0
    for p in pieces:
        d = np.diff(p, axis=0)
        ang = np.arctan2(d[:, 1], d[:, 0])
        turning += float(np.abs(np.angle(np.exp(1j * np.diff(ang)))).sum())
    pts = np.concatenate(pieces)
    centered = pts - pts.mean(axis=0)
    # Total least squares: the smallest singular value measures the spread around the best line.
    sv = np.linalg.svd(centered, compute_uv=False)
    length = float(sum(np.linalg.norm(np.diff(p, axis=0), axis=1).sum() for p in pieces))
    return {"turning": turning, "line_rms": float(sv[-1] / np.sqrt(len(pts))), "length": length}


def geometry(f: Logit, x: np.ndarray, y: np.ndarray, lo: float = -2.5, hi: float = 2.5, n: int = 301) -> tuple[
        dict[str, float], Grid]:
    """Margins of the points (x, y) and curvature of the boundary inside their bounding box."""
    import contourpy

    xs = np.linspace(lo, hi, n)
    gx, gy = np.meshgrid(xs, xs)
    grid = Grid(xs, xs.copy(), f(np.stack([gx.ravel(), gy.ravel()], axis=1)).reshape(n, n))
    gen = contourpy.contour_generator(grid.xs, grid.ys, grid.z, line_type=contourpy.LineType.Separate)
    lines = [np.asarray(line, dtype=np.float64) for line in gen.lines(0.0) if len(line) >= 2]  # the zero level set
    correct = (f(x) > 0).astype(np.int64) == y
    margins = point_segment_distances(x, lines) * np.where(correct, 1.0, -1.0)
    stats = curvature_stats(lines, x.min(axis=0), x.max(axis=0))
    return {"min_margin": float(margins.min()), "mean_margin": float(margins.mean()),
            "median_margin": float(np.median(margins)), **{f"boundary_{k}": v for k, v in stats.items()}}, grid
