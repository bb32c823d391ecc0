"""`training.precision` and `training.deterministic` (training/engine/numerics.py): the hash, the flags, the
autocast, and the numerics signature every result.json records."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from tests.helpers import job_config, result_of
from training.app.tasks import get_task, job_cell_hash, job_hash, job_semantic
from training.engine import numerics
from training.tasks.mdl.job import run_job

SMOKE = ["experiment=smoke", "mdl.max_epochs=3", "mdl.full_run=false", "certificate=false"]
QUICK = ["dataset=digits", "mdl=quick", "mdl.max_epochs=2", "mdl.min_steps=0", "mdl.patience_min_steps=0",
         "optim.warmup_steps=10", "certificate=false"]


def test_precision_is_hashed_only_away_from_its_default_in_every_task(tmp_path: Path) -> None:
    base = job_config(tmp_path, SMOKE)
    assert "training" not in job_semantic(base)  # at fp32 the hash is what it was before the key existed
    older = {**base, "training": {k: v for k, v in base["training"].items() if k not in ("precision", "deterministic")}}
    assert job_hash(older) == job_hash(base) and job_cell_hash(older) == job_cell_hash(base)
    hashes = {job_hash(job_config(tmp_path, [*SMOKE, "device=cuda", f"training.precision={p}"]))
              for p in ("tf32", "bf16")}
    assert len(hashes) == 2 and job_hash(base) not in hashes
    assert job_cell_hash(job_config(tmp_path, [*SMOKE, "training.precision=bf16"])) != job_cell_hash(base)
    for same in (["training.precision=fp32"], ["training.deterministic=true"], ["training.engine=loop"],
                 ["device=cuda", "training.precision=fp32"]):  # so tf32 on CUDA is a job of its own
        assert job_hash(job_config(tmp_path, [*SMOKE, *same])) == job_hash(base), same
    # A Gradient Starvation task hashes its own groups only; a bf16 run of it still gets a directory of its own
    # (else it would SKIP on the fp32 result), and its fp32 hash is the one it had before precision existed.
    for preset in ("gs_two_moons", "gs_colored_mnist"):
        fp32 = job_config(tmp_path, [f"experiment={preset}"])
        bf16 = job_config(tmp_path, [f"experiment={preset}", "training.precision=bf16"])
        assert "training" not in job_semantic(fp32) and job_semantic(bf16)["training"] == {"precision": "bf16"}
        assert job_hash(bf16) != job_hash(fp32) and job_cell_hash(bf16) != job_cell_hash(fp32), preset


def test_job_numerics_sets_the_flags_for_the_job_and_restores_them() -> None:
    mm, det = torch.backends.cuda.matmul.fp32_precision, torch.are_deterministic_algorithms_enabled()
    cublas = os.environ.get("CUBLAS_WORKSPACE_CONFIG")
    conv = torch.backends.cudnn.conv  # type: ignore[attr-defined]  # torch >= 2.9's fp32_precision API, untyped
    with numerics.job_numerics("tf32", True):
        assert torch.backends.cuda.matmul.fp32_precision == "tf32" == conv.fp32_precision
        assert torch.are_deterministic_algorithms_enabled()
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == numerics.CUBLAS_WORKSPACE
    with numerics.job_numerics("fp32", False):
        assert torch.backends.cuda.matmul.fp32_precision == "ieee" == conv.fp32_precision
        assert not torch.are_deterministic_algorithms_enabled()
    assert (torch.backends.cuda.matmul.fp32_precision, torch.are_deterministic_algorithms_enabled()) == (mm, det)
    assert os.environ.get("CUBLAS_WORKSPACE_CONFIG") == cublas
    with pytest.raises(ValueError, match="training.precision='fp16'"):
        with numerics.job_numerics("fp16", False):
            pass


def test_bf16_autocasts_the_training_forward_only() -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(64, 10)
    x = torch.randn(8, 64)
    with numerics.job_numerics("fp32", False) as job:
        exact = job.forward(model, x)
    with numerics.job_numerics("bf16", False) as job:
        low = job.forward(model, x)
        plain = model(x)  # outside the training forward (validation, code lengths): float32
    assert exact.dtype == low.dtype == torch.float32 and model.weight.dtype == torch.float32
    assert torch.equal(exact, model(x)) and torch.equal(plain, exact)
    assert not torch.equal(low, exact) and torch.allclose(low, exact, atol=0.05)  # bf16 rounding, not garbage


def test_contract_tolerance() -> None:
    assert numerics.bits_tolerance(None) == numerics.bits_tolerance(0.0) == 1e-3
    assert numerics.bits_tolerance(0.1) == pytest.approx(0.005)
    assert numerics.within_contract(3.0, 3.0009, 0.0) and not numerics.within_contract(3.0, 3.0011, 0.0)
    assert numerics.within_contract(3.0, 3.004, 0.1) and not numerics.within_contract(3.0, 3.006, 0.1)


def test_result_records_the_numerics_signature_and_deterministic_on_cpu_changes_no_number(tmp_path: Path) -> None:
    runs = {name: result_of(run_job(job_config(tmp_path / name, [*QUICK, *extra]))) for name, extra in (
        ("loop", ["training.engine=loop"]), ("fit", ["training.parallel_models=1", "training.engine=loop"]),
        ("deterministic", ["training.deterministic=true"]))}
    for engine in ("loop", "fit"):
        res = runs[engine]
        sig = res["provenance"]["numerics"]
        assert sig["precision"] == "fp32" and sig["deterministic"] is False and sig["torch"] == torch.__version__
        assert sig["device_name"] == res["provenance"]["device_name"] and sig["cuda"] is None
        assert sig["engine"] == engine
        assert sig["models_together"] == (1 if engine == "fit" else len(res["mdl"]["block_ce_bits"]))
    plain, det = runs["loop"], runs["deterministic"]
    assert det["provenance"]["numerics"]["deterministic"] is True
    assert det["config_hash"] == plain["config_hash"] and det["mdl"]["block_ce_bits"] == plain["mdl"]["block_ce_bits"]
    assert not torch.are_deterministic_algorithms_enabled()  # restored after the job


@pytest.mark.parametrize("device", ["cpu", "auto"])
def test_tf32_where_there_is_no_tf32_is_the_fp32_job(tmp_path: Path, device: str) -> None:
    """TF32 exists on CUDA only: tf32 on a CPU is fp32, the same hash, directory and record."""
    if device == "auto" and torch.cuda.is_available():
        pytest.skip("auto is a CUDA device here")
    from training.app.tasks import load_job

    fp32, tf32 = (job_config(tmp_path, [*QUICK, f"device={device}", f"training.precision={p}"])
                  for p in ("fp32", "tf32"))
    assert job_hash(tf32) == job_hash(fp32) and tf32["paths"]["job_dir"] == fp32["paths"]["job_dir"]
    assert load_job(tf32).training.precision == "fp32"
    first = result_of(run_job(tf32))
    assert first["config"]["training"]["precision"] == "fp32" == first["provenance"]["numerics"]["precision"]
    again = run_job(fp32)
    assert again.status == "skipped" and result_of(again) == first


def test_every_task_trains_in_bf16_when_asked(tmp_path: Path) -> None:
    """A Gradient Starvation task's training forward runs under autocast: its bf16 numbers are not its fp32 ones."""
    small = ["experiment=gs_two_moons", "gs.steps=20", "gs.hidden=64", "gs.grid.n=21", "seed=0"]
    run = get_task("gs_two_moons")
    fp32 = result_of(run(job_config(tmp_path / "a", small)))
    bf16 = result_of(run(job_config(tmp_path / "b", [*small, "training.precision=bf16"])))
    assert bf16["provenance"]["numerics"]["precision"] == "bf16"
    assert bf16["provenance"]["numerics"]["engine"] == "fit" and fp32["provenance"]["numerics"]["engine"] is None
    assert bf16["train"] != fp32["train"], (bf16["train"], fp32["train"])


def test_the_aggregate_labels_a_group_by_the_precision_its_results_record(tmp_path: Path) -> None:
    from tests.test_aggregate_faults import _cfg, _run, _write

    root = tmp_path / "runs"
    for seed in (0, 1):
        _write(root, _cfg("control", seed), 1.0 + seed, device="cpu")
        _write(root, {**_cfg("control", seed, training={"precision": "tf32"}), "device": "cuda"}, 1.5 + seed,
               device="cuda:0")
    rc, md = _run(root, tmp_path)
    assert rc == 0 and "training.precision=?" not in md, md
    assert "training.precision=fp32" in md and "training.precision=tf32" in md, md
