"""The schedule-free AdamW update as one loop over flat arrays, compiled by numba (CPU, releases the GIL).

One pass over (y, z, v, g) instead of nine whole-tensor passes, no C++ compiler needed (numba's LLVM), and
`nogil`: worker threads (`training.workers`) step their groups concurrently. The formulas are the
library's (schedulefree 1.4, AdamWScheduleFree.step) with torch's lerp; results agree with it to float32
rounding (torch contracts some multiply-adds into FMAs, this loop does not).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numba
import numpy as np
from torch import Tensor

if TYPE_CHECKING:
    from training.engine.stacked_optim import StepScalars


@numba.njit(inline="always")
def _normalised_grad(v, g, y, i, bc2, beta2, omb2, eps, decay):  # noqa: ANN001, ANN202 - numba types
    """Second-moment update of element i (in place) and its normalised, weight-decayed gradient."""
    gi = g[i]
    vi = v[i] * beta2 + omb2 * gi * gi
    v[i] = vi
    return gi / (np.sqrt(vi / bc2) + eps) + decay * y[i]


@numba.njit(nogil=True, cache=True, boundscheck=False, error_model="numpy")
def _update(y, z, v, g, lr, ckp1, omw, bc2, coef, beta2, omb2, eps, decay):  # noqa: ANN001, ANN202 - numba types
    # torch.lerp: w < 0.5 → y + w·(z − y), else z − (z − y)·(1 − w); the branch is hoisted so the loops vectorise
    if ckp1 < 0.5:
        for i in range(y.shape[0]):
            gn = _normalised_grad(v, g, y, i, bc2, beta2, omb2, eps, decay)
            yi, zi = y[i], z[i]
            y[i] = (yi + ckp1 * (zi - yi)) + coef * gn
            z[i] = zi - lr * gn
    else:
        for i in range(y.shape[0]):
            gn = _normalised_grad(v, g, y, i, bc2, beta2, omb2, eps, decay)
            yi, zi = y[i], z[i]
            y[i] = (zi - (zi - yi) * omw) + coef * gn
            z[i] = zi - lr * gn


def sf_update_numba(y: Tensor, z: Tensor, v: Tensor, g: Tensor, s: StepScalars, group: Mapping[str, Any]) -> None:
    """In place on contiguous CPU tensors of one dtype; the scalars are rounded to that dtype as torch does."""
    t, beta2 = y.numpy().dtype.type, group["betas"][1]
    _update(y.numpy(), z.numpy(), v.numpy(), g.numpy(), t(s.lr), t(s.ckp1), t(1) - t(s.ckp1), t(s.bc2), t(s.coef),
            t(beta2), t(1 - beta2), t(group["eps"]), t(group["weight_decay"]))
