"""A registry that declares its metadata as a dataclass builds each entry's declaration at registration: a key it
does not declare, or one it requires and is not given, is refused there (erasure/registry.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from erasure.registry import Registry


@dataclass(frozen=True)
class Widget:
    size: int
    fancy: bool = False


def test_an_entry_reads_as_its_declaration_and_an_undeclared_or_missing_key_is_refused() -> None:
    reg: Registry[Any] = Registry("widget", declares=Widget)
    reg.add("a", object(), size=3)
    reg.add("b", object(), size=4, fancy=True)
    assert reg.declared("a") == Widget(3, False) and reg.declared("b") == Widget(4, True)  # the declared defaults
    with pytest.raises(TypeError, match=r"widget 'c': unknown metadata \['colour'\]"):
        reg.add("c", object(), size=1, colour="red")
    with pytest.raises(TypeError, match=r"widget 'd': metadata \['size'\] is required"):
        reg.add("d", object())
    assert reg.names() == ["a", "b"]


def test_the_harness_registries_read_typed() -> None:
    from models.registry import arch_traits
    from training.data.registry import DATASETS, dataset_traits
    from training.engine.regularizers import regularizer_traits

    generators = {n for n in DATASETS.names() if dataset_traits(n).generator}
    assert {"gaussian", "mixture"} <= generators and not generators & {"digits", "mnist5k", "cifar10"}
    assert dataset_traits("mnist5k").options is None and dataset_traits("gaussian").options is not None
    assert arch_traits("mlp").vectorises and not arch_traits("swin").vectorises
    assert arch_traits("mlp").depth_exponent == 1.5 and arch_traits("lenet").base_width == 128
    assert regularizer_traits("none").options is None and regularizer_traits("sd").options is not None
