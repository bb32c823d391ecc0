"""The job-path scheme is one module (training/tasks/mdl/job_paths.py): it makes and parses every job directory, and the
yaml interpolation of conf/paths/default.yaml gives the same directories on every preset that uses it."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import DictConfig, OmegaConf

from tests.helpers import job_config
from training.app.tasks import spec_of
from training.common.sweeps import CONF_DIR, expand, presets
from training.tasks.mdl.job_paths import JobPath, job_dir

# Gradient Starvation presets lay their jobs out by their own keys (conf/experiment/gs_*.yaml `paths.job_subdir`);
# nothing parses those paths. Every other preset uses the scheme.
OWN_LAYOUT = {"gs_colored_mnist", "gs_sd_erasure", "gs_two_moons"}


def test_the_presets_with_their_own_layout_are_the_known_ones() -> None:
    loaded = {n: OmegaConf.load(CONF_DIR / "experiment" / f"{n}.yaml") for n in presets()}
    assert all(isinstance(cfg, DictConfig) for cfg in loaded.values())
    assert {n for n, cfg in loaded.items() if "job_subdir" in OmegaConf.select(cfg, "paths", default={})} == OWN_LAYOUT


@pytest.mark.parametrize("name", sorted(set(presets()) - OWN_LAYOUT))
def test_the_yaml_and_the_module_give_every_preset_job_the_same_directories(name: str, tmp_path: Path) -> None:
    for job in expand(name, [f"paths.out_dir={tmp_path}"], limit=3):
        assert job["paths"]["job_dir"] == str(job_dir(tmp_path, job, spec_of(job))), name
        legacy = JobPath.of(job, spec_of(job), legacy=True)
        assert job["paths"]["legacy_job_dir"] == str(legacy.under(tmp_path / "runs")), name
        assert JobPath.parse(job["paths"]["job_dir"]) == JobPath.of(job, spec_of(job))
        assert JobPath.parse(job["paths"]["legacy_job_dir"]) == JobPath.of(job, spec_of(job), legacy=True)


def test_another_config_another_cell_and_a_path_of_another_shape_parses_to_none(tmp_path: Path) -> None:
    a = JobPath.of(job_config(tmp_path, ["experiment=smoke"]), spec_of("mdl"))
    b = JobPath.of(job_config(tmp_path, ["experiment=smoke", "optim.lr=0.001"]), spec_of("mdl"))
    assert a.cell != b.cell and a.cell is not None and (a.dataset, a.eraser, a.width, a.seed) == ("digits", "control",
                                                                                                   32, 0)
    assert JobPath.parse(a.under(tmp_path)) == a and JobPath.parse(f"{tmp_path}/x/{a.subdir}") == a
    for other in ("digits/control/mlp-w32/seed0", "digits/control/mlp-w32-d2/c123/seed0", "a/b/seed0", ""):
        assert JobPath.parse(other) is None, other
