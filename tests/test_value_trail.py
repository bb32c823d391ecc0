"""scripts/value_trail.py on a toy call chain whose figures are known."""

from __future__ import annotations

from typing import Any

from scripts.value_trail import Trail, follow


def _a(x: Any) -> Any:
    return _b(x, 1)


def _b(x: Any, n: int) -> Any:
    return _c(x) if n else x


def _c(x: Any) -> Any:
    _unrelated([x])  # a list holding it is another object: not followed
    return _b(x, 0)


def _unrelated(v: Any) -> None:
    return None


def test_the_tracer_counts_functions_returns_and_modules_of_a_toy_chain() -> None:
    # the chain _a -> _b -> _c -> _b, all in this module: three functions, one module, no return to a module left
    trail = Trail("_a", "x")
    follow([trail], lambda: _a(object()), project=("tests",))
    assert [fn for _, fn in trail.visits] == ["_a", "_b", "_c", "_b"]
    assert trail.figures() == (3, 0, 1)


def _outer(x: Any) -> Any:
    _a(x)
    return _c(x)  # after _a returned: outside the trail of _a


def test_only_calls_inside_the_entrys_call_count() -> None:
    trail = Trail("_a", "x")
    follow([trail], lambda: _outer(object()), project=("tests",))
    assert [fn for _, fn in trail.visits] == ["_a", "_b", "_c", "_b"]


def test_returns_count_each_time_the_value_comes_back_to_a_module_it_left() -> None:
    trail = Trail("f", "x")
    trail.visits = [("m1", "f"), ("m2", "g"), ("m1", "h"), ("m1", "f"), ("m3", "k"), ("m2", "g"), ("m1", "f")]
    assert trail.figures() == (4, 2 + 0 + 1, 3)  # back to m1, to m2, to m1: 3; functions f, g, h, k
