"""Dataset loaders: offline sets, format-faithful CIFAR-10/SVHN fixtures, clear missing-data errors; the per-sample
crop + flip on the device (training/engine/augment.py): shapes, independence, mirror, padding."""

from __future__ import annotations

import pickle
from pathlib import Path

import numpy as np
import pytest
import torch
from omegaconf import OmegaConf

from training.app.schema import CONF_DIR, DatasetConfig, group_config, load_section
from training.data import DatasetMissingError, load_dataset
from training.data.registry import DATASETS, LoadedData, dataset_traits
from training.engine.augment import PAD_VALUE, apply_crop_flip, crop_flip, default_pad, draw_crop_flip


def _check(d: LoadedData, n: int, shape: tuple[int, int, int], k: int = 10) -> None:
    assert d.x.dtype == torch.float32 and d.x.shape == (n, *shape)
    assert d.y.dtype == torch.int64 and set(d.y.tolist()) == set(range(k))
    assert 0.0 <= d.x.min() and d.x.max() <= 1.0


def test_digits_and_mnist5k() -> None:
    _check(load_dataset(group_config("dataset", "digits")), 1797, (1, 8, 8))
    m = load_dataset(group_config("dataset", "mnist5k"))
    _check(m, 5000, (1, 28, 28))
    assert len(set(m.y[:50].tolist())) > 5  # shuffled: the source is sorted by class


FASHION = Path("/usr/share/datasets/fashion-mnist")


@pytest.mark.skipif(not FASHION.exists(), reason="dataset-fashion-mnist not installed")
def test_fashion_mnist_local() -> None:
    _check(load_dataset(group_config("dataset", "fashion_mnist", download=False, limit=2000)), 2000, (1, 28, 28))


def _cifar_batches(folder: Path, protocol: int = pickle.DEFAULT_PROTOCOL) -> None:
    folder.mkdir()
    rng = np.random.default_rng(0)
    for i in range(1, 6):
        labels = [(j + i) % 10 for j in range(20)]
        batch = {"data": rng.integers(0, 256, (20, 3072), dtype=np.uint8), "labels": labels,
                 "batch_label": f"training batch {i} of 5", "filenames": [f"f{j}.png" for j in range(20)],
                 "raw": b"bytes"}
        with open(folder / f"data_batch_{i}", "wb") as f:
            pickle.dump(batch, f, protocol=protocol)


class _Payload:
    """A pickle that runs a shell command when loaded by a plain pickle.load."""

    def __init__(self, command: str) -> None:
        self.command = command

    def __reduce__(self) -> tuple[object, tuple[str]]:
        import os

        return os.system, (self.command,)


@pytest.mark.parametrize("protocol", [2, pickle.DEFAULT_PROTOCOL])
def test_cifar10_fixture_and_a_batch_that_would_run_code_refused_in_one_line(tmp_path: Path, protocol: int) -> None:
    from training.errors import DataCorruptError

    folder = tmp_path / "cifar-10-batches-py"
    _cifar_batches(folder, protocol)
    d = load_dataset(group_config("dataset", "cifar10", download=False), tmp_path)
    _check(d, 100, (3, 32, 32))
    # Pixel layout: the pickle's row is 1024 R, 1024 G, 1024 B values in row-major order.
    with open(folder / "data_batch_1", "rb") as f:
        raw = pickle.load(f)["data"][0].reshape(3, 32, 32) / 255.0
    assert any(torch.allclose(d.x[j], torch.from_numpy(raw).float()) for j in range(100))
    marker = tmp_path / "pwned"
    with open(folder / "data_batch_3", "wb") as f:
        pickle.dump({"data": _Payload(f"touch {marker}"), "labels": [0]}, f, protocol=protocol)
    with pytest.raises(DataCorruptError, match=r"data_batch_3 .*refused posix\.system") as err:
        load_dataset(group_config("dataset", "cifar10", download=False), tmp_path)
    assert "\n" not in str(err.value)
    assert not marker.exists()
    with open(folder / "data_batch_3", "rb") as f:  # the control: the payload is live under a plain pickle.load
        pickle.load(f)
    assert marker.exists()


def test_svhn_fixture(tmp_path: Path) -> None:
    from scipy.io import savemat

    rng = np.random.default_rng(0)
    x = rng.integers(0, 256, (32, 32, 3, 30), dtype=np.uint8)
    y = (np.arange(30) % 10 + 1).reshape(-1, 1)  # the file stores digit 0 as label 10
    (tmp_path / "svhn").mkdir()
    savemat(tmp_path / "svhn" / "train_32x32.mat", {"X": x, "y": y})
    d = load_dataset(group_config("dataset", "svhn", download=False), tmp_path)
    _check(d, 30, (3, 32, 32))
    first = torch.from_numpy(x[:, :, :, 0].transpose(2, 0, 1) / 255.0).float()
    assert any(torch.allclose(d.x[j], first) for j in range(30))


@pytest.mark.parametrize("name,hint", [("cifar10", "cifar-10-batches-py"), ("svhn", "train_32x32.mat"),
                                       ("cifarnet", "train.npz")])
def test_missing_data_is_one_clear_error(tmp_path: Path, name: str, hint: str) -> None:
    with pytest.raises(DatasetMissingError, match=hint) as err:
        load_dataset(group_config("dataset", name, download=False), tmp_path)
    assert str(tmp_path) in str(err.value) and "\n" not in str(err.value)


def test_unknown_dataset() -> None:
    with pytest.raises(ValueError, match="dataset.name='imagenet' is not allowed: .* a registered dataset"):
        load_section(DatasetConfig, {"name": "imagenet", "tag": "imagenet"}, "dataset.")


@pytest.mark.parametrize("name", DATASETS.names())
def test_every_registered_dataset_loads_or_says_where_its_files_go(name: str, tmp_path: Path) -> None:
    """Every registered dataset (training/data/registry.py), with no list to edit: its yaml composes and is typed,
    and from an empty data directory it either loads (shipped or generated data) as checked images and labels with
    their fingerprint, or, if it declares that it reads files (`files=True`), is refused in one line naming where its
    files go (no download here)."""
    no_download = {"download": False} if "download" in OmegaConf.load(CONF_DIR / "dataset" / f"{name}.yaml") else {}
    cfg = group_config("dataset", name, **no_download)
    assert cfg.name == name
    try:
        data = load_dataset(cfg, tmp_path)
    except DatasetMissingError as err:
        assert dataset_traits(name).files, f"{name} needs files but does not declare files=True: {err}"
        assert "\n" not in str(err) and str(tmp_path) in str(err), str(err)
        return
    assert data.x.dtype == torch.float32 and data.x.ndim == 4 and len(data.x) == len(data.y) > 0
    assert set(data.y.tolist()) == set(range(data.num_classes))
    assert data.info["fingerprint"]["content"] == data.content_hash()


# ---------------------------------------------------------------- crop + flip


def _reference(img: torch.Tensor, dy: int, dx: int, flip: bool, pad: int) -> torch.Tensor:
    """torchvision's RandomCrop(padding=pad, fill=0) then HorizontalFlip, for one image."""
    h, w = img.shape[-2:]
    crop = torch.nn.functional.pad(img, (pad, pad, pad, pad), value=PAD_VALUE)[:, dy: dy + h, dx: dx + w]
    return crop.flip(-1) if flip else crop


def test_shapes_dtype_and_pad_size() -> None:
    g = torch.Generator().manual_seed(0)
    for shape in [(5, 3, 32, 32), (4, 1, 28, 28), (2, 1, 8, 8)]:
        x = torch.rand(shape)
        out = crop_flip(x, g)
        assert out.shape == x.shape and out.dtype == x.dtype
    assert default_pad(32) == 4 and default_pad(28) == 3 and default_pad(8) == 1 and default_pad(4) == 1
    u8 = torch.randint(0, 256, (6, 3, 16, 16), dtype=torch.uint8)
    assert crop_flip(u8, g).dtype == torch.uint8
    # the same generator, the same draws: uint8 commutes with the decode
    x8 = torch.randint(0, 256, (16, 3, 8, 8), dtype=torch.uint8)
    a = crop_flip(x8, torch.Generator().manual_seed(5))
    b = crop_flip(x8.float() / 255, torch.Generator().manual_seed(5))
    assert torch.equal(a.float() / 255, b)


def test_matches_reference_per_sample() -> None:
    g = torch.Generator().manual_seed(1)
    x = torch.rand(40, 3, 16, 16) + 0.1
    offsets, flips = draw_crop_flip(40, g, 2)
    out = apply_crop_flip(x, offsets, flips, 2)
    for i in range(40):
        ref = _reference(x[i], int(offsets[i, 0]), int(offsets[i, 1]), bool(flips[i]), 2)
        assert torch.equal(out[i], ref)
    assert torch.equal(crop_flip(x, torch.Generator().manual_seed(1)), out)  # crop_flip: this draw, its default pad


def test_per_sample_independence() -> None:
    """Two samples of one batch get different transforms with high probability (1/50 per pair here)."""
    g = torch.Generator().manual_seed(2)
    offsets, flips = draw_crop_flip(256, g, 2)
    keys = {(int(a), int(b), bool(f)) for (a, b), f in zip(offsets, flips, strict=True)}
    assert len(keys) > 40  # 50 possible (5 × 5 offsets × 2 flips); one batch-wide draw would give 1
    x = torch.rand(1, 3, 16, 16).expand(64, -1, -1, -1)  # the same image 64 times
    out = crop_flip(x, g)
    distinct = {out[i].numpy().tobytes() for i in range(64)}
    assert len(distinct) > 20


def test_flip_is_exact_mirror_centre_crop_is_identity_and_padding_is_zero() -> None:
    x = torch.rand(3, 2, 8, 8) + 1.0  # no zeros in the image
    pad = default_pad(8)
    assert pad == 1
    centre = torch.full((3, 2), pad)
    same = apply_crop_flip(x, centre, torch.zeros(3, dtype=torch.bool), pad)
    mirror = apply_crop_flip(x, centre, torch.ones(3, dtype=torch.bool), pad)
    assert torch.equal(same, x)
    assert torch.equal(mirror, x.flip(-1))
    corner = torch.zeros(3, 2, dtype=torch.long)  # shift down-right by pad: top row and left column are padding
    out = apply_crop_flip(x, corner, torch.zeros(3, dtype=torch.bool), pad)
    assert (out[:, :, 0, :] == PAD_VALUE).all() and (out[:, :, :, 0] == PAD_VALUE).all()
    assert (out[:, :, 1:, 1:] > 0).all() and torch.equal(out[:, :, 1:, 1:], x[:, :, :-1, :-1])
