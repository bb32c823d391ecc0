"""Paper presets fit QLEACE and gradient erasure as the paper's code did; everything else uses our defaults."""

from __future__ import annotations

from pathlib import Path

import pytest

import erasure
from training.common.sweep_jobs import fast_expand
from training.common.sweeps import expand

PAPER = ["paper_table_c", "paper_fig5_width", "paper_fig5_depth", "paper_fig6_7_width", "paper_fig6_7_depth",
         "paper_fig8_width", "paper_fig8_depth", "paper_fig16"]


@pytest.mark.parametrize("name", PAPER)
def test_paper_presets_use_shrinkage_and_8_bit_gradient_data(name: str, tmp_path: Path) -> None:
    # every job of the sweep, as `make plan` expands it (== Hydra's composition: tests/test_plan.py, every preset)
    jobs = fast_expand(name, [f"paths.out_dir={tmp_path}", "seed=0"])
    by_eraser: dict[str, list[dict]] = {}
    for job in jobs:
        by_eraser.setdefault(job["eraser"]["name"], []).append(job)
    assert {"qleace", "gradient"} <= set(by_eraser)
    for job in by_eraser["qleace"]:
        assert job["eraser"]["options"]["rank_deficient"] == "shrinkage"
        assert "/qleace/" in job["paths"]["job_dir"]  # same job directories as eraser=qleace
        assert erasure.resolve_options("qleace", job["eraser"]["options"])["rank_deficient"] == "shrinkage"
    for job in by_eraser["gradient"]:
        assert job["eraser"]["options"]["quantize"] is True and "/gradient/" in job["paths"]["job_dir"]
        assert (job["eraser"]["options"]["quantize_mode"], job["eraser"]["options"]["loss"]) == ("truncate", "norm")
    for job in by_eraser["alf_qleace"]:
        assert job["eraser"]["options"]["stop_norm"] == "frobenius"
    assert all(j["eraser"]["fit_on"] == "all" for j in jobs)  # the paper's protocol: fitted on the coded data
    assert all(j["eraser"]["after_augment"] is True for j in jobs)  # transform(augment(x)), as its code


def test_explicit_eraser_on_a_paper_preset_gets_the_default(tmp_path: Path) -> None:
    own = expand("paper_table_c", [f"paths.out_dir={tmp_path}", "seed=0", "eraser=qleace"])
    assert {j["eraser"]["options"]["rank_deficient"] for j in own} == {"coupling"}


@pytest.mark.parametrize("name", ["offline_table", "demo"])
def test_other_presets_use_the_defaults(name: str, tmp_path: Path) -> None:
    jobs = expand(name, [f"paths.out_dir={tmp_path}", "seed=0"])
    opts = {j["eraser"]["name"]: j["eraser"]["options"] for j in jobs}
    assert opts["qleace"]["rank_deficient"] == "coupling" and opts["gradient"]["quantize"] is False
    assert (opts["gradient"]["loss"], opts["gradient"]["quantize_mode"], opts["alf_qleace"]["stop_norm"]) == (
        "squared", "round", "spectral")
    assert not any(j["eraser"]["after_augment"] for j in jobs)
