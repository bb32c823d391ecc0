"""The aggregate marks a cell whose seeds ran under different numerics signatures (result.json
`provenance.numerics`, training/engine/numerics.py), as it marks seeds from different commits; equal signatures,
and results written before the signature existed, are not marked."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.test_aggregate_faults import COMMIT_A, _cfg, _run, _write

CPU = {"device_name": "Xeon", "torch": "2.14.1", "cuda": None, "cudnn": None, "precision": "fp32",
       "engine": "loop", "models_together": 10, "deterministic": False}
H100 = {**CPU, "device_name": "NVIDIA H100 80GB HBM3", "cuda": "13.0", "cudnn": 91900, "engine": "stacked"}


def _signed(root: Path, cfg: dict[str, Any], bits: float, sig: dict[str, Any] | None) -> Path:
    job = _write(root, cfg, bits, commit=COMMIT_A)
    if sig is not None:
        path = job / "result.json"
        stored = json.loads(path.read_text())
        stored["provenance"]["numerics"] = sig
        path.write_text(json.dumps(stored))
    return job


def test_a_cell_mixing_signatures_is_marked_and_one_with_equal_signatures_is_not(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for seed, sig in ((0, CPU), (1, CPU), (2, H100)):
        _signed(root, _cfg("control", seed), 1.0 + 0.1 * seed, sig)
    for seed in range(3):  # equal signatures, and one older result without any: not compared
        _signed(root, _cfg("leace", seed), 2.0, None if seed == 2 else CPU)
    rc, md = _run(root, tmp_path)
    assert rc == 0
    assert "| mnist5k | mlp_relu | 128 | 2 | 1.100 ± 0.100 § | 2.000 ± 0.000 |" in md
    (line,) = [ln for ln in md.splitlines() if ln.startswith("§ ")]
    assert line.startswith("§ seeds under different numerics signatures (GPU: equal within tolerance, not bitwise): "
                           "mnist5k mlp_relu w128 d2 control: ")
    assert "device_name=NVIDIA H100 80GB HBM3" in line and line.endswith("seed 2") and "seeds 0 1" in line


def test_no_mark_where_every_seed_has_one_signature(tmp_path: Path) -> None:
    root = tmp_path / "runs"
    for seed in range(3):
        _signed(root, _cfg("control", seed), 1.0 + 0.1 * seed, H100)
    rc, md = _run(root, tmp_path)
    assert rc == 0 and "§" not in md and "| 1.100 ± 0.100 |" in md


def test_cpu_seeds_alone_and_in_a_loop_group_are_one_signature_but_stacked_and_gpu_groups_are_not(
        tmp_path: Path) -> None:
    """The contract: on CPU the loop engine and fit() are bitwise alone or in a group of any size (a ConvNeXt job
    trained one model at a time before its models grouped on the loop engine). The stacked engine on CPU, and any
    group size on a GPU, still mark the cell."""
    alone = {**CPU, "engine": "fit", "models_together": 1}
    stacked = {**CPU, "engine": "stacked"}
    gpu_alone = {**H100, "engine": "fit", "models_together": 1}
    gpu_loop = {**H100, "engine": "loop", "models_together": 10}
    cells = {"control": (alone, CPU, {**CPU, "engine": "fit+loop"}), "leace": (alone, CPU, stacked),
             "qleace": (gpu_alone, gpu_loop, gpu_loop)}
    root = tmp_path / "runs"
    for eraser, sigs in cells.items():
        for seed, sig in enumerate(sigs):
            _signed(root, _cfg(eraser, seed), 1.0 + 0.1 * seed, sig)
    rc, md = _run(root, tmp_path)
    assert rc == 0
    marked = [ln for ln in md.splitlines() if ln.startswith("§ ")]
    assert [ln.split(" d2 ")[1].split(":")[0] for ln in marked] == ["leace", "qleace"], md
