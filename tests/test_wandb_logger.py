"""wandb: offline by default (no key, no network), deterministic run id, disabled by logger=none."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.app.schema import group_config
from training.app.wandb_logger import RunLogger


def test_offline_run_with_deterministic_id(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wandb")
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("WANDB_CONFIG_DIR", str(tmp_path / "cfg"))
    logger = RunLogger(group_config("logger", "wandb"), {"seed": 3},
                       tmp_path, run_id="abc123-s3")
    assert logger._run is not None
    logger.log({"loss": 1.0}, step=1)
    logger.finish()
    runs = list((tmp_path / "wandb").glob("offline-run-*-abc123-s3"))
    assert len(runs) == 1


def test_none_and_disabled_do_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert RunLogger(group_config("logger", "none"), {}, tmp_path, "x")._run is None
    monkeypatch.setenv("WANDB_MODE", "disabled")
    assert RunLogger(group_config("logger", "wandb"), {}, tmp_path, "x")._run is None
    assert not (tmp_path / "wandb").exists()
