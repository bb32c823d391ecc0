"""The checks of plain option dataclasses (field metadata read by training/app/typed.py: `check`, `allowed`), written
once for the datasets, generators and tasks that declare options."""

from __future__ import annotations

from typing import Any

POSITIVE: dict[str, Any] = {"check": lambda v: v >= 1, "allowed": "an integer ≥ 1"}
NONNEG: dict[str, Any] = {"check": lambda v: v >= 0, "allowed": "a number ≥ 0"}
POSITIVE_NUMBER: dict[str, Any] = {"check": lambda v: v > 0, "allowed": "a number > 0"}
