"""erasure.streaming: class moments accumulated chunk by chunk give the eraser fitted on the concatenation."""

from __future__ import annotations

import warnings

import pytest
import torch

import erasure
from erasure.moments import class_moments
from erasure.qleace import QleaceEraser
from erasure.registry import ERASERS
from erasure.streaming import MomentSums, fit_chunks, fit_moments
from erasure.traits import eraser_traits

from .test_erasure_common import F64, gaussian_classes
from .test_erasure_qleace import _rank_deficient_data


def _chunks(x: torch.Tensor, y: torch.Tensor, sizes: list[int]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    out, at = [], 0
    for s in sizes:
        out.append((x[at:at + s], y[at:at + s]))
        at += s
    return out


def test_moment_sums_equal_the_concatenation_moments() -> None:
    x, y = gaussian_classes(900, 12, 3, seed=1, mean_scale=5.0)
    x = x + 100.0  # a large offset: the merge must not lose the scatter to cancellation
    sums = MomentSums(3, 12)
    for xc, yc in _chunks(x, y, [1, 7, 300, 92, 500]):  # chunks of any size, classes missing from some
        sums.add(xc, yc)
    ref = class_moments(x, y, 3, total_cov=True, class_covs=True)
    got = sums.moments()
    assert got.cov is not None and ref.cov is not None and got.class_covs is not None and ref.class_covs is not None
    assert torch.equal(got.counts, ref.counts)
    for a, b in ((got.means, ref.means), (got.mean, ref.mean), (got.cov, ref.cov), (got.class_covs, ref.class_covs)):
        assert float((a - b).abs().max()) <= 1e-9 * float(b.abs().max())
    with pytest.raises(ValueError, match="cannot be fitted from moments"):
        fit_moments("random", ref)
    one_class = MomentSums(3, 12)
    one_class.add(x[y == 0], y[y == 0])
    with pytest.raises(ValueError, match="classes \\[1, 2\\] have fewer"):
        one_class.moments()


@pytest.mark.parametrize("name", [n for n in ERASERS.names() if eraser_traits(n).from_moments is not None])
def test_streamed_fit_gives_the_eraser_of_the_concatenation(name: str) -> None:
    x, y = gaussian_classes(1200, 10, 4, seed=2)
    whole = erasure.fit(name, x, y)
    streamed = fit_chunks(name, _chunks(x, y, [100, 400, 700]), 4)
    new = torch.randn(50, 10, generator=torch.Generator().manual_seed(3), dtype=F64)
    ynew = torch.arange(50) % 4
    a = whole(new, ynew) if whole.needs_labels else whole(new)
    b = streamed(new, ynew) if streamed.needs_labels else streamed(new)
    assert float((a - b).abs().max()) <= 1e-8 * float(a.abs().max())
    if name == "alf_qleace":
        assert whole.report()["alf_directions"] == streamed.report()["alf_directions"] > 0
    assert streamed.report()["n"] == 1200 and streamed.report()["class_counts"] == whole.report()["class_counts"]


def test_streamed_qleace_with_singular_classes_has_the_same_map_and_noise_law() -> None:
    """Singular classes (constant pixels, n_k < d): the coupling from class covariances (eigh) and from class rows
    (SVD) agree on B_k and R_k."""
    x, y = _rank_deficient_data()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        whole = erasure.fit("qleace", x, y)
        streamed = fit_chunks("qleace", _chunks(x, y, [200, 700]), 3)
    assert isinstance(whole, QleaceEraser) and isinstance(streamed, QleaceEraser)
    assert max(whole.report()["noise_rank"]) > 0
    assert whole.report()["noise_rank"] == streamed.report()["noise_rank"]
    scale = float(whole.barycenter_full().abs().max())
    assert float((whole.maps_full() - streamed.maps_full()).abs().max()) <= 1e-7 * float(whole.maps_full().abs().max())
    for c in range(3):
        assert float((whole.noise_cov_full(c) - streamed.noise_cov_full(c)).abs().max()) <= 1e-7 * scale
