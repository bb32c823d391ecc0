"""QLEACE (paper Thm 2.6): per-class optimal transport onto the Gaussian barycenter of the classes.

x' = μ + T_k (x − m_k) for x of class k, T_k = Σ_k^{-½}(Σ_k^{½} C Σ_k^{½})^{½}Σ_k^{-½}, C the barycenter of
N(0, Σ_k) with weights = class priors. Afterwards every class has mean μ and covariance C (float64).

All work happens in the eigenbasis V of the pooled within-class covariance Σ_w = Σ_k w_k Σ_k (an
orthogonal change of basis: maps and barycenter are equivariant). Directions outside the support of Σ_w
(pixels constant in every class) carry no within-class variance and are set to the global mean.

Rank deficiency. Inside the support a class covariance is often singular on real data (a pixel constant
in one class; n_k < d), and then no linear map can give every class the barycenter's covariance.
`rank_deficient` chooses what to do:

- `"coupling"` (default): exact in-sample erasure without dropping directions the sample can support.
  Keep the r = min(support rank, min_k n_k − 1) leading directions of Σ_w (the only truncation; n_k
  forces it, see below) and replace the map by the optimal Gaussian *coupling* of each class with the
  barycenter. With T'_k = C^{-½}(C^{½}Σ_kC^{½})^{½}C^{-½} the OT map from N(0, C) to N(0, Σ_k), the
  coupling's conditional law of the barycenter point given a class point is
      x' = μ + B_k (x − m_k) + ε_k,  B_k = C T'_k Σ_k⁺,  ε_k ~ (0, R_k),  R_k = C − C T'_k Σ_k⁺ T'_k C,
  so Cov(x') = B_k Σ_k B_kᵀ + R_k = C. For a non-singular class R_k = 0 and B_k = T'_k⁻¹ = T_k (the map
  above). Computation: with C = L Lᵀ (Cholesky) and the class data in these coordinates,
  Z_k L / √(n_k − 1) = U S Qᵀ (thin SVD; S² are the eigenvalues of M_k = Lᵀ Σ_k L), one finds
      B_k = (L Q₁ S₁⁻¹)(L Q₁)ᵀ,   R_k = (L Q₀)(L Q₀)ᵀ,
  Q₁ / Q₀ the right singular vectors with S above / below `null_rtol`·max (the range / null space of
  M_k). So the mapped class is √(n_k − 1) U₁ (L Q₁)ᵀ: its whitened coordinates U₁ are orthonormal, and
  the noise supplies the missing whitened coordinates: ε_k = √(n_k − 1) E (L Q₀)ᵀ with E (n_k × q_k,
  q_k = r − rank M_k) orthonormal and orthogonal to the ones vector and to U₁. Then the class sample has
  mean μ and covariance (L Q)(L Q)ᵀ = C exactly (float64 round-off; no conditioning enters). E exists iff
  n_k − 1 − rank M_k ≥ q_k, i.e. r ≤ n_k − 1: hence the cap on r. E is a seeded Gaussian matrix (`seed`,
  class) projected off [1, U₁] and orthonormalised (QR), so the noise is an exact-moment draw of
  N(0, R_k): zero sample mean, zero sample cross-covariance with the class's data, covariance R_k. That exact
  draw is for the rows the eraser was fitted on (`eraser.apply_in_sample(x, y)`, what `erasure.erase` does); on any
  other rows (`eraser(x, y)`: a holdout, fresh draws) each row gets an independent N(0, R_k) draw, since imposing
  the fit sample's constraint on rows that do not obey it would itself carry the label.
  The report gives each class's noise rank and noise share tr R_k / tr C. The barycenter of singular
  classes converges sublinearly; it stops once its objective settles (`objective_rtol`), which does not
  affect exactness (the moments equal whatever C is used), only optimality, to second order.
- `"shrinkage"`: the paper code's estimator (concept-erasure's QuadraticFitter(shrinkage=True)): each
  class covariance (biased, 1/n_k) is shrunk towards (tr S_k / d)·I by the optimal linear shrinkage
  α_k = 1 − (tr S_k)² / (n_k (‖S_k‖_F² − (tr S_k)²/d)) (clamped to [0, 1]), and the maps act on the
  whole space. Class means become equal; covariances only approximately (the certificate shows how far).
  The target mean is the prior-weighted global mean (concept-erasure uses the unweighted mean of the
  class means; the same for balanced classes).
- `"truncate"`: keep the top-r principal directions of Σ_w, r the largest dimension on which every
  class covariance whitened by Σ_w has eigenvalues ≥ `class_rtol`; the rest is set to the mean. Exact,
  but on images it drops half of the directions (Fashion-MNIST 20k: 387 of 784 kept).
- `"ridge"`: add `ridge · mean eigenvalue(Σ_w)` to every class covariance; covariances only ~equal.

Whatever is done is reported (working rank, variance dropped, noise share) with one warning.
"""

from __future__ import annotations

import dataclasses
import math
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
from torch import Tensor

from .barycenter import barycenter
from .base import Eraser, base_info, counts_info, prepare_fit
from .moments import ClassMoments, check_labels, class_moments, eigh_desc, flatten_features, numerical_rank
from .registry import ERASERS
from .threads import single_threaded
from .traits import BatchNoise

MODES = ("coupling", "shrinkage", "truncate", "ridge")
INJECTION_RATIO = 100  # min_k n_k / d below which class maps applied out of sample inject the label


def label_injection_risk(class_counts: Sequence[int] | Tensor, d: int, *,
                         ratio: float = INJECTION_RATIO) -> str | None:
    """One warning line when QLEACE fitted on `class_counts` rows per class in `d` dimensions (the features, or
    the working rank) is applied to rows it was not fitted on with min_k n_k / d < `ratio`; else None.

    The map of class k is estimated from that class's n_k rows alone. Out of sample it maps the class's true
    covariance not onto the barycenter but onto something that depends on the class's own estimation error, so
    the coded rows of different classes end with different moments: label information is injected (the smaller
    n_k / d, the more). The permuted-label control measures what that adds to the code length.
    """
    counts = [int(c) for c in (class_counts.tolist() if isinstance(class_counts, Tensor) else class_counts)]
    if not counts or d <= 0:
        raise ValueError(f"label_injection_risk: need class counts and d > 0; got {counts}, d={d}")
    n_min = min(counts)
    if n_min / d >= ratio:
        return None
    return (f"qleace fitted on held-out rows: the smallest class has {n_min} rows for d={d} "
            f"(min n_k/d = {n_min / d:.3g} < {ratio:g}); class maps estimated from so few rows inject the label "
            "into the coded rows (label injection). Compare with the permuted-label control "
            "(dataset.permute_labels=true): its distance from the label entropy is this bias.")


@single_threaded
def coupling_noise_ranks(x: Tensor | np.ndarray, y: Tensor | np.ndarray, *, support_rtol: float = 1e-10,
                         null_rtol: float = 1e-7, **_options: Any) -> list[int]:
    """Per class, the rank of the noise a `rank_deficient="coupling"` fit would add, predicted without fitting.

    The fit's own rule (`_fit_subspace`, `_coupling`) up to the barycenter: the working directions V (the top
    r = min(support rank, min_k n_k − 1) eigenvectors of the pooled within-class covariance), then class k's noise
    rank r − rank(Z_k V L) with the class rank counted at `null_rtol`. The fit's L is the Cholesky factor of the
    barycenter C; here C is replaced by the pooled covariance (diagonal in V), so only the barycenter's iterations
    are saved. Exact where a class is singular (its data span fewer than r directions: rank gaps of ~1e-15 against
    null_rtol); a class whose smallest singular value is within the conditioning of C of `null_rtol` may be
    predicted either way. Costs the fit's covariance and eigendecomposition (seconds on MNIST, no barycenter).
    """
    x64, labels, _, k = prepare_fit(x, y)
    counts = torch.bincount(labels, minlength=k)
    if int(counts.min()) < 2:
        raise ValueError(f"qleace: every class needs at least 2 rows; counts {counts.tolist()}")
    d = x64.shape[1]
    pooled = torch.zeros(d, d, dtype=torch.float64, device=x64.device)
    centred = []
    for c in range(k):
        z = x64[labels == c]
        z = z - z.mean(0)
        pooled += (int(counts[c]) / len(x64)) * (z.T @ z) / (len(z) - 1)
        centred.append(z)
    vals, vecs = eigh_desc(pooled)
    s = numerical_rank(vals, support_rtol)
    r = min(s, int(counts.min()) - 1)
    scale = vecs[:, :r] * vals[:r].clamp_min(0).sqrt()
    ranks = []
    for z in centred:
        sv = torch.linalg.svdvals(z @ scale / math.sqrt(len(z) - 1))
        ranks.append(r - int((sv > null_rtol * sv[0]).sum()))
    return ranks


class QleaceEraser(Eraser):
    """Label-dependent eraser; state: mean (d,), basis (d, r), class_means (k, r), maps (k, r, r), and for
    the coupling noise_factors (k, r, q_max) = L Q₀ (zero-padded) and noise_rank (k,)."""

    name = "qleace"
    needs_labels = True

    @property
    def has_noise(self) -> bool:
        return "noise_rank" in self.state and bool((self.state["noise_rank"] > 0).any())

    def __call__(self, x: Tensor | np.ndarray, y: Tensor | np.ndarray | None = None) -> Tensor:
        """Erase rows (x, y) this eraser was NOT fitted on. With coupling noise each row of class k gets an
        independent N(0, R_k) draw (seeded by `seed`, the class and the row's place among the class's rows): out of
        sample the exact-moment construction would impose the fit sample's constraint on rows that do not obey it."""
        return self._erase(x, y, in_sample=False)

    def apply_in_sample(self, x: Tensor | np.ndarray, y: Tensor | np.ndarray | None = None) -> Tensor:
        """Erase the rows this eraser was fitted on (the same rows, whole classes): the coupling noise is an
        exact-moment draw of N(0, R_k) on them (zero mean, orthogonal to their mapped data, covariance R_k), so
        every class ends with mean μ and covariance C exactly."""
        return self._erase(x, y, in_sample=True)

    @single_threaded  # both ways in (out of sample and in sample): the noise's linear algebra too
    def _erase(self, x: Tensor | np.ndarray, y: Tensor | np.ndarray | None, in_sample: bool) -> Tensor:
        if not self.has_noise:
            return super().__call__(x, y)
        if y is None:
            raise ValueError("the qleace eraser is label-dependent: call eraser(x, y) with class labels")
        flat, shape = flatten_features(x)
        if flat.shape[1] != self.dim:
            raise ValueError(f"qleace eraser was fitted on d={self.dim} features; got d={flat.shape[1]}")
        labels, _ = check_labels(y, len(flat), num_classes=self.num_classes)
        out = torch.empty_like(flat)
        mean, basis = self.state["mean"], self.state["basis"]
        for c in torch.unique(labels).tolist():
            idx = (labels == c).nonzero().flatten()
            z = (flat[idx.to(flat.device)].to(self.device, torch.float64) - mean) @ basis
            zb = (z - self.state["class_means"][c]) @ self.state["maps"][c]
            zb = zb + (self._noise(zb, c) if in_sample else self._iid_noise(len(zb), c))
            out[idx.to(out.device)] = (mean + zb @ basis.T).to(out.device, out.dtype)
        return out.reshape(shape)

    def _iid_noise(self, n: int, c: int) -> Tensor:
        """n independent draws of N(0, R_c) in the working coordinates."""
        q = int(self.state["noise_rank"][c])
        r = self.state["basis"].shape[1]
        if q == 0:
            return torch.zeros(n, r, dtype=torch.float64, device=self.device)
        gen = torch.Generator(device="cpu").manual_seed(_class_seed(int(self.info["options"]["seed"]), c, 1))
        g = torch.randn(n, q, generator=gen, dtype=torch.float64).to(self.device)
        return g @ self.state["noise_factors"][c, :, :q].T

    def _apply(self, x64: Tensor, y: Tensor | None) -> Tensor:
        assert y is not None
        counts = torch.bincount(y, minlength=self.num_classes).tolist()
        return self.apply_sorted(x64, torch.argsort(y, stable=True), counts)

    def apply_sorted(self, x64: Tensor, order: Tensor, counts: Sequence[int]) -> Tensor:
        """The noise-free map on float64 rows x64 without reading their labels on the device: `order` lists the rows
        class by class (stably: class 0's rows in their order, then class 1's, ...) and `counts[c]` is the number of
        class c's rows (host integers: a training loop knows its batches' labels ahead)."""
        mean, basis = self.state["mean"], self.state["basis"]
        z = (x64 - mean) @ basis
        grouped = z.index_select(0, order)
        mapped = torch.empty_like(grouped)
        start = 0
        for c, n in enumerate(counts):
            if n:
                rows = slice(start, start + n)
                mapped[rows] = (grouped[rows] - self.state["class_means"][c]) @ self.state["maps"][c]
            start += n
        out = torch.empty_like(z).index_copy_(0, order, mapped)
        return mean + out @ basis.T

    def _noise(self, zb: Tensor, c: int) -> Tensor:
        """√(n−1)·E·(L Q₀)ᵀ for the n mapped rows zb of class c: E orthonormal, ⊥ ones and ⊥ col(zb)."""
        q = int(self.state["noise_rank"][c])
        if q == 0:
            return torch.zeros_like(zb)
        factor = self.state["noise_factors"][c, :, :q]
        n = len(zb)
        rank = int(self.info["class_rank"][c])
        gen = torch.Generator(device="cpu").manual_seed(_class_seed(int(self.info["options"]["seed"]), c))
        g = torch.randn(n, q, generator=gen, dtype=torch.float64).to(zb.device)
        if n - 1 - rank < q:  # too few rows here for exact moments: plain N(0, R_k) draws
            warnings.warn(f"qleace: class {c} has {n} rows here, fewer than the {rank + q + 1} that exact "
                          "coupling noise needs; drew independent N(0, R_k) noise instead", stacklevel=4)
            return g @ factor.T
        data = torch.linalg.svd(zb, full_matrices=False).U[:, :rank]
        span = torch.linalg.qr(torch.cat([torch.full((n, 1), n ** -0.5, dtype=zb.dtype, device=zb.device),
                                          data], 1)).Q
        for _ in range(2):  # projecting twice makes E ⊥ span to round-off
            g = g - span @ (span.T @ g)
        e = torch.linalg.qr(g).Q
        return math.sqrt(n - 1) * e @ factor.T

    def maps_full(self) -> Tensor:
        """Class → barycenter maps (B_k) in the input coordinates, (k, d, d) (zero off the working subspace)."""
        b = self.state["basis"]
        return b @ self.state["maps"] @ b.T

    def barycenter_full(self) -> Tensor:
        b = self.state["basis"]
        return b @ self.state["barycenter"] @ b.T

    def noise_cov_full(self, c: int) -> Tensor:
        """R_c = (L Q₀)(L Q₀)ᵀ in the input coordinates (zero without coupling noise)."""
        b = self.state["basis"]
        if "noise_factors" not in self.state:
            return torch.zeros(self.dim, self.dim, dtype=b.dtype, device=b.device)
        f = b @ self.state["noise_factors"][c]
        return f @ f.T


def _class_seed(seed: int, c: int, stream: int = 0) -> int:
    """The noise seed of class c: stream 0 the in-sample exact-moment draw, 1 the out-of-sample i.i.d. draw."""
    key = [seed, c] if stream == 0 else [seed, c, stream]
    return int(np.random.SeedSequence(key).generate_state(1)[0])


@dataclass(frozen=True, kw_only=True)
class QleaceOptions:
    """QLEACE's options (`fit_qleace(x, y, **options)`, `qleace_from_moments`), each with its default.

    tol / max_iter / anderson: barycenter stopping rule (relative stationarity residual), iteration cap and
    Anderson depth (0 = plain fixed point). support_rtol: eigenvalues of Σ_w below support_rtol·max are
    outside the support. class_rtol (truncate, and deciding whether any class is singular): a class
    covariance eigenvalue, whitened by Σ_w, below this counts as singular. null_rtol (coupling): singular
    values of a class in barycenter coordinates below null_rtol·max span its null space (filled by noise).
    objective_rtol (coupling with a singular class): the barycenter also stops once its objective decreases
    by less than this (relative) in one step. seed: the coupling noise (per class).
    """

    tol: float = 1e-8
    max_iter: int = 100
    anderson: int = 2
    rank_deficient: Literal["coupling", "shrinkage", "truncate", "ridge"] = "coupling"
    class_rtol: float = 1e-7
    ridge: float = 1e-6
    support_rtol: float = 1e-10
    null_rtol: float = 1e-7
    objective_rtol: float = 1e-7
    seed: int = 0

    def __post_init__(self) -> None:
        if self.rank_deficient not in MODES:
            raise ValueError(f"qleace: rank_deficient must be one of {list(MODES)}; got {self.rank_deficient!r}")


def fit_qleace(x: Tensor | np.ndarray, y: Tensor | np.ndarray, **options: Any) -> QleaceEraser:
    """Fit QLEACE in float64 with `QleaceOptions(**options)`."""
    o = QleaceOptions(**options)
    t0 = time.perf_counter()
    x64, labels, flat, k = prepare_fit(x, y)
    mom = class_moments(x64, labels, k, class_covs=True)
    info = base_info("qleace", flat, k, mom.counts, dataclasses.asdict(o))
    return _qleace_fit(mom, info, o, t0, (x64, labels))


def qleace_from_moments(mom: ClassMoments, *, input_dtype: str = "float32", **options: Any) -> QleaceEraser:
    """QLEACE from class moments (per-class covariances set): the coupling's class factors come from the
    eigendecomposition of Lᵀ Σ_k L instead of the SVD of the class rows (equal up to round-off)."""
    o = QleaceOptions(**options)
    t0 = time.perf_counter()
    info = counts_info("qleace", int(mom.mean.shape[0]), mom.counts, input_dtype, dataclasses.asdict(o))
    return _qleace_fit(mom, info, o, t0, None)


def _qleace_fit(mom: ClassMoments, info: dict[str, Any], o: QleaceOptions, t0: float,
                rows: tuple[Tensor, Tensor] | None) -> QleaceEraser:
    """`rows`: the fit's (x64, labels), for the coupling's class SVDs; None: from the class covariances."""
    assert mom.class_covs is not None
    state = _fit_shrinkage(mom, info, o) if o.rank_deficient == "shrinkage" else _fit_subspace(rows, mom, info, o)
    info["fit_seconds"] = time.perf_counter() - t0
    return QleaceEraser(state, info)


def shrink_covariances(biased: Tensor, counts: Tensor) -> tuple[Tensor, Tensor]:
    """Optimal linear shrinkage of biased (1/n_k) class covariances (k, d, d) towards (tr S_k / d)·I.

    α_k = 1 − (tr S_k)² / (n_k (‖S_k‖_F² − (tr S_k)² / d)), clamped to [0, 1]; returns (shrunk, α).
    """
    d = biased.shape[-1]
    tr = torch.diagonal(biased, dim1=-2, dim2=-1).sum(-1)
    spread = torch.linalg.matrix_norm(biased) ** 2 - tr**2 / d  # ‖S − (tr S/d) I‖_F² ≥ 0
    n = counts.to(biased)
    alpha = torch.where(spread > 0, 1 - tr**2 / (n * spread.clamp_min(torch.finfo(biased.dtype).tiny)),
                        torch.zeros_like(tr)).clamp(0.0, 1.0)
    eye = torch.eye(d, dtype=biased.dtype, device=biased.device)
    shrunk = alpha[:, None, None] * biased + ((1 - alpha) * tr / d)[:, None, None] * eye
    return shrunk, alpha


def _fit_shrinkage(mom: ClassMoments, info: dict[str, Any], o: QleaceOptions) -> dict[str, Tensor]:
    class_covs = mom.class_covs
    assert class_covs is not None
    d = class_covs.shape[-1]
    n = mom.counts.to(class_covs)
    covs, alpha = shrink_covariances(class_covs * ((n - 1) / n)[:, None, None], mom.counts)
    bary = barycenter(covs, mom.priors, tol=o.tol, max_iter=o.max_iter, anderson=o.anderson)
    _warn_unconverged(bary, o.tol, info)
    eye = torch.eye(d, dtype=class_covs.dtype, device=class_covs.device)
    info.update({"support_rank": d, "working_rank": d, "dims_set_to_mean": 0, "rank_handling": "shrinkage",
                 "rank_limited_by": "none", "variance_dropped_fraction": 0.0, "ridge_used": 0.0,
                 "shrinkage_alpha": [float(a) for a in alpha], "noise_rank": [0] * len(alpha),
                 "noise_share": [0.0] * len(alpha), "max_noise_share": 0.0, **_bary_info(bary)})
    return {"mean": mom.mean, "basis": eye, "class_means": mom.means - mom.mean, "maps": bary.maps,
            "barycenter": bary.cov}


def _fit_subspace(rows: tuple[Tensor, Tensor] | None, mom: Any, info: dict[str, Any],
                  o: QleaceOptions) -> dict[str, Tensor]:
    """coupling / truncate / ridge: work in the leading principal directions of the pooled covariance."""
    k, d = mom.k, mom.mean.shape[0]
    pooled = torch.einsum("k,kij->ij", mom.priors, mom.class_covs)
    vals, vecs = eigh_desc(pooled)
    s = numerical_rank(vals, o.support_rtol)
    if s == 0:
        raise ValueError("qleace: every class has zero variance; nothing to fit")
    mode = o.rank_deficient
    r = min(s, int(mom.counts.min()) - 1) if mode == "coupling" else s
    v = vecs[:, :r]
    covs = v.T @ (mom.class_covs.reshape(k * d, d) @ v).view(k, d, r)  # (k, r, r) in the pooled eigenbasis
    del mom.class_covs
    inv_sd = vals[:r].rsqrt()
    handling = "none" if s == d else "support"
    ridge_used = 0.0
    min_eig: float | None = None
    singular = not _all_above(covs, inv_sd, o.class_rtol)
    what = ""
    bad: list[int] = []
    if singular:
        white_eigs = torch.linalg.eigvalsh(covs * inv_sd[:, None] * inv_sd[None, :])
        min_eig = float(white_eigs[:, 0].min())
        bad = (white_eigs[:, 0] < o.class_rtol).nonzero().flatten().tolist()
        if mode == "truncate":
            # interlacing: an r-dim compression with min eigenvalue ≥ τ needs r ≤ #(eigenvalues ≥ τ)
            upper = int((white_eigs >= o.class_rtol).sum(-1).min())
            r = _stable_rank(covs, inv_sd, o.class_rtol, upper + 1)
            what = (f"kept the top {r} of {s} principal directions of the pooled covariance "
                    f"({_frac(vals, r):.4%} of its variance); the rest is set to the mean")
            handling = "truncate"
        elif mode == "ridge":
            ridge_used = o.ridge * float(vals[:s].mean())
            covs = covs + ridge_used * torch.eye(r, dtype=covs.dtype, device=covs.device)
            what = f"added a ridge of {ridge_used:.3g} to every class covariance (covariances only ~equal)"
            handling = "ridge"
    covs = covs[:, :r, :r]
    basis = v[:, :r].contiguous()
    obj_rtol = o.objective_rtol if mode == "coupling" and singular else None
    bary = barycenter(covs, mom.priors, tol=o.tol, max_iter=o.max_iter, anderson=o.anderson,
                      objective_rtol=obj_rtol)
    state = {"mean": mom.mean, "basis": basis, "class_means": (mom.means - mom.mean) @ basis, "maps": bary.maps,
             "barycenter": bary.cov}
    noise_rank, noise_share, class_rank = [0] * k, [0.0] * k, [r] * k
    if mode == "coupling":
        maps, factors, noise_rank, class_rank, noise_share = _coupling(rows, covs, mom, basis, bary.cov,
                                                                       o.null_rtol)
        state.update(maps=maps, noise_factors=factors, noise_rank=torch.tensor(noise_rank, dtype=torch.long))
        if r < s or max(noise_rank) > 0:
            handling = "coupling"
            what = (f"kept {r} of {s} principal directions ({_frac(vals, r):.4%} of the variance"
                    f"{'; r = min_k n_k − 1' if r < s else ''}) and coupled each class with the barycenter: "
                    f"noise ranks {noise_rank}, max noise share {max(noise_share):.3%} of tr C")
    if handling in ("truncate", "ridge", "coupling"):
        msg = (f"qleace: class covariances are rank-deficient (classes {bad}; support rank {s} of d={d}; "
               f"n_k min {int(mom.counts.min())}): {what}")
        warnings.warn(msg, stacklevel=4)
        info["warnings"].append(msg)
    _warn_unconverged(bary, o.tol, info)
    info.update({
        "support_rank": s, "working_rank": r, "dims_set_to_mean": d - r, "rank_handling": handling,
        "rank_limited_by": ("none" if s == d else "support") if r == s else
                           ("class size" if mode == "coupling" else "class covariances"),
        "variance_dropped_fraction": 1.0 - _frac(vals, r), "ridge_used": ridge_used,
        "min_whitened_class_eig": min_eig,  # computed only when some class is below class_rtol
        "class_rank": class_rank, "noise_rank": noise_rank, "noise_share": noise_share,
        "max_noise_share": max(noise_share), **_bary_info(bary),
    })
    return state


def _coupling(rows: tuple[Tensor, Tensor] | None, covs: Tensor, mom: Any, basis: Tensor, cov: Tensor,
              null_rtol: float) -> tuple[Tensor, Tensor, list[int], list[int], list[float]]:
    """Per class: B_k = (L Q₁ S₁⁻¹)(L Q₁)ᵀ, L Q₀ (noise factor), its rank, the class rank and tr R_k / tr C.
    S, Q: from the SVD of the class's rows (`rows`) or, without rows, the eigendecomposition of Lᵀ Σ_k L (`covs`,
    the class covariances in the working basis)."""
    k, r = mom.k, basis.shape[1]
    chol = torch.linalg.cholesky(cov)
    maps = torch.empty(k, r, r, dtype=cov.dtype, device=cov.device)
    frames: list[Tensor] = []
    ranks: list[int] = []
    for c in range(k):
        if rows is not None:
            x64, labels = rows
            z = (x64[labels == c] - mom.means[c]) @ basis
            _, sv, qh = torch.linalg.svd(z @ chol / math.sqrt(len(z) - 1), full_matrices=False)
        else:
            vals, vecs = eigh_desc(chol.T @ covs[c] @ chol)
            sv, qh = vals.clamp_min(0).sqrt(), vecs.T
        rank = int((sv > null_rtol * sv[0]).sum())
        lq = chol @ qh.mT
        maps[c] = (lq[:, :rank] / sv[:rank]) @ lq[:, :rank].T
        frames.append(lq[:, rank:])
        ranks.append(rank)
    q_max = max(f.shape[1] for f in frames)
    factors = torch.zeros(k, r, q_max, dtype=cov.dtype, device=cov.device)
    for c, f in enumerate(frames):
        factors[c, :, :f.shape[1]] = f
    total = float(torch.trace(cov))
    share = [float(f.pow(2).sum()) / total for f in frames]
    return maps, factors, [f.shape[1] for f in frames], ranks, share


def _bary_info(bary: Any) -> dict[str, Any]:
    return {"barycenter_iterations": bary.iterations, "barycenter_residual": bary.residual,
            "barycenter_converged": bary.converged, "barycenter_stopped_by": bary.stopped_by,
            "barycenter_history": bary.history, "barycenter_objective": bary.objective}


def _warn_unconverged(bary: Any, tol: float, info: dict[str, Any]) -> None:
    if bary.converged or bary.stopped_by == "objective":
        return
    msg = (f"qleace: barycenter stopped after {bary.iterations} iterations at residual "
           f"{bary.residual:.3g} > tol {tol:g}")
    warnings.warn(msg, stacklevel=5)
    info["warnings"].append(msg)


def _frac(vals: Tensor, r: int) -> float:
    tot = float(vals.clamp_min(0).sum())
    return float(vals[:r].clamp_min(0).sum()) / tot if tot > 0 else 1.0


def _all_above(covs: Tensor, inv_sd: Tensor, tau: float) -> bool:
    """Every whitened class covariance (leading block of size covs.shape[-1]) has min eigenvalue > tau."""
    r = covs.shape[-1]
    w = inv_sd[:r]
    eye = torch.eye(r, dtype=covs.dtype, device=covs.device)
    return bool((torch.linalg.cholesky_ex(covs * w[:, None] * w[None, :] - tau * eye).info == 0).all())


def _stable_rank(covs: Tensor, inv_sd: Tensor, class_rtol: float, hi: int) -> int:
    """Largest r whose leading r×r whitened class covariances all have min eigenvalue ≥ class_rtol.

    Monotone in r (the min generalised Rayleigh quotient over nested subspaces can only fall), so bisect.
    """
    lo, hi = 0, min(hi, covs.shape[-1])  # ok(lo) holds (empty), ok(hi) fails
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if _all_above(covs[:, :mid, :mid], inv_sd, class_rtol) else (lo, mid)
    if lo == 0:
        raise ValueError("qleace: some class covariance is numerically zero; cannot equalise covariances")
    return lo


# Coupling noise has exact moments on whole classes, not on a training batch: `eraser.after_augment` refuses it.
COUPLING_NOISE = BatchNoise(applies=lambda options: options["rank_deficient"] == "coupling", ranks=coupling_noise_ranks)
SUBSPACE = ("coupling", "truncate", "ridge")  # the modes of `_fit_subspace`; shrinkage reads tol, max_iter, anderson
ERASERS.add("qleace", fit_qleace, family="quadratic", kind="map", options=QleaceOptions,
            from_moments=qleace_from_moments, batch_noise=COUPLING_NOISE,
            read_only_with={"ridge": ("rank_deficient", ("ridge",)), "null_rtol": ("rank_deficient", ("coupling",)),
                            "objective_rtol": ("rank_deficient", ("coupling",)),
                            "seed": ("rank_deficient", ("coupling",)), "class_rtol": ("rank_deficient", SUBSPACE),
                            "support_rtol": ("rank_deficient", SUBSPACE)})
