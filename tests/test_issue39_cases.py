"""Issue 39: the bugs and ugly cases, each a test that failed before the fix (most at config-composition level)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.test_aggregate_faults import _cfg, _run, _write


# --- req 5: --strict means verified ---------------------------------------------------------------------------------
def test_strict_refuses_results_whose_cleanliness_is_unknown(tmp_path: Path, capsys) -> None:
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


# --- req 3: a finished job is a SKIP whatever its directory's permissions; run.log never stops a sweep ---------------
def _as_reader(out: Path, readonly: Path) -> list[str]:
    """The prefix of a command run as a user who cannot write `readonly` (nor its files) but can write the rest of
    `out`: `nobody` (setpriv) when the tests run as root (chmod does not stop root), else chmod a-w."""
    import os
    import shutil

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
    import shutil
    import subprocess
    import sys
    import tempfile

    from tests.helpers import ENV, REPO, TINY

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
        sweep = subprocess.run([*reader, *run, "-m", *base[3:], "seed=0,1"], capture_output=True, text=True, env=env,
                               cwd=out, timeout=300)
        assert sweep.returncode == 0, sweep.stdout[-2000:] + sweep.stderr[-3000:]
        assert "2/2 jobs ran: 1 done, 1 skipped, 0 failed" in sweep.stdout + sweep.stderr, sweep.stdout[-2000:]
        assert (seed0 / "result.json").read_text() == result
    finally:
        shutil.rmtree(out, ignore_errors=True)


# --- req 4: a signal is a checkpoint at every point of a job, the cache write included ------------------------------
def test_a_sigterm_during_the_erased_data_cache_write_stops_the_job(tmp_path: Path, monkeypatch) -> None:
    """torch.save into a Python file object turns the SIGTERM handler's Preempted, raised while torch writes, into
    RuntimeError("unexpected pos ..."): the cache took it for a failed write and the job ran on to the end."""
    import os
    import signal

    import torch

    from training.cli.preemption import Preempted, stop_on_sigterm
    from training.data import cache as cache_mod

    class SignalledFile:  # a SIGTERM lands during torch.save's second write (during its first, torch passes it on)
        def __init__(self, f) -> None:
            self.f, self.writes = f, 0

        def write(self, b) -> int:
            self.writes += 1
            if self.writes == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            return self.f.write(b)

        def flush(self) -> None:
            self.f.flush()

    def save(x: torch.Tensor, tmp: str) -> None:
        with open(tmp, "wb") as f:
            torch.save(x, SignalledFile(f))

    monkeypatch.setattr(cache_mod, "_save_tensor", save)
    with pytest.raises(Preempted) as stop, stop_on_sigterm():
        cache_mod.cached_erase(tmp_path, {"k": 1}, lambda: (torch.zeros(1000, 4), {"r": 1}))
    assert stop.value.code == 143
    assert not list((tmp_path / "erased").glob("*/manifest.json"))  # no half entry left as if complete


# --- bugs: the packed launcher outside the checkout's root, and with hydra.job.chdir=true ---------------------------
QUICK = ["logger=none", "progress=false", "dataset=digits", "mdl=quick", "mdl.max_epochs=1", "mdl.min_steps=0",
         "mdl.patience_min_steps=0", "mdl.full_run=false", "arch.width=8", "optim.warmup_steps=0",
         "certificate=false", "seed=0,1", "hydra/launcher=packed"]


def _sweep(cwd: Path, env: dict, *overrides: str):
    import subprocess
    import sys

    return subprocess.run([sys.executable, "-m", "training.run", "-m", *QUICK, *overrides], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600)


def test_the_packed_launcher_is_found_outside_the_checkouts_root(tmp_path: Path) -> None:
    """A researcher's own folder: the package importable (as an editable install makes it: here its top-level
    packages on PYTHONPATH, without the checkout's root, so `hydra_plugins/` is no directory on sys.path)."""
    from tests.helpers import ENV, REPO

    farm = tmp_path / "site"
    farm.mkdir()
    for name in ("training", "erasure", "models", "atomicio", "scripts", "conf"):  # all but hydra_plugins
        (farm / name).symlink_to(REPO / name)
    import importlib.util

    if importlib.util.find_spec("hydra_plugins.erasure_mdl_packed") is None:
        pytest.skip("the package is not installed (pip install -e .): no launcher to find outside the checkout")
    proc = _sweep(tmp_path, {**ENV, "PYTHONPATH": str(farm)}, f"paths.out_dir={tmp_path / 'out'}")
    assert "Unknown plugin class" not in proc.stderr, proc.stderr[-2000:]
    assert proc.returncode == 0 and "2/2 jobs ran: 2 done" in proc.stdout + proc.stderr, proc.stderr[-2000:]


def test_packed_with_chdir_and_a_relative_out_dir_writes_where_the_command_started(tmp_path: Path) -> None:
    from tests.helpers import ENV

    for attempt in ("first", "rerun"):
        proc = _sweep(tmp_path, ENV, "paths.out_dir=rel", "hydra.job.chdir=true")
        assert proc.returncode == 0, proc.stderr[-3000:]
        ran = "2 done, 0 skipped" if attempt == "first" else "0 done, 2 skipped"
        assert f"2/2 jobs ran: {ran}, 0 failed" in proc.stdout + proc.stderr, (proc.stdout + proc.stderr)[-2000:]
    results = sorted(tmp_path.rglob("result.json"))
    assert len(results) == 2 and all(r.relative_to(tmp_path).parts.count("rel") == 1 for r in results), results
