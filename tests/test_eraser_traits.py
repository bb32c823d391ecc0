"""Erasers declare what they are (erasure/traits.py), and code outside erasure/ asks those properties, never a name:
toy erasers that declare holdout options, identity or a rank hint get that behaviour from the harness, and a scan of
the code finds no comparison with an eraser's name outside erasure/."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch

import erasure
from erasure.base import Eraser, base_info, prepare_fit
from erasure.registry import ERASERS
from erasure.traits import RankHint, eraser_traits
from training.analysis.tables import is_identity
from training.data.eraser_config import batch_erasing
from training.data.registry import LoadedData
from training.inputs.erase import apply_eraser
from training.inputs.plan import FitPlan
from training.inputs.store import Store

ROOT = Path(__file__).resolve().parents[1]


# --- toy erasers, each declaring one property ---------------------------------------------------------------------
class ShrinkEraser(Eraser):
    """x' = μ + s·(x − μ): `scale` None means 1 (like LEACE's rtol None: exact in sample)."""

    name = "toy_shrink"

    def _apply(self, x64: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        return self.state["mean"] + self.state["scale"] * (x64 - self.state["mean"])


def fit_toy_shrink(x: Any, y: Any, *, scale: float | None = None) -> ShrinkEraser:
    x64, labels, flat, k = prepare_fit(x, y)
    info = base_info("toy_shrink", flat, k, torch.bincount(labels, minlength=k), {"scale": scale})
    s = torch.tensor(1.0 if scale is None else scale, dtype=torch.float64)
    return ShrinkEraser({"mean": x64.mean(0), "scale": s}, info)


class FixedRankEraser(Eraser):
    """Removes nothing; reports the rank it was asked to remove (its option, else the rank hint)."""

    name = "toy_ranked"

    def _apply(self, x64: torch.Tensor, y: torch.Tensor | None) -> torch.Tensor:
        return x64


def fit_toy_source(x: Any, y: Any) -> FixedRankEraser:
    x64, labels, flat, k = prepare_fit(x, y)
    info = base_info("toy_source", flat, k, torch.bincount(labels, minlength=k), {})
    info["rank_removed"] = 3
    return FixedRankEraser({"mean": x64.mean(0)}, info)


def fit_toy_ranked(x: Any, y: Any, *, rank: int | None = None, rank_hint: int | None = None) -> FixedRankEraser:
    x64, labels, flat, k = prepare_fit(x, y)
    info = base_info("toy_ranked", flat, k, torch.bincount(labels, minlength=k), {"rank": rank})
    info["rank_removed"] = rank if rank is not None else rank_hint
    return FixedRankEraser({"mean": x64.mean(0)}, info)


def fit_toy_identity(x: Any, y: Any) -> FixedRankEraser:
    raise AssertionError("an identity eraser is never fitted")


TOYS = ("toy_shrink", "toy_source", "toy_ranked", "toy_identity")


@pytest.fixture
def toys() -> Iterator[None]:
    ERASERS.add("toy_shrink", fit_toy_shrink, family="linear", kind="map", holdout_options={"scale": 0.5})
    ERASERS.add("toy_source", fit_toy_source, family="linear", kind="map")
    ERASERS.add("toy_ranked", fit_toy_ranked, family="linear", kind="map",
                rank_hint=RankHint(option="rank", source="toy_source"))
    ERASERS.add("toy_identity", fit_toy_identity, family="control", kind="map", identity=True)
    yield
    for name in TOYS:
        ERASERS._entries.pop(name, None)


def _data() -> LoadedData:
    gen = torch.Generator().manual_seed(0)
    return LoadedData("toy", torch.rand(40, 1, 2, 2, generator=gen), torch.arange(40) % 2, 2)


def _eraser(name: str, **options: Any) -> Any:
    return SimpleNamespace(name=name, options=options)


def _holdout() -> FitPlan:
    return FitPlan("holdout", coded_idx=torch.arange(20, 40), fit_idx=torch.arange(20))


def test_declared_holdout_options_fill_unset_ones_out_of_sample_and_a_rank_hint_takes_its_source(
        toys: None, tmp_path: Path) -> None:
    data = _data()
    _, held = apply_eraser(data, _eraser("toy_shrink"), Store(tmp_path), _holdout(), certificate=False)
    assert held["report"]["options"] == {"scale": 0.5} and held["options"] == {"scale": 0.5}
    _, explicit = apply_eraser(data, _eraser("toy_shrink", scale=0.25), Store(tmp_path), _holdout(),
                               certificate=False)
    assert explicit["report"]["options"] == {"scale": 0.25}  # an explicit option wins
    _, in_sample = apply_eraser(data, _eraser("toy_shrink"), Store(tmp_path), certificate=False)
    assert in_sample["report"]["options"] == {"scale": None}  # in sample: the fitter's own default
    _, plain = apply_eraser(data, _eraser("toy_source"), Store(tmp_path), _holdout(), certificate=False)
    assert plain["options"] == {}  # declaring nothing gets nothing
    _, hinted = apply_eraser(data, _eraser("toy_ranked"), Store(tmp_path), certificate=False)
    assert hinted["report"]["rank_removed"] == 3  # toy_source's rank, fitted through the cache
    _, given = apply_eraser(data, _eraser("toy_ranked", rank=1), Store(tmp_path), certificate=False)
    assert given["report"]["rank_removed"] == 1  # the option set: no hint wanted


def test_declared_identity_is_never_fitted_and_counts_as_the_control(toys: None, tmp_path: Path) -> None:
    data = _data()
    x, info = apply_eraser(data, _eraser("toy_identity"), Store(tmp_path), certificate=False)
    assert torch.equal(x, data.x) and info["report"] == {"rank_removed": 0} and info["cache_hit"] is None
    assert is_identity("toy_identity") and not is_identity("toy_shrink") and not is_identity("no such eraser")
    assert not batch_erasing("toy_identity", {}) and batch_erasing("toy_shrink", {})
    assert batch_erasing("toy_identity", {"zscore": True, "zscore_order": "after"})


def test_traits_read_the_declaration(toys: None) -> None:
    t = eraser_traits("toy_shrink")
    assert t.options().scale is None and t.defaults() == {"scale": None} == erasure.default_options("toy_shrink")
    assert not t.identity and t.has_map and t.rank_hint is None and dict(t.holdout_options) == {"scale": 0.5}
    with pytest.raises(Exception, match="frozen|cannot assign"):
        t.options().scale = 2.0
    ERASERS.add("toy_typo", fit_toy_shrink, family="linear", kind="map", holdout_option={"scale": 0.5})
    try:
        with pytest.raises(TypeError, match="unknown metadata.*holdout_option"):
            eraser_traits("toy_typo")
    finally:
        ERASERS._entries.pop("toy_typo", None)


def test_builtin_erasers_declare_what_the_harness_relied_on_their_names_for() -> None:
    traits = {name: eraser_traits(name) for name in erasure.NAMES}
    assert [n for n, t in traits.items() if t.identity] == ["control"]
    assert {n: dict(t.holdout_options) for n, t in traits.items() if t.holdout_options} == {
        "leace": {"rtol": 1e-6}, "alf_qleace": {"leace_rtol": 1e-6}}
    assert {n: t.rank_hint for n, t in traits.items() if t.rank_hint} == {"random": RankHint("rank", "alf_qleace")}
    assert [n for n, t in traits.items() if t.batch_noise] == ["qleace"]
    assert [n for n, t in traits.items() if not t.has_map] == ["gradient"]
    noise = traits["qleace"].batch_noise
    assert noise is not None and noise.applies({"rank_deficient": "coupling"})
    assert not noise.applies({"rank_deficient": "truncate"})
    x, y = torch.randn(60, 4, generator=torch.Generator().manual_seed(0)), torch.arange(60) % 3
    for name, t in traits.items():  # the declared needs_labels is what the fitted map does
        if t.has_map:
            assert erasure.fit(name, x, y).needs_labels == t.needs_labels, name
    assert traits["qleace"].needs_labels and traits["gradient"].needs_labels and not traits["leace"].needs_labels


# --- no code outside erasure/ compares with an eraser's name -----------------------------------------------------
# Scripts about particular erasers, where the name is the subject, not a property: why each may name them.
# "table": dict literals keyed by names only (data about named erasers); "any": comparisons too.
NAMING_ALLOWED = {
    "tools/bench_erasers.py": ("any", "benchmarks these erasers against concept-erasure by name"),
    "training/tasks/mdl/aggregate_render.py": ("table", "the paper's published numbers per eraser, and their names"),
    "scripts/show_erasure.py": ("table", "a figure's column titles"),
}


def eraser_name_checks(source: str, names: set[str]) -> list[str]:
    """`line: code` of each comparison with an eraser-name literal (`x == "leace"`, `x in ("leace", ...)`,
    `x.startswith("control")`) and each dict literal keyed by eraser names (a per-eraser table kept elsewhere)."""
    def named(node: ast.AST) -> bool:
        if isinstance(node, ast.Constant):
            return node.value in names
        return isinstance(node, (ast.Tuple, ast.List, ast.Set)) and any(named(e) for e in node.elts)

    found = []
    for node in ast.walk(ast.parse(source)):
        hit = False
        if isinstance(node, ast.Compare):
            hit = any(named(side) for side in (node.left, *node.comparators))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            hit = node.func.attr in ("startswith", "endswith", "get") and any(named(a) for a in node.args)
        elif isinstance(node, ast.Dict):
            hit = sum(named(k) for k in node.keys if k is not None) >= 2
        if hit:
            kind = "table" if isinstance(node, ast.Dict) else "check"
            found.append(f"{kind} {getattr(node, 'lineno', 0)}: {ast.get_source_segment(source, node)}")
    return found


def test_no_code_outside_erasure_checks_an_erasers_name() -> None:
    names = set(erasure.NAMES)
    # the scan catches a name check
    src = ('if cfg.eraser.name == "control":\n    pass\n'
           'OPTS = {"leace": {"rtol": 1e-6}, "alf_qleace": {}}\n'
           'ok = name in ("qleace", "x")\nside = name.startswith("control")\n'
           'fine = traits.identity and name == "mdl"\nlog.info("eraser=control: nothing to erase")\n')
    assert [f.split(":")[0] for f in eraser_name_checks(src, names)] == ["check 1", "table 3", "check 4", "check 5"]
    found, allowed_used = [], set()
    for package in ("training", "models", "scripts", "tools"):
        for path in sorted((ROOT / package).rglob("*.py")):
            rel = path.relative_to(ROOT).as_posix()
            hits = eraser_name_checks(path.read_text(), names)
            allowed = NAMING_ALLOWED.get(rel, ("none", ""))[0]
            kept = [h for h in hits if allowed != "any" and not (allowed == "table" and h.startswith("table"))]
            if len(kept) < len(hits):
                allowed_used.add(rel)
            found += [f"{rel}: {h}" for h in kept]
    assert not found, "ask erasure.eraser_traits(name) for the property instead:\n" + "\n".join(found)
    assert allowed_used == set(NAMING_ALLOWED), "an allowance no longer needed: drop it"
