"""Launchers (local, parallel = joblib, submitit_local, slurm) and the multirun's done/skipped/failed accounting; the
ledger's entry (training/common/ledger_entry.py) is decoded once, entries of older versions read as they were written,
and a file that is not an entry is one warning naming it, never a traceback."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
from hydra import compose, initialize_config_dir
from hydra.errors import ConfigCompositionException
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf

from tests.helpers import ENV, REPO
from training.cli.ledger import summary_line
from training.common.ledger_entry import LedgerEntry, LedgerEntryError, read_ledger
from training.common.sweeps import CONF_DIR, expand


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
    assert _launcher("hydra/launcher=submitit_local")._target_.endswith("submitit_launcher.LocalLauncher")
    for overrides in ([], ["experiment=paper_table_c"], ["experiment=offline_table"]):
        assert "Slurm" not in _launcher(*overrides)._target_  # slurm is never the default


def test_slurm_config_validates_offline_and_every_field_is_overridable() -> None:
    from hydra_plugins.hydra_submitit_launcher.config import SlurmQueueConf  # after Hydra has scanned its plugins
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


def test_failed_job_does_not_stop_the_sweep_but_the_multirun_fails(tmp_path: Path) -> None:
    # a job that fails when it runs (its data is absent; a bad value would refuse the whole sweep up front)
    proc = _multirun(tmp_path, "eraser=control", "seed=0", "++dataset.download=false", "dataset=cifar10,digits",
                     f"paths.data_dir={tmp_path / 'no-data'}")
    text = proc.stdout + proc.stderr
    assert proc.returncode != 0, text[-3000:]
    assert "[1/2] failed" in text and "[2/2] done" in text and "CIFAR-10 not found" in text
    assert "multirun: 2/2 jobs ran: 1 done, 0 skipped, 1 failed" in text and "Traceback" not in text
    assert len(list((tmp_path / "runs/digits/control/mlp_relu-w32-d2").glob("c*/seed0/result.json"))) == 1
    assert not list((tmp_path / "runs/cifar10").rglob("result.json"))
    (summary_path,) = (tmp_path / "runs/.multirun").glob("*/summary.json")
    summary = json.loads(summary_path.read_text())
    assert (summary["total"], summary["done"], summary["skipped"], summary["failed"]) == (2, 1, 0, 1)
    (failed,) = [j for j in summary["jobs"] if j["status"] == "failed"]
    assert "/cifar10/" in failed["job_dir"] and failed["error"].startswith("CIFAR-10 not found")
    assert f"FAILED {failed['job_dir']}: CIFAR-10 not found" in text  # its line, and in its run.log
    assert failed["error"] in (Path(failed["job_dir"]) / "run.log").read_text()


@pytest.mark.slow
@pytest.mark.parametrize("launcher", [["hydra/launcher=submitit_local", "hydra.launcher.timeout_min=10"],
                                      ["hydra/launcher=parallel"]], ids=["submitit_local", "parallel"])
def test_a_multirun_of_smoke_with_workers(tmp_path: Path, launcher: list[str]) -> None:
    proc = _multirun(tmp_path, *launcher, timeout=600)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    assert all((Path(j["paths"]["job_dir"]) / "result.json").exists()
               for j in expand("smoke", [f"paths.out_dir={tmp_path}"]))
    assert "4/4 jobs ran: 4 done, 0 skipped, 0 failed" in proc.stdout + proc.stderr
    (summary,) = (tmp_path / "runs/.multirun").glob("*/summary.json")  # written by jobs in other processes
    assert json.loads(summary.read_text())["done"] == 4


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


# What the callback wrote before the entry was a type (the keys in this order; error/reason only when set).
OLDER = [{"num": 0, "job_dir": "/r/a", "seconds": 1.25, "status": "done"},
         {"num": 1, "job_dir": "/r/b", "seconds": 0.5, "status": "skipped", "reason": "done by another run"},
         {"num": 2, "job_dir": "/r/c", "seconds": 2.0, "status": "failed", "error": "ValueError: bad"}]


@pytest.mark.parametrize("raw", OLDER)
def test_an_older_entry_reads_and_writes_back_byte_for_byte(raw: dict) -> None:
    entry = LedgerEntry.from_json(raw)
    assert json.dumps(entry.to_json()) == json.dumps(raw)
    assert entry.done_by_another_run == (raw["num"] == 1)


@pytest.mark.parametrize(("raw", "why"), [
    ([1, 2], "a JSON object expected, not list"),
    ({"num": 3, "job_dir": "/r/d"}, "it lacks status"),
    ({"num": 3, "job_dir": "/r/d", "status": "finished"}, "status='finished' is not allowed"),
    ({"num": "3", "job_dir": "/r/d", "status": "done"}, "num='3' is not allowed"),
    ({"num": 3, "job_dir": None, "status": "done"}, "job_dir=None is not allowed"),
])
def test_what_is_not_an_entry_is_refused_in_one_line(raw: object, why: str) -> None:
    with pytest.raises(LedgerEntryError, match=why) as err:
        LedgerEntry.from_json(raw)
    assert "\n" not in str(err.value)


def test_a_corrupt_file_in_a_ledger_is_a_warning_naming_it_and_the_rest_counts(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    entry = LedgerEntry.from_json({"num": 1, "job_dir": "/r/x", "status": "failed", "error": "ValueError: boom"})
    assert (entry.seconds, entry.error, entry.file_name) == (None, "ValueError: boom", "job-00001.json")  # by hand
    for raw in OLDER:
        (tmp_path / f"job-{raw['num']:05d}.json").write_text(json.dumps(raw))
    (tmp_path / "job-00003.json").write_text('{"num": 3, "job_dir": "/r/d"')  # truncated
    (tmp_path / "job-00004.json").write_text(json.dumps({"num": 4, "job_dir": "/r/e"}))  # no status
    with caplog.at_level(logging.WARNING):
        entries = read_ledger(tmp_path)
    assert [e.num for e in entries] == [0, 1, 2]
    warned = [r.getMessage() for r in caplog.records]
    assert len(warned) == 2 and "job-00003.json" in warned[0] and "job-00004.json: it lacks status" in warned[1]
    assert "3/5 jobs ran: 1 done, 1 skipped (1 done by another run), 1 failed, 2 not run" in summary_line(entries, 5)
