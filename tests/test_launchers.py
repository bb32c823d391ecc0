"""Launchers (local, parallel = joblib, submitit_local, slurm) and the multirun's done/skipped/failed accounting."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from training.common.sweeps import CONF_DIR, expand

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled"}


def _launcher(*overrides: str) -> DictConfig:
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=list(overrides), return_hydra_config=True).hydra.launcher


def _multirun(out_dir: Path, *overrides: str, timeout: int = 300) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "training.run", "-m", "experiment=smoke", f"paths.out_dir={out_dir}",
           "logger=none", "progress=false", *overrides]
    return subprocess.run(cmd, cwd=REPO, env=ENV, capture_output=True, text=True, timeout=timeout)


def test_local_and_parallel_launchers_compose() -> None:
    assert _launcher("hydra/launcher=local")._target_ == "hydra._internal.core_plugins.basic_launcher.BasicLauncher"
    parallel = _launcher("hydra/launcher=parallel", "hydra.launcher.n_jobs=3")
    assert parallel._target_.endswith("JoblibLauncher") and parallel.n_jobs == 3
    assert _launcher("hydra/launcher=parallel").n_jobs == 2 and _launcher("hydra/launcher=joblib").n_jobs == -1
    local = _launcher("hydra/launcher=submitit_local")
    assert local._target_.endswith("submitit_launcher.LocalLauncher")


def test_slurm_config_validates_offline_and_every_field_is_overridable() -> None:
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf
    from hydra_plugins.hydra_submitit_launcher.submitit_launcher import SlurmLauncher

    cfg = _launcher("hydra/launcher=slurm", "hydra.launcher.partition=gpu", "hydra.launcher.gpus_per_node=2",
                    "hydra.launcher.cpus_per_task=4", "hydra.launcher.mem_gb=16", "hydra.launcher.timeout_min=30",
                    "hydra.launcher.array_parallelism=8", 'hydra.launcher.setup=["module load cuda"]',
                    "+hydra.launcher.additional_parameters.mail-type=END")
    checked = OmegaConf.merge(OmegaConf.structured(SlurmQueueConf), cfg)  # type-checks every field
    assert (checked.partition, checked.gpus_per_node, checked.cpus_per_task, checked.mem_gb, checked.timeout_min,
            checked.array_parallelism) == ("gpu", 2, 4, 16, 30, 8)
    assert checked.max_num_timeout > 0  # requeued jobs resume from progress.json
    launcher = instantiate(cfg)  # builds the launcher object; nothing is submitted
    assert isinstance(launcher.submitit, SlurmLauncher) and launcher.params["partition"] == "gpu"
    assert launcher.params["setup"] == ["module load cuda"]
    assert launcher.params["additional_parameters"] == {"chdir": str(REPO), "mail-type": "END"}
    with pytest.raises(ConfigCompositionException):
        _launcher("hydra/launcher=slurm", "hydra.launcher.partitoin=gpu")  # typos are errors


def test_slurm_is_never_the_default() -> None:
    for overrides in ([], ["experiment=paper_table_c"], ["experiment=offline_table"]):
        assert "Slurm" not in _launcher(*overrides)._target_


def test_failed_job_does_not_stop_the_sweep_but_the_multirun_fails(tmp_path: Path) -> None:
    # a job that fails when it runs (its data is absent; a bad value would refuse the whole sweep up front)
    proc = _multirun(tmp_path, "eraser=control", "seed=0", "++dataset.download=false", "dataset=cifar10,digits",
                     f"paths.data_dir={tmp_path / 'no-data'}")
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert "[1/2] failed" in text and "[2/2] done" in text and "CIFAR-10 not found" in text
    assert "multirun: 2/2 jobs ran: 1 done, 0 skipped, 1 failed" in text
    assert len(list((tmp_path / "runs/digits/control/mlp_relu-w32-d2").glob("c*/seed0/result.json"))) == 1
    assert not list((tmp_path / "runs/cifar10").rglob("result.json"))
    (summary_path,) = (tmp_path / "runs/.multirun").glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert (summary["total"], summary["done"], summary["skipped"], summary["failed"]) == (2, 1, 0, 1)
    failed = next(j for j in summary["jobs"] if j["status"] == "failed")
    assert "/cifar10/" in failed["job_dir"] and "CIFAR-10 not found" in failed["error"]


def _all_results(out_dir: Path) -> list[Path]:
    jobs = expand("smoke", [f"paths.out_dir={out_dir}"])
    return [Path(j["paths"]["job_dir"]) / "result.json" for j in jobs]


@pytest.mark.slow
def test_submitit_local_multirun_of_smoke(tmp_path: Path) -> None:
    proc = _multirun(tmp_path, "hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10", timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert all(p.exists() for p in _all_results(tmp_path))
    (summary,) = (tmp_path / "runs/.multirun").glob("*/summary.json")  # written by jobs in other processes
    assert json.loads(summary.read_text())["done"] == 4


@pytest.mark.slow
def test_parallel_multirun_of_smoke(tmp_path: Path) -> None:
    proc = _multirun(tmp_path, "hydra/launcher=parallel", timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert all(p.exists() for p in _all_results(tmp_path))
    assert "4/4 jobs ran: 4 done, 0 skipped, 0 failed" in proc.stdout + proc.stderr


def test_the_slurm_launcher_cuts_a_sweep_into_arrays_of_at_most_max_array_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """Without a cluster: 7 jobs where MaxArraySize is 3 go to the submitit launcher as arrays of 3, 3 and 1 (each
    job keeping its number in the sweep), and their results come back in the sweep's order; no limit known: one."""
    import hydra_plugins.erasure_mdl_slurm.slurm_launcher as slurm

    assert slurm.array_slices(7, 3) == [range(0, 3), range(3, 6), range(6, 7)]
    assert slurm.array_slices(2, None) == [range(0, 2)] and slurm.array_slices(3, 3) == [range(0, 3)]

    class Fake:
        def __init__(self) -> None:
            self.calls: list[tuple[list[str], int]] = []

        def launch(self, overrides: list[list[str]], first: int) -> list[str]:
            self.calls.append(([o[0] for o in overrides], first))
            return [f"ret{first + i}" for i in range(len(overrides))]

    launcher = object.__new__(slurm.SlurmLauncher)
    launcher.submitit = Fake()
    jobs = [[f"seed={k}"] for k in range(7)]
    monkeypatch.setattr(slurm, "max_array_size", lambda: 3)
    assert list(launcher.launch(jobs, 10)) == [f"ret{k}" for k in range(10, 17)]
    assert sorted(launcher.submitit.calls, key=lambda c: c[1]) == [
        (["seed=0", "seed=1", "seed=2"], 10), (["seed=3", "seed=4", "seed=5"], 13), (["seed=6"], 16)]
    monkeypatch.setattr(slurm, "max_array_size", lambda: None)
    launcher.submitit = Fake()
    launcher.launch(jobs, 0)
    assert launcher.submitit.calls == [([f"seed={k}" for k in range(7)], 0)]
