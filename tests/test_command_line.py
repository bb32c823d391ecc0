"""Every mistake on the command line of `python -m training.run` (and of a `-m` multirun) is ONE line on stderr
naming the key and what to write instead, exit code 2, nothing written; `HYDRA_FULL_ERROR=1` adds the traceback;
a bug is never a one-liner; a multirun's failed job is a line of its summary, without Hydra's block before it.

The commands run in one process that imports the entry once and forks a child per command (the entry, its
argument parsing and its exit code are the real ones; the imports, ~2 s a command, are paid once)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import ENV, REPO

pytestmark = pytest.mark.xdist_group("command_line")  # one worker runs the commands once

SMALL = ["dataset=digits", "mdl=quick", "arch.width=16", "logger=none", "progress=false", "certificate=false"]

DRIVER = r"""
import io, json, os, sys
from omegaconf import OmegaConf
from training.cli.run import main

OmegaConf.register_new_resolver("boom", lambda: 1 // 0)  # a resolver with a bug
out = []
for case_dir, argv, env in json.loads(sys.argv[1]):
    pid = os.fork()
    if pid == 0:
        os.chdir(case_dir)
        os.environ.update(env)
        err = os.open("stderr.txt", os.O_WRONLY | os.O_CREAT)
        os.dup2(err, 2)
        os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
        os.close(err)
        sys.stderr = io.TextIOWrapper(os.fdopen(2, "wb", 0), write_through=True)
        sys.argv = ["training/run.py", *argv]
        main()  # its SystemExit, or any exception, ends the child as it ends `python -m training.run`
        sys.exit(0)
    _, status = os.waitpid(pid, 0)
    text = open(os.path.join(case_dir, "stderr.txt")).read()
    os.remove(os.path.join(case_dir, "stderr.txt"))
    out.append({"rc": os.waitstatus_to_exitcode(status), "stderr": text, "left": sorted(os.listdir(case_dir))})
print(json.dumps(out))
"""


def run_commands(tmp_path: Path, cases: list[tuple[list[str], dict[str, str]]]) -> list[dict[str, Any]]:
    """Run `python -m training.run <argv>` for each (argv, extra environment), each in a directory of its own."""
    args = []
    for num, (argv, env) in enumerate(cases):
        (tmp_path / f"case{num}").mkdir()
        args.append([str(tmp_path / f"case{num}"), argv, env])
    proc = subprocess.run([sys.executable, "-c", DRIVER, json.dumps(args)], capture_output=True, text=True,
                          env={**ENV, "PYTHONPATH": str(REPO)}, cwd=REPO, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


# (red-team case, arguments, what the one line must say)
ONE_LINE = [
    ("cfg-optim-group-unknown", ["optim=sgd"], "optim=sgd is not an option: optim is one of adamw, schedulefree"),
    ("cfg-arch-unknown", ["arch=resnet"], "arch is one of convnext, lenet, mlp, swin"),
    ("cfg-eraser-unknown", ["eraser=bogus"], "eraser=bogus is not an option: eraser is one of "),
    ("cfg-dataset-unknown", ["dataset=bogus"], "dataset=bogus is not an option: dataset is one of "),
    ("cfg-mdl-group-unknown", ["mdl=bogus"], "mdl=bogus is not an option: mdl is one of "),
    ("cfg-logger-unknown", ["logger=bogus"], "logger=bogus is not an option: logger is one of none, wandb"),
    ("cfg-experiment-unknown", ["experiment=bogus"], "experiment is one of calibrate, demo, "),
    ("cfg-experiment-typo", ["experiment=demoo"], "experiment=demoo is not an option (did you mean demo?): "
                                                  "experiment is one of calibrate, demo, gs_colored_mnist, "),
    ("cfg-regularizer-unknown", ["regularizer=bogus"], "regularizer=bogus is not an option: regularizer is one of "),
    ("cfg-launcher-m-unknown", ["-m", "hydra/launcher=bogus"], "hydra/launcher is one of basic, joblib, local, "),
    ("cfg-unknown-foo", ["foo=1"], "foo is not a config key: the keys of the config are "),
    ("cfg-typo-optim-lrr", ["optim.lrr=1"], "optim.lrr is not a config key: did you mean optim.lr? (write optim.lr=1)"),
    ("cfg-typo-arch-widht", ["arch.widht=64"], "did you mean arch.width? (write arch.width=64)"),
    ("cfg-typo-mdl-patiance", ["mdl.patiance=3"], "did you mean mdl.patience? (write mdl.patience=3)"),
    ("cfg-dataset-unknown-key", ["dataset.foo=1"], "dataset.foo is not a config key: the keys of dataset are "),
    ("cfg-eraser-option-unknown", ["eraser=leace", "eraser.options.bogus=1"],
     "eraser.options.bogus is not a config key: the keys of eraser.options are method, rtol"),
    ("cfg-hydra-unknown-key", ["hydra.foo=1"], "hydra.foo is not a config key: the keys of hydra are run, sweep, "),
    ("cfg-optim-lr-interval-single", ["optim.lr=interval(0.1,1)"],
     "optim.lr=interval(0.1,1) sweeps over several values, which only a multirun does: add -m"),
    ("cfg-arch-width-range-step0-single", ["arch.width=range(1,3,0)"], "give arch.width one value"),
    ("cfg-seed-comma-single-run", ["seed=0,0"], "add -m (one job per value), give seed one value, or write "
                                                "seeds=[0,1] for one job training those seeds"),
    ("cfg-launcher-m-parallel-n-jobs-string", ["-m", "hydra/launcher=parallel", "hydra.launcher.n_jobs=abc"],
     "hydra.launcher.n_jobs=abc is not allowed (Value 'abc' of type 'str' could not be converted to Integer): "
     "give hydra.launcher.n_jobs an integer"),
    ("cfg-hydra-chdir-string", ["hydra.job.chdir=maybe"], "give hydra.job.chdir true or false"),
    ("cfg-sweep-m-choice-empty", ["-m", "eraser=choice()"],
     "eraser=choice()' cannot be parsed (ValueError while evaluating 'choice()': empty choice is not legal)"),
    ("cfg-task-unknown", ["task=bogus"], "task=bogus is not allowed: task must be one of "),
    ("cfg-delete-dataset-group", ["~dataset"], "the config has no dataset (hydra.run.dir needs dataset.tag): "
                                               "choose one of its options (cifar10, "),
    ("cfg-interp-missing-env", ["optim.lr=${oc.env:NOPE_RT_XYZ}"],
     "optim.lr cannot be resolved (KeyError raised while resolving interpolation: \"Environment variable "
     "'NOPE_RT_XYZ' not found\"): set NOPE_RT_XYZ, or give a default: ${oc.env:NOPE_RT_XYZ,<default>}"),
    ("cfg-interp-missing-key", ["optim.lr=${nope}"], "optim.lr cannot be resolved (Interpolation key 'nope' not "
                                                     "found): write a value, or an interpolation of a key"),
    ("cfg-interp-seeds-missing", ["seeds=${nope}"], "Interpolation key 'nope' not found"),
    ("cfg-seeds-bad", ["seeds=[0,0]"], "seeds=[0, 0] is not allowed: seeds must be a count"),
    ("cfg-eraser-m-unknown-in-list", ["-m", "eraser=control,bogus"],
     "cannot be composed: eraser=bogus is not an option: eraser is one of alf_qleace, "),
    ("multirun-seed-duplicate", ["-m", "seed=0,0"], "jobs 0 and 1 of seed=0,0 are the same job ("),
    ("cfg-launcher-m-slurm-no-cluster", ["-m", "hydra/launcher=slurm"], "no SLURM cluster answered ("),
    ("path-out-dir-in-proc", ["paths.out_dir=/proc/rt_out"],
     "paths.out_dir=/proc/rt_out is not allowed: cannot create /proc/rt_out"),
]


FAILING = ["seed=0", "++dataset.download=false", "paths.data_dir=no-data", "dataset=cifar10"]  # fails, not refused
LAUNCHERS = ["hydra/launcher=local", "hydra/launcher=parallel"]


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Every command of this module, run once (one process, a child per command)."""
    slurm_conf = tmp_path_factory.mktemp("slurm") / "slurm.conf"  # a cluster whose controller is down
    slurm_conf.write_text("ClusterName=none\nSlurmctldHost=localhost\nSlurmctldPort=9\n")
    cases: list[tuple[list[str], dict[str, str]]] = []
    for _, args, _ in ONE_LINE:
        multirun = args[:1] == ["-m"]
        cases.append(([*args[:1], *SMALL, *args[1:]] if multirun else [*SMALL, *args], {"SLURM_CONF": str(slurm_conf)}))
    cases.append(([*SMALL, "foo=1"], {"HYDRA_FULL_ERROR": "1"}))  # the user's choice: the traceback as well
    cases.append(([*SMALL, "optim.lr=${boom:}"], {}))  # a bug: its traceback, never a one-liner
    cases += [(["-m", launcher, *SMALL, *FAILING], {}) for launcher in LAUNCHERS]
    return run_commands(tmp_path_factory.mktemp("commands"), cases)


@pytest.mark.parametrize("num", range(len(ONE_LINE)), ids=[case for case, _, _ in ONE_LINE])
def test_a_command_line_mistake_is_one_line_exit_2_and_nothing_written(results: list[dict[str, Any]],
                                                                      num: int) -> None:
    got, says = results[num], ONE_LINE[num][2]
    lines = got["stderr"].strip().splitlines()
    assert got["rc"] == 2 and len(lines) == 1 and lines[0].startswith("error: "), got["stderr"][-3000:]
    assert says in lines[0], lines[0]
    assert got["left"] == []  # nothing written, not even an empty outputs/


def test_hydra_full_error_adds_the_traceback_and_a_bug_is_never_a_one_liner(results: list[dict[str, Any]]) -> None:
    full, bug = results[len(ONE_LINE):len(ONE_LINE) + 2]
    assert full["rc"] == 2 and "Traceback" in full["stderr"] and "ConfigCompositionException" in full["stderr"]
    assert full["stderr"].strip().splitlines()[-1].startswith("error: foo is not a config key")
    assert bug["rc"] == 1 and "Traceback" in bug["stderr"] and "ZeroDivisionError" in bug["stderr"], bug["stderr"]
    assert not any(ln.startswith("error: ") for ln in bug["stderr"].splitlines())


@pytest.mark.parametrize("num", range(len(LAUNCHERS)), ids=LAUNCHERS)
def test_a_multirun_job_that_fails_is_a_line_of_the_summary_only(results: list[dict[str, Any]], num: int) -> None:
    """multirun-one-fails-local / -parallel, multirun-data-error-one-job: the failed job's error is its line of the
    ledger's summary, without Hydra's `Error executing job with overrides` block before it; the multirun exits 1
    (with the parallel launcher, a worker keeps the user's HYDRA_FULL_ERROR, unset here, not the entry's)."""
    got = results[len(ONE_LINE) + 2 + num]
    lines = got["stderr"].strip().splitlines()
    assert got["rc"] == 1, got["stderr"][-3000:]
    assert len(lines) == 2 and lines[0] == "multirun: 1/1 jobs ran: 0 done, 0 skipped, 1 failed", got["stderr"]
    assert lines[1].startswith("  FAILED ") and ": CIFAR-10 not found" in lines[1], lines


def test_raised_by_a_job_tells_a_jobs_exception_from_one_raised_elsewhere() -> None:
    """Hydra re-raises a failed job's exception in `JobReturn.return_value`: that is a job's, not the command line's."""
    from hydra.core.utils import JobReturn, JobStatus

    from training.common.hydra_private import raised_by_a_job

    with pytest.raises(ValueError) as job:
        JobReturn(status=JobStatus.FAILED, _return_value=ValueError("in the job")).return_value  # noqa: B018
    with pytest.raises(ValueError) as elsewhere:
        raise ValueError("while composing the config")
    assert raised_by_a_job(job.value) and not raised_by_a_job(elsewhere.value)
