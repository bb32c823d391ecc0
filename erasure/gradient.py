"""Gradient-based moment erasure (paper §2.4): optimise the images of each class directly.

Per class k, in logit space (x = sigmoid(z), so pixels stay in (0, 1)), minimise with L-BFGS
(strong-Wolfe line search) the paper's squared loss
    w_mean ‖mean_k(x) − μ‖₂² + w_cov ‖Σ_k(x) − Σ‖_F² + w_mse · mean((x − x₀)²)
where μ, Σ are the unconditional mean and covariance of the original data (fixed targets) and x₀ the
original images of the class. The paper's loss averages the mean and covariance terms over classes and
the edit over all images; the classes' terms are independent, so per class that is this loss up to a
constant factor when classes are balanced. Paper weights for CIFAR-10: mean 0.01, cov 0.01, mse 1;
100 iterations. `loss="norm"` uses the unsquared norms ‖mean_k − μ‖₂ and ‖Σ_k − Σ‖_F instead, as the paper's
code did (torch.norm); the mse term is the same either way. `quantize`: store the result in 8 bits (k/255), as
the paper's uploaded images were (default off: float data); `quantize_mode` "round" (nearest level, default)
or "truncate" (⌊255·x⌋/255, what a cast to uint8 does). Produces an edited dataset, not a reusable eraser.
"""

from __future__ import annotations

import time
from typing import Any, Literal, overload

import numpy as np
import torch
from torch import Tensor

from .moments import check_labels, flatten_features, sym
from .progress import progress_bar
from .registry import ERASERS

DEFAULTS: dict[str, Any] = {"w_mean": 0.01, "w_cov": 0.01, "w_mse": 1.0, "iterations": 100, "history_size": 10,
                            "logit_eps": 1e-3, "quantize": False, "dtype": "float64", "device": "auto",
                            "progress": True, "loss": "squared", "quantize_mode": "round"}
CHOICES: dict[str, tuple[str, ...]] = {"loss": ("squared", "norm"), "quantize_mode": ("round", "truncate"),
                                       "dtype": ("float64", "float32")}
RUNTIME_OPTIONS = ("device", "progress")  # where and how visibly it runs: not part of the cache key or job hash


@overload
def erase_dataset(x: Tensor | np.ndarray, y: Tensor | np.ndarray, *, return_report: Literal[False] = ...,
                  **options: Any) -> Tensor: ...


@overload
def erase_dataset(x: Tensor | np.ndarray, y: Tensor | np.ndarray, *, return_report: Literal[True],
                  **options: Any) -> tuple[Tensor, dict[str, Any]]: ...


def erase_dataset(x: Tensor | np.ndarray, y: Tensor | np.ndarray, *, return_report: bool = False,
                  **options: Any) -> Tensor | tuple[Tensor, dict[str, Any]]:
    """Edited copy of `x` (same shape, dtype and device), and the report if `return_report`.

    Options (defaults in DEFAULTS): w_mean, w_cov, w_mse, iterations (L-BFGS max_iter per class),
    history_size, logit_eps (pixels are clamped to [eps, 1 − eps] before the logit), loss ("squared": the
    paper's text; "norm": unsquared norms, the paper's code), quantize (store the edited pixels as multiples of
    1/255) with quantize_mode ("round" or "truncate"), dtype ("float64" or "float32" for the optimisation), device
    ("auto" = CUDA when available, else x's device), progress. Gaps in the report are relative:
    ‖mean_k − μ‖ / √tr Σ and ‖Σ_k − Σ‖_F / ‖Σ‖_F (after quantisation when it is on).
    """
    unknown = set(options) - set(DEFAULTS)
    if unknown:
        raise TypeError(f"gradient: unknown options {sorted(unknown)}; known: {sorted(DEFAULTS)}")
    o = {**DEFAULTS, **options}
    for key, allowed in CHOICES.items():
        if o[key] not in allowed:
            raise ValueError(f"gradient: {key} must be one of {list(allowed)}; got {o[key]!r}")
    t0 = time.perf_counter()
    flat, shape = flatten_features(x)
    labels, k = check_labels(y, len(flat))
    if float(flat.min()) < 0.0 or float(flat.max()) > 1.0:
        raise ValueError("gradient: x must lie in [0, 1] (it is optimised through a sigmoid)")
    dtype = {"float64": torch.float64, "float32": torch.float32}[str(o["dtype"])]
    dev = torch.device("cuda" if torch.cuda.is_available() else flat.device) if o["device"] == "auto" \
        else torch.device(o["device"])
    x0 = flat.to(dev, dtype)
    labels = labels.to(dev)
    mu = x0.mean(0)
    xc = x0 - mu
    sigma = sym(xc.T @ xc) / (len(x0) - 1)
    del xc
    out = x0.clone()
    per_class: list[dict[str, Any]] = []
    bar = progress_bar(total=k * int(o["iterations"]), desc="gradient erasure", disable=not o["progress"], leave=False)
    for c in range(k):
        idx = (labels == c).nonzero().flatten()
        out[idx], stats = _optimise_class(x0[idx], mu, sigma, o)
        if o["quantize"]:
            out[idx] = quantize(out[idx], o["quantize_mode"])
            with torch.no_grad():
                stats["quantized"] = _loss(out[idx], x0[idx], mu, sigma, o)[1]
        per_class.append({"class": c, **stats})
        bar.update(int(o["iterations"]))
    bar.close()
    erased = out.to(flat.device, flat.dtype).reshape(shape)
    final = "quantized" if o["quantize"] else "end"
    if not return_report:
        return erased
    report = {"name": "gradient", "n": len(flat), "d": flat.shape[1], "k": k,
              "options": {key: o[key] for key in DEFAULTS if key != "progress"},
              "device": str(dev), "rank_removed": None, "warnings": [],
              "mean_squared_edit": float(((out - x0) ** 2).mean()),
              "max_mean_gap_before": max(p["start"]["mean_gap"] for p in per_class),
              "max_mean_gap_after": max(p[final]["mean_gap"] for p in per_class),
              "max_cov_gap_before": max(p["start"]["cov_gap"] for p in per_class),
              "max_cov_gap_after": max(p[final]["cov_gap"] for p in per_class),
              "loss": o["loss"], "quantized": bool(o["quantize"]),
              "per_class": per_class, "fit_seconds": time.perf_counter() - t0}
    return erased, report


def quantize(x: Tensor, mode: str = "round") -> Tensor:
    """x in [0, 1] as 8-bit levels k/255: nearest level ("round", halves to even) or ⌊255·x⌋ ("truncate")."""
    if mode == "round":
        return torch.round(x * 255) / 255
    if mode == "truncate":
        return torch.floor(x * 255) / 255
    raise ValueError(f"quantize_mode must be 'round' or 'truncate'; got {mode!r}")


def _optimise_class(xk0: Tensor, mu: Tensor, sigma: Tensor, o: dict[str, Any]) -> tuple[Tensor, dict[str, Any]]:
    eps = float(o["logit_eps"])
    z = torch.logit(xk0.clamp(eps, 1 - eps)).requires_grad_(True)
    opt = torch.optim.LBFGS([z], lr=1.0, max_iter=int(o["iterations"]), history_size=int(o["history_size"]),
                            line_search_fn="strong_wolfe", tolerance_grad=1e-12, tolerance_change=1e-15)
    evals = 0

    def closure() -> Tensor:
        nonlocal evals
        evals += 1
        opt.zero_grad()
        loss = _loss(torch.sigmoid(z), xk0, mu, sigma, o)[0]
        loss.backward()
        return loss

    with torch.no_grad():
        start = _loss(torch.sigmoid(z), xk0, mu, sigma, o)[1]
    opt.step(closure)
    with torch.no_grad():
        xk = torch.sigmoid(z)
        end = _loss(xk, xk0, mu, sigma, o)[1]
    iters = int(opt.state[z].get("n_iter", 0))
    return xk, {"iterations": iters, "evaluations": evals, "start": start, "end": end}


def _loss(x: Tensor, x0: Tensor, mu: Tensor, sigma: Tensor, o: dict[str, Any]) -> tuple[Tensor, dict[str, float]]:
    """The objective, and (only outside autograd) its terms as floats relative to the data scale."""
    m = x.mean(0)
    xc = x - m
    cov = xc.T @ xc / (len(x) - 1)
    if o["loss"] == "squared":
        mean_sq = (m - mu).pow(2).sum()  # squared distances, as in the paper's text (§2.4)
        cov_sq = (cov - sigma).pow(2).sum()
        mean_term, cov_term = mean_sq, cov_sq
    else:  # unsquared norms, as in the paper's code (torch.norm; a zero-safe subgradient at 0)
        mean_term = torch.linalg.vector_norm(m - mu)
        cov_term = torch.linalg.matrix_norm(cov - sigma)
        mean_sq, cov_sq = mean_term.detach() ** 2, cov_term.detach() ** 2
    mse = ((x - x0) ** 2).mean()
    loss = o["w_mean"] * mean_term + o["w_cov"] * cov_term + o["w_mse"] * mse
    if torch.is_grad_enabled():
        return loss, {}
    scale = float(torch.trace(sigma)) ** 0.5 or 1.0
    stats = {"loss": float(loss), "mean_gap": float(mean_sq) ** 0.5 / scale,
             "cov_gap": float(cov_sq) ** 0.5 / (float(torch.linalg.matrix_norm(sigma)) or 1.0), "mse": float(mse)}
    return loss, stats


ERASERS.add("gradient", erase_dataset, family="quadratic", kind="edit", defaults=DEFAULTS, needs_labels=True,
            runtime_options=RUNTIME_OPTIONS, read_only_with={"quantize_mode": ("quantize", (True,))},
            input_range=(0.0, 1.0))
