"""Colored MNIST (Arjovsky et al.) from MNIST-5k: agreement rates, channel layout, Fig. 3 probes, determinism."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.helpers import job_config, result_of
from training.app.schema import group_config
from training.app.tasks import get_task
from training.data import load_dataset
from training.data.colored_mnist import Environment, colored_mnist, fig3_variants, make_environment
from training.tasks.gs import colored_mnist as _task  # noqa: F401 - registers the task

CFG = group_config("dataset", "colored_mnist", source="mnist5k", n_test=1000, label_noise=0.25, color_flip=[0.2, 0.1],
                   test_color_flip=0.9, data_seed=0)


def _within(rate: float, p: float, n: float, sigmas: float = 4.0) -> bool:
    return abs(rate - p) <= sigmas * math.sqrt(p * (1 - p) / n)


@pytest.fixture(scope="module")
def envs() -> dict[str, Environment]:
    return colored_mnist(CFG)


def test_environment_rates_match_the_construction(envs: dict[str, Environment]) -> None:
    assert {k: len(e.y) for k, e in envs.items()} == {"train1": 2000, "train2": 2000, "test": 1000}
    for name, flip in (("train1", 0.2), ("train2", 0.1), ("test", 0.9)):
        r = envs[name].rates()
        assert _within(r["color_label_agreement"], 1 - flip, r["n"]), (name, r)
        assert _within(r["label_digit_agreement"], 0.75, r["n"]), (name, r)


def test_rates_on_a_large_sample() -> None:
    """Tight check of make_environment itself (200k fake digits): 4σ ≈ 0.004."""
    g = torch.Generator().manual_seed(3)
    digits = torch.randint(0, 10, (200_000,), generator=g)
    env = make_environment(torch.zeros(200_000, 28, 28), digits, 0.2, 0.25, g)
    r = env.rates()
    assert _within(r["color_label_agreement"], 0.8, r["n"]) and _within(r["label_digit_agreement"], 0.75, r["n"])
    # The colour is independent of the label noise given the label: P(colour = digit class) = 0.75·0.8 + 0.25·0.2.
    agree = float((env.color == (digits < 5).long()).double().mean())
    assert _within(agree, 0.75 * 0.8 + 0.25 * 0.2, r["n"])


def test_digit_sits_in_the_channel_of_its_colour_and_fig3_variants(envs: dict[str, Environment]) -> None:
    e = envs["train1"]
    assert e.x.shape == (2000, 2, 14, 14) and e.x.dtype == torch.float32 and 0 <= e.x.min() <= e.x.max() <= 1
    idx = torch.arange(len(e.y))
    torch.testing.assert_close(e.x[idx, e.color], e.gray)
    assert float(e.x[idx, 1 - e.color].abs().max()) == 0.0
    e = envs["test"]
    v = fig3_variants(e)
    assert set(v) == {"grayscale_digit", "colored_digit", "grayscale_blank", "colored_blank"}
    torch.testing.assert_close(v["grayscale_digit"][:, 0], e.gray / 2)
    torch.testing.assert_close(v["grayscale_digit"][:, 1], e.gray / 2)
    torch.testing.assert_close(v["colored_digit"], e.x)
    assert v["grayscale_blank"].unique().numel() == 1  # the same flat image everywhere
    blank = v["colored_blank"][torch.arange(len(e.y)), e.color]
    assert blank.unique().numel() == 1 and float(v["colored_blank"][torch.arange(len(e.y)), 1 - e.color].max()) == 0


def test_registry_pools_training_environments_and_is_deterministic(envs: dict[str, Environment]) -> None:
    data = load_dataset(CFG)
    assert data.x.shape == (4000, 2, 14, 14) and data.num_classes == 2
    assert "reduced" in data.info["source"] and set(data.info["environments"]) == {"train1", "train2", "test"}
    again = colored_mnist(CFG)
    assert torch.equal(again["test"].x, envs["test"].x) and torch.equal(again["train2"].y, envs["train2"].y)
    other = colored_mnist(group_config("dataset", "colored_mnist", data_seed=1))
    assert not torch.equal(other["train1"].y, envs["train1"].y)


def test_task_reports_accuracy_and_fig3(tmp_path: Path) -> None:
    cfg = job_config(tmp_path, ["experiment=gs_colored_mnist", "gs.steps=12", "gs.hidden=16", "gs.eval_every=5",
                                "regularizer.start_step=6"])
    r = result_of(get_task("gs_colored_mnist")(cfg))
    assert r["method"] == "SD λ=1.0, loss×2e-05 (from step 6)"
    assert set(r["fig3"]) == {"grayscale_digit", "colored_digit", "grayscale_blank", "colored_blank"}
    assert 0 <= r["test"]["acc"] <= 1 and [c["step"] for c in r["curve"]] == [0, 5, 10, 11]
    assert set(r["environments"]) == {"train1", "train2", "test"}
