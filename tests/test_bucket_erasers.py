"""A bucket worker (`hydra.launcher.pack_by=shape`) fits or loads each eraser once: the jobs of its cells that need
the same fitted eraser (the same data, fit rows, eraser and options: seeds with `fit_on=all`, other optim settings)
get it from the bucket's `Pack`, and their numbers are those of lone jobs."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

import erasure
from tests.helpers import sweep_results
from training.data import shared
from training.data.cache import cached_eraser

REPO = Path(__file__).resolve().parents[1]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "WANDB_MODE": "disabled"}
# 2 erasers x 2 optim settings x 2 seeds, each training batch erased (after_augment): every fit is on all rows, so the
# 4 jobs of an eraser need one fitted eraser; `random` is rank-matched to ALF-QLEACE, whose erased data it needs too
SWEEP = ["experiment=smoke", "logger=none", "progress=false", "eraser=leace,random", "optim.warmup_steps=10,20",
         "seed=0,1", "eraser.after_augment=true"]
VOLATILE = ("seconds", "timings.", "provenance.", "config.training.pack_size", "eraser.cache_hit")


def _sweep(out_dir: Path, *overrides: str) -> str:
    proc = subprocess.run([sys.executable, "-m", "training.run", "-m", *SWEEP, f"paths.out_dir={out_dir}",
                           *overrides], cwd=REPO, env=ENV, capture_output=True, text=True, timeout=600)
    text = proc.stdout + proc.stderr
    assert proc.returncode == 0, text[-3000:]
    return text


def _results(out_dir: Path) -> dict[str, dict[str, Any]]:
    return sweep_results(out_dir, VOLATILE)


def _count(text: str, pattern: str) -> int:
    return len(re.findall(pattern, text))


def test_a_bucket_fits_or_loads_each_eraser_once_and_its_jobs_equal_lone_jobs(tmp_path: Path) -> None:
    text = _sweep(tmp_path / "bucket", "hydra/launcher=packed", "hydra.launcher.pack_by=shape")
    assert "8 jobs in 1 packs" in text and "multirun: 8/8 jobs ran: 8 done, 0 skipped, 0 failed" in text
    # one fit per key: leace, random and ALF-QLEACE (random's rank source)
    assert _count(text, r"fitting eraser (\w+) on") == 3
    assert sorted(re.findall(r"fitting eraser (\w+) on", text)) == ["alf_qleace", "leace", "random"]
    # nothing read back from the disk cache: the 3 later jobs of each eraser take it from the bucket (before: each
    # of them loaded the fitted eraser from its file, 6 loads)
    assert _count(text, r"cache hit: \S*/erasers/") == 0 and _count(text, r"cache hit: \S*/erased/") == 0
    assert _count(text, r"cache hit \(shared in this process\): \S*/erasers/") == 6
    lone = tmp_path / "lone"
    alone = _sweep(lone, "hydra/launcher=parallel")
    assert _count(alone, r"cache hit \(shared in this process\)") == 0  # each job alone: no bucket
    assert _results(tmp_path / "bucket") == _results(lone)


def test_shared_fitted_eraser_is_loaded_once_and_never_seen_modified(tmp_path: Path, monkeypatch: Any) -> None:
    built: list[int] = []
    loads: list[Path] = []  # files read (a missing file is not a load)
    real_load = erasure.load

    def load(path: Path) -> erasure.Eraser:
        eraser = real_load(path)
        loads.append(path)
        return eraser

    monkeypatch.setattr(erasure, "load", load)
    x, y = torch.randn(200, 5, dtype=torch.float64), torch.arange(200) % 3

    def build() -> erasure.Eraser:
        built.append(1)
        return erasure.fit("leace", x, y)

    key = {"dataset": "x", "eraser": "leace"}
    with shared.packed() as pack:
        e0, hit0 = cached_eraser(tmp_path, key, build, pack.erasers)
        e1, hit1 = cached_eraser(tmp_path, key, build, pack.erasers)
        e2, hit2 = cached_eraser(tmp_path, key, build, pack.erasers)
        assert (len(built), len(loads), hit0, hit1, hit2) == (1, 0, False, True, True)  # fitted once, never loaded
        assert e1 is not e2 and e1.info is not e2.info  # each job its own object and dicts ...
        assert all(e1.state[k] is e2.state[k] for k in e1.state)  # ... on the same tensors
        other, _ = cached_eraser(tmp_path, {**key, "options": {"x": 1}}, build, pack.erasers)  # another key: a fit
        assert len(built) == 2 and other is not e1
    lone, hit_lone = cached_eraser(tmp_path, key, build)  # a lone job: from the file
    assert hit_lone and len(loads) == 1 and type(lone) is type(e1) and lone.info == e1.info
    assert all(torch.equal(lone.state[k], e1.state[k]) for k in lone.state)
    assert torch.equal(lone(x, y), e1(x, y))
    with shared.packed() as pack:
        e3, _ = cached_eraser(tmp_path, key, build, pack.erasers)  # loaded from the file once for the pack
        next(iter(e3.state.values())).add_(1)  # a job that edits the shared state in place ...
        e4, hit4 = cached_eraser(tmp_path, key, build, pack.erasers)  # ... the next job loads the file again
        (tmp_path / "erasers" / next(p.name for p in (tmp_path / "erasers").glob("*.pt"))).unlink()
        e5, hit5 = cached_eraser(tmp_path, key, build, pack.erasers)  # the file is gone: as alone, fitted again
    assert (len(loads), hit4, hit5, len(built)) == (3, True, False, 3)
    assert all(torch.equal(e4.state[k], lone.state[k]) for k in lone.state)
    assert torch.equal(e5(x, y), lone(x, y))
