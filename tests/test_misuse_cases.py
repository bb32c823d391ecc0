"""Careless and careful misuse: each case a test that failed before its fix (most at config-composition level)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import IO, cast

import pytest
import torch

from scripts import aggregate, plan
from tests.helpers import ENV, REPO, TINY, job_config
from tests.test_aggregate_faults import _cfg, _run, _write
from training.app.schema import ConfigError, duplicate_jobs
from training.app.tasks import load_job, spec_of
from training.cli.preemption import Preempted, stop_on_sigterm
from training.data import cache as cache_mod
from training.data.registry import LoadedData, _check
from training.tasks.mdl import refusals


# --- --strict means verified ------------------------------------------------------------------------------------------
def test_strict_refuses_results_whose_cleanliness_is_unknown(tmp_path: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "runs"
    dirs = [_write(root, _cfg("control", seed), 1.0 + seed, commit="a" * 40) for seed in (0, 1)]
    assert _run(root, tmp_path, "--strict")[0] == 0  # one known clean commit: accepted
    path = dirs[1] / "result.json"
    result = json.loads(path.read_text())
    result["provenance"]["code"]["dirty"] = None  # git could not tell (a checkout another user owns)
    path.write_text(json.dumps(result))
    capsys.readouterr()
    assert _run(root, tmp_path, "--strict")[0] == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "dirty null" in err[0] and str(dirs[1]) in err[0], err
    assert _run(root, tmp_path)[0] == 0  # without --strict: tabulated


# --- a finished job is a SKIP whatever its directory's permissions; run.log never stops a sweep -----------------------
def _as_reader(out: Path, readonly: Path) -> list[str]:
    """The prefix of a command run as a user who cannot write `readonly` (nor its files) but can write the rest of
    `out`: `nobody` (setpriv) when the tests run as root (chmod does not stop root), else chmod a-w."""
    if os.geteuid() != 0:
        for p in [readonly, *readonly.iterdir()]:
            p.chmod(p.stat().st_mode & ~0o222)
        return []
    if shutil.which("setpriv") is None:
        pytest.skip("root without setpriv: cannot act as a user who may not write")
    for p in [out, *out.rglob("*")]:
        shutil.chown(p, 65534, 65534)
        p.chmod(p.stat().st_mode | 0o755 if p.is_dir() else p.stat().st_mode | 0o644)
    for p in [readonly, *readonly.iterdir()]:
        shutil.chown(p, 0, 0)
        p.chmod(0o755 if p.is_dir() else 0o644)

    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def test_a_finished_job_in_a_read_only_directory_is_a_skip_and_the_sweep_goes_on() -> None:
    out = Path(tempfile.mkdtemp(prefix="erasure-mdl-ro-"))
    out.chmod(0o755)
    try:
        run = [sys.executable, "-m", "training.run"]
        base = [*run, f"paths.out_dir={out}", "logger=none", *TINY]
        subprocess.run([*base, "seed=0"], check=True, capture_output=True, env=ENV, cwd=REPO, timeout=300)
        seed0 = next(out.rglob("result.json")).parent
        result = (seed0 / "result.json").read_text()
        reader = _as_reader(out, seed0)
        env = {**ENV, "HOME": str(out)}
        one = subprocess.run([*reader, *base, "seed=0"], capture_output=True, text=True, env=env, cwd=out,
                             timeout=300)
        assert one.returncode == 0 and "SKIP" in one.stdout and "Traceback" not in one.stderr, one.stderr[-3000:]
        assert sum("cannot write the log file" in ln for ln in one.stderr.splitlines()) == 1, one.stderr
        forced = subprocess.run([*reader, *base, "seed=0", "force=true"], capture_output=True, text=True, env=env,
                                cwd=out, timeout=300)  # it cannot replace the result: refused before it trains
        lines = forced.stderr.strip().splitlines()
        assert forced.returncode == 2 and len(lines) == 1 and f"no permission for {seed0}" in lines[0], forced.stderr
        assert "block 2/" not in forced.stdout, forced.stdout
        sweep = subprocess.run([*reader, *run, "-m", *base[3:], "seed=0,1"], capture_output=True, text=True, env=env,
                               cwd=out, timeout=300)
        assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-3000:]
        assert "2/2 jobs ran: 1 done, 1 skipped, 0 failed" in sweep.stdout + sweep.stderr, sweep.stdout[-2000:]
        assert (seed0 / "result.json").read_text() == result
    finally:
        shutil.rmtree(out, ignore_errors=True)


# --- a signal is a checkpoint at every point of a job, the cache write included ---------------------------------------
def test_a_sigterm_during_the_erased_data_cache_write_stops_the_job(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """torch.save into a Python file object turns the SIGTERM handler's Preempted, raised while torch writes, into
    RuntimeError("unexpected pos ..."): the cache took it for a failed write and the job ran on to the end."""
    class SignalledFile:  # a SIGTERM lands during torch.save's second write (during its first, torch passes it on)
        def __init__(self, f: IO[bytes]) -> None:
            self.f, self.writes = f, 0

        def write(self, b: bytes) -> int:
            self.writes += 1
            if self.writes == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            return self.f.write(b)

        def flush(self) -> None:
            self.f.flush()

    def save(x: torch.Tensor, tmp: str) -> None:
        with open(tmp, "wb") as f:
            torch.save(x, cast(IO[bytes], SignalledFile(f)))  # a file object as far as torch.save goes

    monkeypatch.setattr(cache_mod, "_save_tensor", save)
    with pytest.raises(Preempted) as stop, stop_on_sigterm():
        cache_mod.cached_erase(tmp_path, {"k": 1}, lambda: (torch.zeros(1000, 4), {"r": 1}))
    assert stop.value.code == 143
    assert not list((tmp_path / "erased").glob("*/manifest.json"))  # no half entry left as if complete


# --- a cell with hydra.job.chdir=true and a relative out_dir --------------------------------------------------------
QUICK = ["logger=none", "progress=false", "dataset=digits", "mdl=quick", "mdl.max_epochs=1", "mdl.min_steps=0",
         "mdl.patience_min_steps=0", "mdl.full_run=false", "arch.width=8", "optim.warmup_steps=0",
         "certificate=false", "seeds=2"]


def test_a_cell_with_chdir_and_a_relative_out_dir_writes_where_the_command_started(tmp_path: Path) -> None:
    for attempt in ("first", "rerun"):
        proc = subprocess.run([sys.executable, "-m", "training.run", "-m", *QUICK, "paths.out_dir=rel",
                               "hydra.job.chdir=true"], cwd=tmp_path, env=ENV, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        ran = "2 done, 0 skipped" if attempt == "first" else "0 done, 2 skipped"
        assert f"2/2 jobs ran: {ran}, 0 failed" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-2000:]
    results = sorted(tmp_path.rglob("result.json"))
    assert len(results) == 2 and all(r.relative_to(tmp_path).parts.count("rel") == 1 for r in results), results


# --- the ugly cases, each one line (config level: nothing composed but the config, nothing trained) -------------------
def _refusal(tmp_path: Path, overrides: list[str], precheck: bool = False) -> str:
    try:
        cfg = load_job(job_config(tmp_path / "out", overrides))
        if precheck:
            refusals.precheck(cfg, torch.device("cpu"))
    except ConfigError as err:
        line = str(err)
        assert "\n" not in line and "is not allowed" in line, line
        return line
    raise AssertionError(f"{overrides} accepted")


@pytest.mark.parametrize("overrides, says, precheck", [
    (["dataset=mixture", "dataset.cov_gap=3"], "dataset.cov_gap is not read there", False),
    (["dataset=two_moons", "dataset.n_test=500"], "with dataset=two_moons with task=mdl", False),
    (["dataset=gaussian", "eraser=leace", "eraser.fit_on=oracle", "eraser.n_fit=1"], "at least 2", False),
    (["dataset=gaussian", "dataset.dim=100000"], "of memory", False),
    (["paths.cell=."], "paths.cell='.'", False),
    (["dataset.tag=."], "dataset.tag='.'", False),
    ([f"dataset.tag={'x' * 256}"], "at most 255 bytes", False),
    ([f"paths.out_dir=/tmp/{'y' * 256}"], "over the file system's 255", False),
    # what the samples' shape rules out (the precheck, once the data is loaded)
    (["dataset=gaussian", "arch=lenet"], "arch=lenet is not allowed with dataset=gaussian", True),
    (["dataset=gaussian", "dataset.augment=true"], "vectors", True),
    (["dataset=mixture", "dataset.augment=true"], "vectors", True),
    (["dataset=two_moons", "dataset.augment=true"], "vectors", True),
    (["dataset=gaussian", "eraser=gradient"], "takes samples in [0, 1], these lie in [", True),  # was a traceback
])
def test_a_config_that_changes_nothing_or_cannot_run_is_one_line(tmp_path: Path, overrides: list[str], says: str,
                                                                  precheck: bool) -> None:
    assert says in _refusal(tmp_path, overrides, precheck=precheck)


def test_the_accepted_neighbours_still_compose(tmp_path: Path) -> None:
    """Where the refusals above must not fire."""
    for overrides in (["dataset=mixture"], ["dataset=cifar10", "eraser=leace", "eraser.after_augment=true"],
                      ["eraser=leace", "eraser.after_augment=true"],  # paper_fig8 (SVHN, no augmentation) sets it
                      ["dataset=gaussian", "eraser=leace", "eraser.fit_on=oracle", "eraser.n_fit=2"],
                      ["dataset=gaussian", "dataset.dim=64"], ["paths.cell=c.1"], ["dataset.tag=a.b"]):
        load_job(job_config(tmp_path / "out", overrides))


def test_a_dangling_symlink_as_out_dir_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "link").symlink_to(tmp_path / "nowhere")
    line = _refusal(tmp_path, [f"paths.out_dir={tmp_path / 'link' / 'sub'}"])
    assert "symbolic link" in line and str(tmp_path / "nowhere") in line


def _refused_command(cwd: Path, *args: str) -> str:
    """`python -m training.run *args` run in `cwd`: exit 2, one line on stderr (returned), nothing added to `cwd`."""
    before = sorted(cwd.iterdir())
    proc = subprocess.run([sys.executable, "-m", "training.run", *args], cwd=cwd, env={**ENV, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-3000:]
    assert sorted(cwd.iterdir()) == before, list(cwd.rglob("*"))  # nothing written, not even paths.out_dir
    return lines[0]


@pytest.mark.parametrize(("args", "said"), [
    (["-m", "seed=0,1", "hydra/launcher=packed"], "hydra/launcher=packed is gone"),
    (["hydra/launcher=packed"], "hydra/launcher=packed is gone"),  # a single run too (it used to run, ignoring it)
    (["seeds=0"], "seeds=0 is not allowed: seeds must be"),  # Hydra's 300-line traceback from the run directory
    (["seeds=[1,1]"], "seeds=[1, 1] is not allowed"),
    (["-m", "seeds=-1"], "seeds=-1 is not allowed"),
    (["eraser.name=bogus"], "eraser.name='bogus'"),
    (["-m", "optim.lr=interval(0.1,1)"], "optim.lr=interval(0.1,1) cannot be swept"),
    (["-m", "arch.width=range(1,3,0)"], "arch.width=range(1,3,0) cannot be swept"),
    (["-m", "eraser=glob(zz*)"], "eraser=glob(zz*) sweeps over no value"),
    (["-m", "arch.width=range(3,1)"], "arch.width=range(3,1) sweeps over no value"),
], ids=["packed-m", "packed", "seeds-0", "seeds-repeated", "seeds-negative-m", "eraser-name", "odd-interval",
        "odd-range-step-0", "odd-glob", "odd-empty-range"])
def test_a_bad_command_line_is_refused_in_one_line_writing_nothing(tmp_path: Path, args: list[str],
                                                                   said: str) -> None:
    line = _refused_command(tmp_path, *args, f"paths.out_dir={tmp_path / 'out'}", "logger=none")
    assert said in line, line
    if said.endswith(("cannot be swept", "sweeps over no value")):
        assert "write" in line or "give" in line, line  # what to write instead


# --- the aggregate's arguments ---------------------------------------------------------------------------------------
def test_aggregate_refuses_a_bad_override_value_a_name_with_a_separator_and_an_unwritable_out(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert aggregate.main(["--experiment", "demo", "--override", "arch.width=abc"]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "arch.width" in lines[0], lines
    root = tmp_path / "runs"
    _write(root, _cfg("control", 0), 1.0, commit="a" * 40)
    assert aggregate.main([str(root), "--name", "a/b", "--out", str(tmp_path / "t")]) == 2
    out, err = capsys.readouterr()
    assert "wrote" not in err and "--name 'a/b' is not allowed" in err, err
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert aggregate.main([str(root), "--out", str(blocker / "t")]) == 2  # a folder that cannot be made
    out, err = capsys.readouterr()
    assert "wrote" not in err and "cannot be written" in err, err


# --- make plan -------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("content", ["[]", '{"steps": 5}'])
def test_plan_reads_a_gpu_report_of_the_wrong_shape_as_no_measurement(tmp_path: Path, content: str) -> None:
    path = tmp_path / "gpu_report.json"
    path.write_text(content)
    costs, missing = plan.gpu_report_cost(path)
    assert costs == {} and missing is not None and "cannot be read" in missing and "make gpu-report" in missing


@pytest.mark.parametrize(("good", "bad", "says"), [
    ([], ["arch.width=abc"], "arch.width='abc' is not allowed"),
    (["eraser=leace", "seed=0", "eraser.after_augment=true"],
     ["eraser=leace", "seed=0", "eraser.after_augment=true,false"],  # over a key that changes nothing (below)
     "sweep one value of eraser.after_augment"),
], ids=["bad-value", "after-augment-sweep"])
def test_plan_fails_on_a_sweep_that_would_be_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                     good: list[str], bad: list[str], says: str) -> None:
    none = str(tmp_path / "none.json")
    options = ["--bench", none, "--gpu-report", none]
    assert plan.main(["smoke", f"paths.out_dir={tmp_path}", *good, *options]) == 0
    capsys.readouterr()
    assert plan.main(["smoke", f"paths.out_dir={tmp_path}", *bad, *options]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and says in err[0], err


def test_plan_names_a_group_choice_the_path_does_not_show(tmp_path: Path) -> None:
    """sensitivity: eraser=qleace and eraser=qleace_paper both write under .../qleace/...: their cells differ."""
    none = tmp_path / "none.json"
    text = plan.report("sensitivity", [f"paths.out_dir={tmp_path}", "arch.parametrization=mup",
                                       "dataset.zscore_order=before", "seed=0"], 0, none, none)
    qleace = [ln for ln in text.splitlines() if "/qleace/" in ln]
    assert len(qleace) == 2 and sum("eraser=qleace_paper" in ln for ln in qleace) == 1, qleace


# --- eraser.after_augment=true,false without augmentation: two cells with bit-equal numbers -----------------------
# eraser.after_augment stays hashed without augmentation (paper_fig8 sets it on SVHN without augmentation: its 325
# job hashes must stay), so a single job with either value runs; a sweep over both values is refused.
SWEPT = ["dataset=digits", "eraser=leace", "certificate=false"]


def _duplicates(tmp_path: Path, values: list[list[str]]) -> str | None:
    jobs = [job_config(tmp_path, [*SWEPT, *v]) for v in values]
    return duplicate_jobs([(i, cfg, spec_of(cfg)) for i, cfg in enumerate(jobs)])


def test_a_sweep_over_a_key_that_changes_nothing_is_refused_in_one_line(tmp_path: Path) -> None:
    line = _refused_command(tmp_path, "-m", f"paths.out_dir={tmp_path}", "logger=none", *SWEPT,
                            "eraser.after_augment=true,false")
    assert line.startswith("error: multirun refused (nothing ran): jobs 0 and 1 differ only in "
                           "eraser.after_augment=true,false"), line
    assert line.endswith("sweep one value of eraser.after_augment"), line
    assert "read only with dataset.augment=true" in line, line


@pytest.mark.parametrize("values, refused", [
    ([["eraser.after_augment=true"], ["eraser.after_augment=false"]], True),
    ([["eraser.after_augment=true", "dataset.augment=true"], ["eraser.after_augment=false", "dataset.augment=true"]],
     False),  # with augmentation: per batch erases the augmented images, another computation
    ([["eraser.after_augment=true", "seed=1"], ["eraser.after_augment=false", "seed=2"]], False),  # other seeds
    ([["eraser.after_augment=true", "eraser=control"], ["eraser.after_augment=false", "eraser=control"]], False),
    # the identity control: after_augment is not hashed, the two are one job (the sweep runs it once)
])
def test_a_sweep_is_refused_only_where_its_jobs_are_equal_but_for_such_a_key(tmp_path: Path, values: list[list[str]],
                                                                             refused: bool) -> None:
    why = _duplicates(tmp_path, values)
    assert (why is not None) == refused, why
    if refused:
        assert why == ("jobs 0 and 1 differ only in eraser.after_augment=true,false, which changes nothing here "
                       "(eraser.after_augment is read only with dataset.augment=true): their numbers would be equal "
                       "under two hashes; sweep one value of eraser.after_augment")


@pytest.mark.parametrize("overrides", [
    [*SWEPT, "eraser.after_augment=true"], [*SWEPT, "eraser.after_augment=false"],  # a single job with either value
    ["dataset=digits", "eraser=gradient"],  # gradient erasure on samples in its range
], ids=["after-augment-true", "after-augment-false", "gradient"])
def test_what_the_precheck_must_not_refuse_passes_it(tmp_path: Path, overrides: list[str]) -> None:
    """(The equal numbers of either after_augment value: tests/test_after_augment.py
    ::test_without_augmentation_after_augment_changes_nothing.)"""
    assert refusals.precheck(load_job(job_config(tmp_path, overrides)), torch.device("cpu")) is not None


# --- make calibrate runs and reads only its own sweep, and honours ARGS -----------------------------------------------
def test_make_calibrate_runs_and_reads_only_its_own_sweep_with_args(tmp_path: Path) -> None:
    """The recipe as make would run it (`make -n`): every sweep writes under CAL_OUT with ARGS last (they win), and the
    table reads CAL_OUT/runs only, or where ARGS made it write (it used to ignore ARGS and read all of outputs/runs)."""
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")

    def recipe(*args: str) -> list[str]:
        proc = subprocess.run(["make", "-n", "calibrate", *args], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert proc.returncode == 0, proc.stderr
        # under `make test` the nested make also prints its "make[1]: Entering/Leaving directory" lines
        return [ln for ln in proc.stdout.strip().replace("\\\n", " ").splitlines()
                if not re.match(r"make(\[\d+\])?: \w+ directory", ln)]

    out = tmp_path / "cal"
    lines = recipe("ARGS=dataset.dim=8 seed=3", f"CAL_OUT={out}")
    sweeps = [ln for ln in lines if "-m training.run" in ln]
    assert len(sweeps) >= 2 and all(f"paths.out_dir={out}" in ln and ln.rstrip().endswith("dataset.dim=8 seed=3")
                                    for ln in sweeps), sweeps
    table = [ln for ln in lines if "-m scripts.calibrate" in ln]
    assert len(table) == 1 and table[0].split()[-1] == str(out / "runs"), table
    assert recipe("ARGS=paths.out_dir=/x seed=1")[-1].endswith("-m scripts.calibrate /x/runs")
    assert recipe()[-1].endswith("-m scripts.calibrate outputs/calibrate/runs")
    assert recipe("CAL_OUT=/y")[-1].endswith("-m scripts.calibrate /y/runs")


# --- paths.out_dir through a file or a symlink loop: one line naming it, exit 2, nothing written --------------------
def test_an_out_dir_through_a_file_or_a_symlink_loop_is_named_so(tmp_path: Path) -> None:
    (tmp_path / "afile").write_text("x")
    (tmp_path / "loop_a").symlink_to(tmp_path / "loop_b")
    (tmp_path / "loop_b").symlink_to(tmp_path / "loop_a")
    for out, says in ((tmp_path / "afile", "is a file, not a directory"),
                      (tmp_path / "afile" / "sub", f"{tmp_path / 'afile'} is a file, not a directory"),
                      (tmp_path / "loop_a", "a loop of symbolic links")):
        line = _refused_command(tmp_path, f"paths.out_dir={out}", "logger=none", *TINY)
        assert says in line and "which does not exist" not in line, line
    assert (tmp_path / "afile").read_text() == "x"


def test_labels_outside_num_classes_are_named_in_a_short_line() -> None:
    y = torch.arange(300) % 10
    y[7] = 255  # a byte the label file should not hold
    with pytest.raises(ValueError) as err:
        _check(LoadedData("fashion_mnist", torch.zeros(300, 1, 2, 2), y, 10))
    line = str(err.value)
    assert "label 255" in line and "outside 0..9" in line and len(line) < 250 and "\n" not in line, line
    with pytest.raises(ValueError, match="no image has label 9"):
        _check(LoadedData("fashion_mnist", torch.zeros(300, 1, 2, 2), torch.arange(300) % 9, 10))
