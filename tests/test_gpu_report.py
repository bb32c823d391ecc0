"""`make gpu-report` (tools/gpu_report.py): its CPU toy mode runs every step, and its runner survives failures.

The toy mode is what the GPU machine runs at full size, so running it here means the path is known to work
before a GPU ever sees it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tools.gpu_report import DEFAULT_BUDGET, all_steps, main, select
from tools.gpu_report_run import (
    ARCHS,
    GPU,
    JSON_NAME,
    MD_NAME,
    TOY,
    Context,
    Report,
    Step,
    StepError,
    StepSkipped,
    now,
    run_at_once,
    run_steps,
    write_report,
)
from tools.gpu_report_steps import (
    GROUP_FAILED,
    GROUP_FORMED,
    MISSING_MODULE,
    SEEDS,
    cell_checks,
    memory_figures,
    pytest_progress,
    read_junit,
)

ROOT = Path(__file__).resolve().parents[1]


def test_toy_mode_runs_every_step(tmp_path: Path) -> None:
    out = tmp_path / "report"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled", "CUDA_VISIBLE_DEVICES": ""}
    env.pop("OUT", None)
    proc = subprocess.run([sys.executable, "tools/gpu_report.py", "--toy", "--device", "cpu", "--out", str(out)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    # strict JSON (json.dumps(allow_nan=False) wrote it): every figure finite
    report = json.loads((out / JSON_NAME).read_text(), parse_constant=lambda c: pytest.fail(f"{c} in the report"))
    steps = report["steps"]
    failed = {n: (s.get("error"), s.get("tail", "")[-1500:]) for n, s in steps.items() if s["status"] == "failed"}
    assert proc.returncode == 0 and not failed, f"{failed}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    assert report["finished"] and report["mode"] == "toy"
    assert list(steps) == [s.name for s in all_steps(TOY)]
    for name, s in steps.items():
        assert s["status"] in ("ok", "skipped"), name
        assert s["status"] == "ok" or s["reason"], name
    env_rec = report["env"]
    assert env_rec["device"]["type"] == "cpu" and env_rec["device"]["name"].startswith("CPU")
    assert env_rec["python"] and env_rec["torch"] and env_rec["git"]["commit"] and env_rec["git"]["tree_digest"]
    f = {n: s["figures"] for n, s in steps.items()}
    assert f["tests"]["passed"] > 0 and f["tests"]["failed"] == 0
    for arch in ARCHS:
        job = f[f"job_{arch}"]
        assert 0 < job["bits_per_sample"] < 2 * math.log2(10) and job["wall_s"] > 0 and job["steps_total"] > 0
        assert (out / job["result"]).is_file()
        assert f["throughput"][arch]["train_sps"] > 0 and f["throughput"][arch]["eval_sps"] > 0
        # every architecture trains as one stacked group, and the group's figure is measured
        assert f["throughput"][arch]["vectorises"] is True, f["throughput"][arch].get("why_not_vectorised")
        assert f["throughput"][arch]["group_model_sps"] > 0
        assert f["sweep_cost"][arch]["job_s_per_epoch"] > 0
    for name in ("leace", "qleace", "alf_qleace"):
        assert f["erasers_device"][name]["max_abs_diff"] == 0.0  # CPU vs CPU: the same computation
    assert f["bench_mdl"]["speedup"]["ours"] > 0
    assert {"ours_leace", "ce_leace"} <= set(f["bench_erasers_device"]["results"])
    assert f["sweep_cost"]["mlp"]["throughput_scaling"] == {"1": 1.0}
    cell = f["cell"]  # 5 seeds: 5 processes at once vs one job of the cell (the loop engine: bitwise ==)
    assert cell["lone_wall_s"] > 0 and cell["cell_wall_s"] > 0 and len(cell["lone_each_s"]) == SEEDS
    assert cell["ratio"] == pytest.approx(cell["lone_wall_s"] / cell["cell_wall_s"])
    assert cell["equal"] and cell["differences"] == [] and cell["flags"] == []
    assert cell["group_formed"] and not cell["group_failed"]
    assert len(cell["bits_per_sample"]) == SEEDS and cell["jobs_time_s"]["cell"]["total_s"] > 0
    assert len(cell["lone_memory_each_mb"]) == SEEDS  # CPU: max RSS per process; five of them outweigh the one
    assert cell["lone_memory_mb"] == pytest.approx(sum(cell["lone_memory_each_mb"]))
    assert cell["lone_memory_mb"] > cell["cell_memory_mb"] > 0
    assert len(list((out / "runs" / "cell_together").rglob("result.json"))) == SEEDS
    md = (out / MD_NAME).read_text()
    assert "| step | status |" in md and "job_swin" in md and "| cell | ok |" in md


def test_plain_script_takes_its_pieces_from_its_own_checkout(tmp_path: Path) -> None:
    """The GPU machine runs `python3 tools/gpu_report.py` with nothing installed, from anywhere: the script puts
    its checkout on the path, so its modules (tools/gpu_report_*.py) are this checkout's, not an installed copy."""
    code = ("import runpy, sys; runpy.run_path(sys.argv[1]); import tools.gpu_report_run as r, "
            "tools.gpu_report_steps as s; print(r.__file__); print(s.__file__)")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT / "tools" / "gpu_report.py")], cwd=tmp_path,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == [str(ROOT / "tools" / f"gpu_report_{m}.py") for m in ("run", "steps")]
    listed = subprocess.run([sys.executable, str(ROOT / "tools" / "gpu_report.py"), "--list", "--toy"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert listed.returncode == 0, listed.stderr[-2000:]
    assert [ln.split()[0] for ln in listed.stdout.splitlines() if ln.strip()] == [s.name for s in all_steps(TOY)]


def fake_ctx(tmp_path: Path) -> tuple[Context, Report]:
    args = argparse.Namespace(out=str(tmp_path / "out"), work=str(tmp_path / "work"), device="cpu")
    Path(args.out).mkdir()
    report = Report(started=now())
    return Context(args, TOY, report, dict(os.environ)), report


def test_runner_records_failures_and_goes_on(tmp_path: Path) -> None:
    ctx, report = fake_ctx(tmp_path)
    seen: dict[str, Any] = {}

    def raises(c: Context) -> str:
        c.figures["partial"] = 1.5  # kept although the step fails
        raise RuntimeError("boom\nsecond line")

    def slow(c: Context) -> str:
        c.run([sys.executable, "-c", "import time; print('working', flush=True); time.sleep(60)"], "slow")
        return "never"

    def fails(c: Context) -> str:
        c.run([sys.executable, "-c", "raise ValueError('bad value')"], "fails")
        return "never"

    def skipped(c: Context) -> str:
        raise StepSkipped("not here")

    def ok(c: Context) -> str:
        # the report on disk already holds the earlier steps (it is rewritten after every step)
        seen.setdefault(c.step, json.loads((c.out / JSON_NAME).read_text())["steps"])
        c.figures.update(x=float("nan"), y=2.0)
        return "fine"

    steps = [Step("raises", "g", raises, 30, ""), Step("slow", "g", slow, 2, ""),
             Step("fails", "g", fails, 30, ""), Step("skipped", "g", skipped, 30, ""),
             Step("ok", "h", ok, 30, ""), Step("late", "h", ok, 100, "")]
    t0 = time.monotonic()
    run_steps(steps, ctx, report, budget=60)
    assert time.monotonic() - t0 < 30
    s = json.loads((ctx.out / JSON_NAME).read_text())["steps"]
    assert s["raises"]["status"] == "failed" and s["raises"]["error"] == "RuntimeError: boom"
    assert s["raises"]["figures"] == {"partial": 1.5} and "Traceback" in s["raises"]["tail"]
    assert s["slow"]["status"] == "failed" and "timed out" in s["slow"]["error"] and "working" in s["slow"]["tail"]
    assert s["fails"]["status"] == "failed" and s["fails"]["error"] == "fails: ValueError: bad value"
    assert s["skipped"]["status"] == "skipped" and s["skipped"]["reason"] == "not here"
    assert s["ok"]["status"] == "ok" and s["ok"]["figures"] == {"x": None, "y": 2.0}
    # budget: 60 s in all, the last step wants 100 s → it gets what is left
    assert s["late"]["status"] == "ok" and s["late"]["timeout_s"] <= 60
    # while "ok" ran, the file showed the finished steps and "ok" itself as not (yet) finished
    during = seen["ok"]
    assert during["raises"]["status"] == "failed" and during["skipped"]["status"] == "skipped"
    assert during["ok"]["status"] == "failed" and "did not finish" in during["ok"]["error"]
    assert during["late"]["status"] == "skipped" and "not reached" in during["late"]["reason"]
    md = (ctx.out / MD_NAME).read_text()
    assert "## Failures" in md and "RuntimeError: boom" in md


def test_select_junit_and_pytest_progress(tmp_path: Path) -> None:
    steps = all_steps(TOY)
    assert [s.name for s in select(steps, "jobs,tests", None)] == ["tests", "job_mlp", "job_lenet",
                                                                      "job_convnext", "job_swin"]
    assert "tests" not in [s.name for s in select(steps, None, "tests,speed")]
    with pytest.raises(SystemExit, match="unknown step"):
        select(steps, "nope", None)
    xml = tmp_path / "j.xml"
    xml.write_text("""<testsuites><testsuite>
      <testcase classname="tests.test_models" name="test_cuda[mlp]"><skipped message="needs CUDA"/></testcase>
      <testcase classname="tests.test_models" name="test_cpu"/>
      <testcase classname="tests.test_flat" name="test_numba">
        <failure message="ModuleNotFoundError: No module named 'numba'"/></testcase>
      <testcase classname="tests.test_a.TestC" name="test_x"><error message="boom"/></testcase>
    </testsuite></testsuites>""")
    counts, failures, gpu_skipped = read_junit(xml, {"tests/test_models.py::test_cuda[mlp]"})  # pytest's node ids
    assert counts == {"passed": 1, "failed": 1, "errors": 1, "skipped": 1}
    assert gpu_skipped == [("tests/test_models.py::test_cuda[mlp]", "needs CUDA")]
    assert failures[1] == "tests/test_a.py::TestC::test_x: boom"
    missing = MISSING_MODULE.search(failures[0])
    assert missing is not None and missing.group(1) == "numba"
    text = ("tests/test_a.py::test_x PASSED                  [ 50%]\n"
            "[gw1] [ 75%] FAILED tests/test_b.py::test_y[1] \n"
            "[gw0] [100%] SKIPPED tests/test_c.py::test_z \n"
            "FAILED tests/test_b.py::test_y[1] - AssertionError\n")
    assert pytest_progress(text) == [("PASSED", "tests/test_a.py::test_x"), ("FAILED", "tests/test_b.py::test_y[1]"),
                                     ("SKIPPED", "tests/test_c.py::test_z")]


def test_merge_keeps_each_steps_last_run(tmp_path: Path) -> None:
    def rep(steps: dict[str, Any]) -> dict[str, Any]:
        return {"started": now(), "mode": "gpu", "env": {"device": {"name": "X"}}, "steps": steps,
                "finished": True, "total_s": 10}

    a, b = tmp_path / "a", tmp_path / "b"
    for d, steps in ((a, {"tests": {"status": "ok", "figures": {"passed": 3}},
                          "job_mlp": {"status": "skipped", "reason": "no time left in --budget (3 s)"}}),
                     (b, {"tests": {"status": "skipped", "reason": "not reached: the report ended before this step"},
                          "job_mlp": {"status": "failed", "error": "x"}})):
        d.mkdir()
        write_report(Report.from_json(rep(steps)), d)
    assert main(["--merge", str(a / JSON_NAME), str(b / JSON_NAME), "--out", str(tmp_path / "m")]) == 0
    m = json.loads((tmp_path / "m" / JSON_NAME).read_text())
    assert m["steps"]["tests"]["status"] == "ok" and m["steps"]["job_mlp"]["status"] == "failed"
    assert m["counts"] == {"ok": 1, "failed": 1, "skipped": 0} and len(m["merged_from"]) == 2 and m["total_s"] == 20


def test_report_json_is_read_into_types_and_written_back_with_unknown_keys_kept() -> None:
    raw = {"started": "t0", "mode": "gpu", "finished": True, "total_s": 5.0, "future_key": 1,
           "env": {"python": "3.13", "device": {"name": "NVIDIA H100", "total_memory_gb": 79.6, "sm": "9.0"},
                   "git": {"commit": "abc", "tree_digest": "d"}},
           "steps": {"a": {"status": "ok", "figures": {"x": 1}, "new_field": "kept"},
                     "b": {"status": "skipped", "reason": "no time left in --budget (3 s)"},
                     "c": {"status": "skipped", "reason": "needs CUDA"}}}
    rep = Report.from_json(raw)
    assert rep.env["device"] == {"name": "NVIDIA H100", "total_memory_gb": 79.6, "sm": "9.0"}
    assert rep.ok_figures("a") == {"x": 1} and rep.ok_figures("b") is None and rep.ok_figures("nope") is None
    assert [rep.steps[n].ran for n in "abc"] == [True, False, True]  # a budget skip never ran; "needs CUDA" did
    out = rep.to_json()
    assert out["steps"]["a"]["new_field"] == "kept" and out["env"]["device"]["sm"] == "9.0"
    assert out["counts"] == {"ok": 1, "failed": 0, "skipped": 2} and "future_key" not in out  # top level: declared
    assert Report.from_json(out).to_json() == out


def cell_log(formed: bool, failed: bool = False) -> str:
    lines = ["[2026][training.tasks.mdl.job][INFO] - job seed0: synthetic"]
    if formed:
        lines.append(f"[2026][training.tasks.mdl.cell][INFO] - {GROUP_FORMED} 10 models in one lockstep group of 10 "
                     "rows")
    if failed:
        lines.append(f"[2026][training.tasks.mdl.cell][WARNING] - {GROUP_FAILED} (RuntimeError: x); each seed's "
                     "unfinished models train in the seed's own group")
    return "\n".join(lines)


def test_cell_checks_flag_differing_numbers_a_missing_group_and_a_deviation_beyond_the_contract() -> None:
    def jobs(bits: float, seconds: float) -> dict[str, dict[str, Any]]:
        return {f"c/seed{s}": {"mdl.bits_per_sample": bits + s, "timings.total_s": seconds, "seed": s}
                for s in range(SEEDS)}

    lone, cell = jobs(2.5, 10.0), jobs(2.5, 3.0)  # wall times differ: not a difference
    ok = cell_checks(lone, cell, cell_log(True))
    assert ok["equal"] and ok["group_formed"] and ok["flags"] == []
    assert ok["group_line"].startswith(GROUP_FORMED)
    cell["c/seed3"]["mdl.bits_per_sample"] += 1e-12
    bad = cell_checks(lone, cell, cell_log(True))
    assert not bad["equal"] and len(bad["flags"]) == 1 and "numbers differ" in bad["flags"][0]
    assert bad["differences"] == ["c/seed3: mdl.bits_per_sample 5.5 != 5.500000000001"]
    missing = cell_checks(lone, jobs(2.5, 3.0), cell_log(False))
    assert missing["equal"] and not missing["group_formed"] and missing["group_line"] is None
    assert len(missing["flags"]) == 1 and "did not form" in missing["flags"][0]
    broke = cell_checks(lone, jobs(2.5, 3.0), cell_log(True, failed=True))
    assert broke["group_formed"] and broke["group_failed"]
    assert len(broke["flags"]) == 1 and broke["flags"][0].startswith("the cell's group failed")
    # On an H100 the lone and grouped jobs differed by ~1e-6 relative. On a GPU that is within the contract
    # (max(1e-3, 0.05 × seed SD)); beyond it, or any difference on the CPU loop engine, is flagged.

    def shifted(shift: float = 0.0) -> dict[str, dict[str, Any]]:
        return {f"c/seed{s}": {"mdl.bits_per_sample": 2.0 + 0.1 * s + (shift if s == 2 else 0.0)}
                for s in range(SEEDS)}

    log = cell_log(True)
    sd = statistics.stdev([2.0 + 0.1 * s for s in range(SEEDS)])  # 0.158: tolerance 0.0079
    near = cell_checks(shifted(), shifted(3e-6), log, bitwise=False)
    assert not near["equal"] and near["within_tolerance"] and near["flags"] == []
    assert near["max_abs_bits_deviation"] == pytest.approx(3e-6) and near["seed_sd_bits"] == pytest.approx(sd)
    assert near["tolerance_bits"] == pytest.approx(0.05 * sd)
    assert near["deviation_over_seed_sd"] == pytest.approx(3e-6 / sd)
    far = cell_checks(shifted(), shifted(0.01), log, bitwise=False)
    assert not far["within_tolerance"] and "> tolerance" in far["flags"][0]
    cpu = cell_checks(shifted(), shifted(3e-6), log, bitwise=True)
    assert not cpu["within_tolerance"] and "bitwise" in cpu["flags"][0]
    tight = {f"c/seed{s}": {"mdl.bits_per_sample": 2.0} for s in range(SEEDS)}  # seed SD 0: the 1e-3 floor
    assert cell_checks(tight, {**tight, "c/seed1": {"mdl.bits_per_sample": 2.0009}}, log, bitwise=False)[
        "within_tolerance"]
    assert not cell_checks(tight, {**tight, "c/seed1": {"mdl.bits_per_sample": 2.0011}}, log, bitwise=False)[
        "within_tolerance"]


def test_the_gpu_default_fits_one_device_call_with_the_jobs_first() -> None:
    names = [s.name for s in all_steps(GPU)]
    assert names[:7] == ["tests", *[f"job_{a}" for a in ARCHS], "throughput", "cell"]
    assert DEFAULT_BUDGET <= 600 - 45  # a 10-minute call: the wheels' install and start-up take the rest
    assert all(s.timeout < DEFAULT_BUDGET for s in all_steps(GPU))


def test_run_at_once_runs_together_and_fails_on_an_error_or_the_budget(tmp_path: Path) -> None:
    ctx, _ = fake_ctx(tmp_path)
    ctx.deadline = time.monotonic() + 60
    sleep = [sys.executable, "-c", "import time; time.sleep(2)"]
    each = [p.seconds for p in run_at_once(ctx, [(sleep, "a"), (sleep, "b"), (sleep, "c")], dict(os.environ))]
    assert len(each) == 3 and 2 <= min(each) and max(each) < 5.5  # at once: one after another takes 6 s
    assert (ctx.logs / "b.log").read_text().startswith("$ ")
    with pytest.raises(StepError, match=r"^bad: ValueError: nope"):
        run_at_once(ctx, [(sleep, "fine"), ([sys.executable, "-c", "raise ValueError('nope')"], "bad")],
                    dict(os.environ))
    ctx.deadline = time.monotonic() + 1
    t0 = time.monotonic()
    with pytest.raises(StepError, match="timed out"):
        run_at_once(ctx, [([sys.executable, "-c", "import time; time.sleep(60)"], "slow")], dict(os.environ))
    assert time.monotonic() - t0 < 20


def test_cell_memory_sums_the_lone_peaks_and_adds_one_context_per_process_on_cuda() -> None:
    cuda = [dict(peak_allocated_mb=90.0, peak_reserved_mb=100.0 + i, context_mb=5000.0) for i in range(5)]
    cell = dict(peak_allocated_mb=300.0, peak_reserved_mb=400.0, context_mb=500.0)
    m = memory_figures(cuda, cell)  # a lone process's own context_mb (5000) read the others' memory: not used
    assert m == {"lone_memory_mb": 510.0, "lone_memory_each_mb": [100.0, 101.0, 102.0, 103.0, 104.0],
                 "cell_memory_mb": 400.0, "context_mb": 500.0, "cell_memory_with_contexts_mb": 900.0,
                 "lone_memory_with_contexts_mb": 510.0 + 5 * 500.0}
    cpu = memory_figures([dict(peak_rss_mb=600.0)] * 5, dict(peak_rss_mb=700.0))
    assert cpu == {"lone_memory_mb": 3000.0, "lone_memory_each_mb": [600.0] * 5, "cell_memory_mb": 700.0}
    assert memory_figures([*cuda[:4], None], None) == {}  # a process that wrote no memory file: no sum


BOOTSTRAPPED = ("hydra-core", "omegaconf", "antlr4-python3-runtime", "mup", "schedulefree", "filelock", "mlxtend")


def _wheel_from_installed(dist_name: str, into: Path) -> set[str]:
    """A wheel of an installed pure-Python distribution, zipped from its installed files; returns its top-level
    names (what a Python without it must not see)."""
    import importlib.metadata
    import zipfile

    dist = importlib.metadata.distribution(dist_name)
    name = dist.metadata["Name"].replace("-", "_")
    files = [f for f in dist.files or [] if not str(f).startswith("..") and "__pycache__" not in str(f)]
    with zipfile.ZipFile(into / f"{name}-{dist.version}-py3-none-any.whl", "w") as z:
        for f in files:
            z.write(Path(str(dist.locate_file(f))), str(f))
    return {str(f).split("/")[0] for f in files}


def test_bootstraps_on_a_python_without_the_harness(tmp_path: Path) -> None:
    """On a bare GPU machine `python3 tools/gpu_report.py` once died importing omegaconf before it installed
    `.whl/`. Here under `python -S` with a site of the venv's packages less hydra/omegaconf/mup/schedulefree/
    filelock/mlxtend (and no editable install of this project), with those as wheels built from the venv: it
    installs them and gets as far as listing its steps, which imports every step module and so training/."""
    import site

    wheels, bare, target = tmp_path / "whl", tmp_path / "bare", tmp_path / "site"
    wheels.mkdir()
    bare.mkdir()
    hidden = {"hydra_plugins", "erasure_mdl-0.1.0.dist-info"}
    for dist in BOOTSTRAPPED:
        hidden |= _wheel_from_installed(dist, wheels)
    packages = Path(next(p for p in site.getsitepackages() if Path(p, "torch").is_dir()))
    for entry in packages.iterdir():
        if entry.name not in hidden and entry.suffix != ".pth" and not entry.name.startswith("__editable__"):
            (bare / entry.name).symlink_to(entry)
    env = {**{k: v for k, v in os.environ.items() if k != "OUT"}, "PYTHONPATH": str(bare),
           "GPU_REPORT_WHEELS": str(wheels), "GPU_REPORT_SITE": str(target), "OMP_NUM_THREADS": "1"}
    for module in ("hydra", "omegaconf", "mup", "schedulefree"):
        probe = subprocess.run([sys.executable, "-S", "-c", f"import {module}"], cwd=tmp_path, env=env,
                               capture_output=True, text=True, timeout=120)
        assert probe.returncode != 0 and "No module named" in probe.stderr, module  # really absent
    proc = subprocess.run([sys.executable, "-S", str(ROOT / "tools" / "gpu_report.py"), "--list", "--toy"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert [ln.split()[0] for ln in proc.stdout.splitlines() if ln.strip()] == [s.name for s in all_steps(TOY)]
    assert {"hydra", "omegaconf", "mup", "schedulefree"} <= {p.name for p in target.iterdir()}
