"""tools/value_trail.py on a toy call chain whose figures are known."""

from __future__ import annotations

from typing import Any

import pytest

from tools.value_trail import Trail, follow


def _a(x: Any) -> Any:
    return _b(x, 1)


def _b(x: Any, n: int) -> Any:
    return _c(x) if n else x


def _c(x: Any) -> Any:
    _unrelated([x])  # a list holding it is another object: not followed
    return _b(x, 0)


def _unrelated(v: Any) -> None:
    return None


def _outer(x: Any) -> Any:
    _a(x)
    return _c(x)  # after _a returned: outside the trail of _a


@pytest.mark.parametrize("entry", [_a, _outer], ids=["the chain", "only calls inside the entry's call"])
def test_the_tracer_counts_functions_returns_and_modules_of_a_toy_chain(entry: Any) -> None:
    # the chain _a -> _b -> _c -> _b, all in this module: three functions, one module, no return to a module left
    trail = Trail("_a", "x")
    follow([trail], lambda: entry(object()), project=("tests",))
    assert [fn for _, fn in trail.visits] == ["_a", "_b", "_c", "_b"]
    assert trail.figures() == (3, 0, 1)


def test_returns_count_each_time_the_value_comes_back_to_a_module_it_left() -> None:
    trail = Trail("f", "x")
    trail.visits = [("m1", "f"), ("m2", "g"), ("m1", "h"), ("m1", "f"), ("m3", "k"), ("m2", "g"), ("m1", "f")]
    assert trail.figures() == (4, 2 + 0 + 1, 3)  # back to m1, to m2, to m1: 3; functions f, g, h, k


class _Loaded:
    def __init__(self, raw: Any) -> None:
        self.raw = raw


def _load(raw: Any) -> _Loaded:
    loaded = _Loaded(raw)  # its own construction is not a hand-off
    _check(loaded)  # inside the handoff, handed the new form: counted once it is returned
    _check(raw)
    return loaded


def _check(x: Any) -> None:
    return None


def _use(cfg: Any) -> None:
    return None


def _entry(raw: Any) -> None:
    cfg = _load(raw)
    _use(cfg)
    _use([cfg])  # another object: not followed


def test_a_handoff_follows_the_value_into_what_rebuilds_it() -> None:
    followed, plain = Trail("_entry", "raw", handoff=("_load",)), Trail("_entry", "raw")
    follow([followed, plain], lambda: _entry(object()), project=("tests",))
    assert [fn for _, fn in followed.visits] == ["_entry", "_load", "_check", "_check", "_use"]
    assert followed.figures() == (4, 0, 1)
    # by identity alone it ends in _load (the raw value is handed to the new form's constructor there)
    assert [fn for _, fn in plain.visits] == ["_entry", "_load", "_Loaded.__init__", "_check"]
