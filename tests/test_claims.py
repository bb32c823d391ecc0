"""The claims report (scripts/claims.py) on hand-made results: holds / does not hold / not enough seeds."""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import claims  # noqa: E402


def _df(bits: dict[tuple[str, str, int], list[float]], status: str = "done") -> pd.DataFrame:
    """Rows (arch, eraser, width) -> bits per seed 0, 1, ..."""
    rows = [{"dataset": "d", "arch": arch, "width": w, "depth": 2, "variant": "", "eraser": e, "seed": s,
             "status": status, "bits_per_sample": v}
            for (arch, e, w), vals in bits.items() for s, v in enumerate(vals)]
    return pd.DataFrame(rows)


def _verdicts(df: pd.DataFrame, keys: list[str]) -> dict[str, str]:
    return {c.key: v for c, _, v in claims.evaluate(df, keys)}


def test_claims_hold_on_results_that_show_them() -> None:
    df = _df({("mlp_relu", "control", 128): [1.0, 1.1, 0.9], ("mlp_relu", "leace", 128): [1.5, 1.6, 1.3],
              ("mlp_relu", "qleace", 128): [2.5, 2.4, 2.6], ("mlp_relu", "alf_qleace", 128): [2.0, 2.1, 2.2],
              ("lenet", "control", 128): [0.8, 0.7, 0.9], ("lenet", "leace", 128): [1.0, 0.9, 1.2]})
    got = _verdicts(df, ["leace_raises_mdl", "qleace_above_leace", "alf_below_qleace", "wide_no_lower"])
    assert got == {"leace_raises_mdl": "holds", "qleace_above_leace": "holds", "alf_below_qleace": "holds",
                   "wide_no_lower": "not testable here"}
    (claim, tests, _), = claims.evaluate(df, ["leace_raises_mdl"])
    mlp = next(t for t in tests if "mlp_relu" in t.row)
    assert mlp.diffs == pytest.approx({0: 0.5, 1: 0.5, 2: 0.4})
    assert mlp.mean == pytest.approx(1.4 / 3) and mlp.sign_p == pytest.approx(0.125) and mlp.t_p < 0.01
    assert "holds" in claims.markdown(claims.evaluate(df))


def test_a_claim_does_not_hold_when_a_seed_or_an_architecture_disagrees() -> None:
    df = _df({("mlp_relu", "control", 128): [1.0, 1.1, 0.9], ("mlp_relu", "leace", 128): [1.5, 1.0, 1.3],
              ("lenet", "control", 128): [0.8, 0.7, 0.9], ("lenet", "leace", 128): [1.0, 0.9, 1.2],
              ("mlp_relu", "qleace", 128): [1.2, 1.1, 1.0], ("mlp_relu", "alf_qleace", 128): [1.3, 1.2, 1.1]})
    got = _verdicts(df, ["leace_raises_mdl", "qleace_above_leace", "alf_below_qleace"])
    assert got == {"leace_raises_mdl": "does not hold", "qleace_above_leace": "does not hold",
                   "alf_below_qleace": "does not hold"}
    (_, tests, _), = claims.evaluate(df, ["leace_raises_mdl"])
    assert {t.row.split()[1]: t.verdict for t in tests} == {"mlp_relu": "does not hold", "lenet": "holds"}


def test_not_enough_seeds_and_unfinished_rows() -> None:
    df = _df({("mlp_relu", "control", 128): [1.0, 1.1], ("mlp_relu", "leace", 128): [1.5, 1.6]})
    assert _verdicts(df, ["leace_raises_mdl"]) == {"leace_raises_mdl": "not enough seeds"}
    running = _df({("lenet", "control", 128): [0.8, 0.7, 0.9], ("lenet", "leace", 128): [1.0, 0.9, 1.2]},
                  status="missing")
    done = _df({("mlp_relu", "control", 128): [1.0, 1.1, 0.9], ("mlp_relu", "leace", 128): [1.5, 1.6, 1.3]})
    # the MLP row holds, the LeNet row of the sweep has no results yet: not enough seeds overall
    assert _verdicts(pd.concat([done, running]), ["leace_raises_mdl"]) == {"leace_raises_mdl": "not enough seeds"}


def test_width_claim() -> None:
    flat = _df({("mlp_relu", "leace", 1024): [2.0, 2.1, 2.2], ("mlp_relu", "leace", 2048): [2.05, 2.0, 2.3],
                ("mlp_relu", "leace", 128): [3.0, 3.0, 3.0]})
    assert _verdicts(flat, ["wide_no_lower"]) == {"wide_no_lower": "holds"}
    lower = _df({("mlp_relu", "leace", 1024): [2.0, 2.1, 2.2], ("mlp_relu", "leace", 2048): [1.5, 1.6, 1.7]})
    assert _verdicts(lower, ["wide_no_lower"]) == {"wide_no_lower": "does not hold"}
    with pytest.raises(ValueError, match="unknown claims"):
        claims.evaluate(flat, ["no_such_claim"])
