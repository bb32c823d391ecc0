"""Shared test setup: single-threaded torch, wandb disabled, GPU/SLURM tests skipped when unavailable, the tests
tests/heavy_tests.txt lists marked `heavy` (measured at 8 s or more: `make test-heavy`, not `make test`).

SLURM tests (marked `slurm`) run against a one-machine cluster that the `slurm_cluster` fixture starts once per
session (per xdist worker: `make test-slurm` runs them in two xdist groups, two clusters) with tools/slurm_cluster.py
(root + Debian packages; `.ci/run` installs them) and stops at the end.
Where it cannot run they skip with the script's one-line reason; a cluster that can run but fails to start fails.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ["WANDB_MODE"] = "disabled"

import torch  # noqa: E402

import training  # noqa: E402,F401  (registers the OmegaConf resolvers conf/ uses)

torch.set_num_threads(1)

SLURM_SCRIPT = Path(__file__).resolve().parents[1] / "tools" / "slurm_cluster.py"
HEAVY_LIST = Path(__file__).resolve().parent / "heavy_tests.txt"  # measured (tools/heavy_tests.py)
MAX_ARRAY_SIZE = 3  # the test clusters' MaxArraySize: a sweep of more jobs is cut into arrays (tests/test_slurm.py)


def heavy_tests() -> set[str]:
    """The node ids tests/heavy_tests.txt lists: marked `heavy` (`make test-heavy` and CI, not `make test`)."""
    lines = HEAVY_LIST.read_text().splitlines() if HEAVY_LIST.exists() else []
    return {line.strip() for line in lines if line.strip() and not line.startswith("#")}


@functools.cache
def slurm_unavailable() -> str | None:
    """Why no SLURM cluster can be started here (one line), or None."""
    proc = subprocess.run([sys.executable, str(SLURM_SCRIPT), "check"], capture_output=True, text=True, timeout=60)
    if proc.returncode == 0:
        return None
    return (proc.stdout.strip() or proc.stderr.strip() or "tools/slurm_cluster.py check failed").splitlines()[0]


# tryfirst: xdist's own hook reads the xdist_group markers (into the node ids it schedules by) and must see these
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    no_gpu = pytest.mark.skip(reason="needs CUDA")
    heavy = heavy_tests()
    for item in items:
        if item.nodeid in heavy:
            item.add_marker(pytest.mark.heavy)
        # markers, not item.keywords: keywords also hold the names of parent directories (a checkout in .../gpu/)
        if item.get_closest_marker("gpu") is not None and not torch.cuda.is_available():
            item.add_marker(no_gpu)
        if item.get_closest_marker("slurm") is not None:
            if item.get_closest_marker("xdist_group") is None:  # tests/test_slurm.py puts some in a second group
                item.add_marker(pytest.mark.xdist_group("slurm"))  # with `-n`: one worker, one cluster per group
            if (reason := slurm_unavailable()) is not None:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A running one-node cluster for this session; SLURM_CONF points at it. Yields its slurm.conf."""
    root = tmp_path_factory.mktemp("slurm")
    proc = subprocess.run([sys.executable, str(SLURM_SCRIPT), "up", "--dir", str(root), "--max-array-size",
                           str(MAX_ARRAY_SIZE)], capture_output=True, text=True, timeout=300)
    if proc.returncode == 2:
        pytest.skip(proc.stderr.strip().splitlines()[-1])
    if proc.returncode != 0:
        pytest.fail(f"SLURM cluster did not start: {(proc.stderr.strip().splitlines() or ['?'])[-1]}", pytrace=False)
    conf = root / "etc" / "slurm.conf"
    previous = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(conf)
    try:
        yield conf
    finally:
        if previous is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = previous
        subprocess.run([sys.executable, str(SLURM_SCRIPT), "down", "--dir", str(root), "--keep-logs"],
                       capture_output=True, text=True, timeout=300)
