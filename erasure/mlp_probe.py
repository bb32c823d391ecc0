"""The certificate's MLP probe: a small one-hidden-layer ReLU network, deterministic and seeded, fitted in float32.

The MDL learner is an MLP, so the certificate asks an MLP too: a probe that can find class information of any
order the linear (LDA) and quadratic (QDA) probes cannot, e.g. the sign parity of three coordinates (equal class
means and covariances). It is fitted on one part of a training half and early-stopped and calibrated (temperature,
`_select` of erasure/certificate.py) on the other part, then scores the held-out half; no refit, to stay cheap
(it runs in every job).
"""

from __future__ import annotations

import torch
from torch import Tensor

MAX_DIMS = 256  # inputs: the leading principal coordinates of the training half (all of them up to this many)
HIDDEN = 64
STEPS = 150  # full-batch Adam steps
CHECK_EVERY = 15  # the calibration rows' loss is checked (early stopping: the best check is kept)
LR = 1e-2
WEIGHT_DECAY = 1e-4


class MLP:
    """relu(x W1ᵀ + b1) W2ᵀ + b2, parameters drawn from a seeded generator: built without torch.nn, whose layers
    draw their initial weights from the global RNG (and so would change the MDL training that follows)."""

    def __init__(self, d: int, k: int, seed: int, device: torch.device) -> None:
        gen = torch.Generator(device="cpu").manual_seed(seed)
        self.params = [torch.randn(HIDDEN, d, generator=gen) * d ** -0.5, torch.zeros(HIDDEN),
                       torch.randn(k, HIDDEN, generator=gen) * (0.1 * HIDDEN ** -0.5), torch.zeros(k)]
        self.params = [p.to(device).requires_grad_() for p in self.params]

    def __call__(self, x: Tensor) -> Tensor:
        w1, b1, w2, b2 = self.params
        return torch.relu(x @ w1.T + b1) @ w2.T + b2


def fit_mlp(x: Tensor, y: Tensor, k: int, x_check: Tensor, y_check: Tensor, seed: int) -> MLP:
    """An MLP fitted on (x, y) (float32, full batch), the state with the lowest log-loss on (x_check, y_check)."""
    model = MLP(x.shape[1], k, seed, x.device)
    opt = torch.optim.Adam(model.params, lr=LR, weight_decay=WEIGHT_DECAY)
    best, best_state = float("inf"), [p.detach().clone() for p in model.params]
    with torch.enable_grad():  # the caller may run under no_grad
        for step in range(1, STEPS + 1):
            opt.zero_grad(set_to_none=True)
            torch.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            if step % CHECK_EVERY:
                continue
            with torch.no_grad():
                loss = float(torch.nn.functional.cross_entropy(model(x_check), y_check))
            if loss < best:
                best, best_state = loss, [p.detach().clone() for p in model.params]
    model.params = best_state
    return model


def mlp_scores(xtr: Tensor, ytr: Tensor, xte: Tensor, k: int, inner: list[Tensor],
               seed: int) -> tuple[Tensor, Tensor, Tensor]:
    """(calibration scores, calibration labels, held-out scores) of an MLP fitted on the first inner part of the
    training half; scores in float64 (log-softmax of the logits)."""
    fit_rows, cal_rows = inner
    dims = min(xtr.shape[1], MAX_DIMS)
    f32 = [t[:, :dims].float() for t in (xtr[fit_rows], xtr[cal_rows], xte)]
    model = fit_mlp(f32[0], ytr[fit_rows], k, f32[1], ytr[cal_rows], seed)
    with torch.no_grad():
        cal, test = (torch.log_softmax(model(t), dim=1).double() for t in (f32[1], f32[2]))
    return cal, ytr[cal_rows], test
