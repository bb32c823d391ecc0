"""tools/gpu_report.py's `tests` step: the test suite under pytest, read back from its junit xml (and from its
verbose lines when it runs out of time)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from pathlib import Path

from tools.gpu_report_env import OPTIONAL
from tools.gpu_report_runner import Context, StepError, error_line, tail


def step_tests(ctx: Context) -> str:
    """The test suite (GPU: all but slurm, gpu-marked included, any gpu test that skips counts as failed)."""
    if importlib.util.find_spec("pytest") is None:
        raise StepError("pytest is not importable: add its wheels to .whl/ (make gpu-wheels)")
    xml = ctx.logs / "pytest.xml"
    args = ["-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", f"--junitxml={xml}", *ctx.sizes.pytest_args]
    if ctx.gpu and importlib.util.find_spec("xdist") is not None:
        args += ["-n", str(min(8, max(1, len(os.sched_getaffinity(0)) // 2))), "--dist", "loadgroup"]
    gpu_ids: set[tuple[str, str]] = set()
    if ctx.gpu:
        coll = ctx.python(["-m", "pytest", "-q", "--collect-only", "-m", "gpu", "-p", "no:cacheprovider"],
                          "pytest-collect-gpu", check=False)
        gpu_ids = {junit_id(ln.strip()) for ln in coll.output.splitlines() if "::" in ln}
        ctx.figures["gpu_tests"] = len(gpu_ids)
    if ctx.gpu and ctx.args.pytest_m:
        args += ["-m", ctx.args.pytest_m]
    env = {**ctx.env, "OMP_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
    try:
        proc = ctx.python(args, "pytest", env=env, check=False)
    except StepError:  # out of time: the verbose lines say how far it got
        outcomes = pytest_progress((ctx.logs / "pytest.log").read_text(errors="replace"))
        ctx.figures["partial"] = {w.lower(): sum(o == w for o, _ in outcomes) for w in OUTCOMES}
        ctx.figures["partial_failures"] = [t for o, t in outcomes if o in ("FAILED", "ERROR")][:40]
        raise
    if not xml.exists():
        raise StepError(f"pytest: {error_line(proc.output, proc.rc)} (no junit xml)", tail(proc.output))
    counts, failures, gpu_skipped = read_junit(xml, gpu_ids)
    # a test that fails only because an optional package is not installed here (numba, wandb without its wheel)
    # is reported apart: it says what to carry, not that the code is wrong
    missing = [f for f in failures if (m := MISSING_MODULE.search(f)) and m.group(1).split(".")[0] in OPTIONAL]
    real = [f for f in failures if f not in missing]
    ctx.figures.update(counts)
    ctx.figures["gpu_skipped"] = len(gpu_skipped)
    ctx.figures["failed_missing_module"] = len(missing)
    ctx.figures["failures"] = real[:40] + [f"{n} (gpu test skipped on CUDA: {why})" for n, why in gpu_skipped]
    ctx.figures["missing_module_failures"] = missing[:20]
    ctx.figures["pytest_rc"] = proc.rc
    summary = (f"{counts['passed']} passed, {counts['failed']} failed, {counts['errors']} errors, "
               f"{counts['skipped']} skipped" + (f" ({len(gpu_skipped)} gpu tests skipped)" if ctx.gpu else "")
               + (f"; {len(missing)} failed only for a package not installed here" if missing else ""))
    if real or gpu_skipped or (proc.rc not in (0, 5) and not missing):
        raise StepError(summary + (f"; first: {ctx.figures['failures'][0]}" if ctx.figures["failures"] else ""),
                        tail(proc.output))
    return summary


MISSING_MODULE = re.compile(r"No module named '([\w.]+)'")
OUTCOMES = ("PASSED", "FAILED", "SKIPPED", "ERROR")


def pytest_progress(text: str) -> list[tuple[str, str]]:
    """(outcome, test id) of each `pytest -v` result line: "tests/t.py::x PASSED [ 5%]" or, with xdist,
    "[gw0] [ 5%] PASSED tests/t.py::x"."""
    found = []
    for line in text.splitlines():
        test = re.search(r"(tests/\S+::\S+)", line)
        outcome = re.search(r"\b(PASSED|FAILED|SKIPPED|ERROR)\b", line)
        if test and outcome and not line.startswith(("FAILED ", "ERROR ", "SKIPPED ")):  # not the -r summary
            found.append((outcome.group(1), test.group(1)))
    return found


def junit_id(nodeid: str) -> tuple[str, str]:
    """pytest node id → (classname, name) as junit xml writes them: tests/test_a.py::C::t[x] → tests.test_a.C, t[x]."""
    parts = nodeid.split("::")
    module = parts[0].removesuffix(".py").replace("/", ".")
    return ".".join([module, *parts[1:-1]]), parts[-1]


def read_junit(path: Path, gpu_ids: set[tuple[str, str]]) -> tuple[dict[str, int], list[str], list[tuple[str, str]]]:
    import xml.etree.ElementTree as ET

    counts = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0}
    failures: list[str] = []
    gpu_skipped: list[tuple[str, str]] = []
    for case in ET.parse(path).getroot().iter("testcase"):
        key = (case.get("classname", ""), case.get("name", ""))
        name = f"{key[0]}::{key[1]}"
        kinds = {child.tag: child for child in case if child.tag in ("failure", "error", "skipped")}
        if "failure" in kinds or "error" in kinds:
            tag = "failure" if "failure" in kinds else "error"
            counts["failed" if tag == "failure" else "errors"] += 1
            msg = (kinds[tag].get("message") or "").strip().splitlines()
            failures.append(f"{name}: {msg[0][:200] if msg else tag}")
        elif "skipped" in kinds:
            counts["skipped"] += 1
            if key in gpu_ids:
                gpu_skipped.append((name, (kinds["skipped"].get("message") or "").strip()[:200]))
        else:
            counts["passed"] += 1
    return counts, failures, gpu_skipped
