"""The reusable eraser object: immutable float64 state, chunked application, report, save/load."""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from torch import Tensor

from atomicio import atomic_write

from .moments import check_labels, flatten_features
from .threads import single_threaded

FORMAT = "erasure-mdl/eraser-v1"
ENVELOPE = ("format", "name", "info", "state")  # what an eraser file holds (`Eraser.save`)
_CHUNK_BYTES = 256 * 2**20  # float64 working memory per applied chunk


class Eraser:
    """Applies fitted statistics to data: `eraser(x)` (label-free) or `eraser(x, y)` (label-dependent).

    `state` holds float64 tensors (always including `mean`, shape (d,)); `info` is the JSON-serialisable
    report of the fit. Input may be (n, d) or (n, C, H, W); output has the input's shape and dtype.
    """

    name: ClassVar[str] = ""
    needs_labels: ClassVar[bool] = False

    def __init__(self, state: dict[str, Tensor], info: dict[str, Any]):
        self.state = state
        self.info = info

    @property
    def dim(self) -> int:
        return int(self.state["mean"].shape[0])

    @property
    def num_classes(self) -> int:
        return int(self.info["k"])

    @property
    def device(self) -> torch.device:
        return self.state["mean"].device

    def to(self, device: str | torch.device) -> Eraser:
        return type(self)({k: v.to(device) for k, v in self.state.items()}, self.info)

    @single_threaded
    def __call__(self, x: Tensor | np.ndarray, y: Tensor | np.ndarray | None = None) -> Tensor:
        flat, shape = flatten_features(x)
        if flat.shape[1] != self.dim:
            raise ValueError(f"{self.name} eraser was fitted on d={self.dim} features; got d={flat.shape[1]}")
        labels = None
        if self.needs_labels:
            if y is None:
                raise ValueError(f"the {self.name} eraser is label-dependent: call eraser(x, y) with class labels")
            labels, _ = check_labels(y, len(flat), num_classes=self.num_classes)
            labels = labels.to(self.device)
        out = torch.empty_like(flat)
        step = max(1, _CHUNK_BYTES // (8 * self.dim))
        for s in range(0, len(flat), step):
            chunk = flat[s:s + step].to(self.device, torch.float64)
            res = self._apply(chunk, None if labels is None else labels[s:s + step])
            out[s:s + step] = res.to(out.device, out.dtype)
        return out.reshape(shape)

    def apply_in_sample(self, x: Tensor | np.ndarray, y: Tensor | np.ndarray | None = None) -> Tensor:
        """Erase the rows this eraser was fitted on. The same as `eraser(x, y)` for a deterministic map; an eraser
        that adds noise (QLEACE's coupling) draws it with exact moments on its own fit rows, and independently on
        any other rows (`__call__`)."""
        return self(x, y)

    def map_rows(self, x64: Tensor) -> Tensor:
        """The label-free map on float64 rows (n, d) already on this eraser's device, unchecked: no value is read
        back to the host (a training loop's per-batch path); `eraser(x)` checks the input and works in chunks."""
        if self.needs_labels:
            raise ValueError(f"the {self.name} eraser is label-dependent: map_rows needs no labels")
        return self._apply(x64, None)

    def _apply(self, x64: Tensor, y: Tensor | None) -> Tensor:
        raise NotImplementedError

    def report(self) -> dict[str, Any]:
        """What the fit did (rank removed, iterations, residuals, warnings); JSON-serialisable copy."""
        return copy.deepcopy(self.info)

    def save(self, path: str | os.PathLike[str]) -> None:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        payload = {"format": FORMAT, "name": self.name, "info": self.info,
                   "state": {k: v.detach().cpu() for k, v in self.state.items()}}  # ENVELOPE
        atomic_write(path, lambda tmp: torch.save(payload, tmp))  # a reader never sees half a file

    def __repr__(self) -> str:
        return f"{type(self).__name__}(d={self.dim}, k={self.info.get('k')})"


def load(path: str | os.PathLike[str], map_location: str | torch.device = "cpu") -> Eraser:
    """Load an eraser written by `Eraser.save`."""
    payload = torch.load(Path(path), map_location=map_location, weights_only=True)
    if not isinstance(payload, dict) or any(k not in payload for k in ENVELOPE) or payload["format"] != FORMAT:
        raise ValueError(f"{path} is not an eraser file written by erasure.save (format {FORMAT})")
    name = payload["name"]
    classes = eraser_classes()
    if name not in classes:
        raise ValueError(f"{path}: unknown eraser {name!r}; known: {sorted(classes)}")
    return classes[name](payload["state"], payload["info"])


def eraser_classes() -> dict[str, type[Eraser]]:
    """The fitted-eraser classes by the name a saved eraser records: the subclasses of `Eraser` that name themselves
    (read off the class hierarchy: the one registry of erasers is registry.ERASERS, of their fitters)."""
    found: dict[str, type[Eraser]] = {}
    todo = list(Eraser.__subclasses__())
    while todo:
        cls = todo.pop()
        todo += cls.__subclasses__()
        if cls.name:
            found[cls.name] = cls
    return found


def base_info(name: str, flat: Tensor, k: int, counts: Tensor, options: dict[str, Any]) -> dict[str, Any]:
    return counts_info(name, int(flat.shape[1]), counts, str(flat.dtype).replace("torch.", ""), options)


def counts_info(name: str, d: int, counts: Tensor, input_dtype: str, options: dict[str, Any]) -> dict[str, Any]:
    """The report's common part from the class counts (a fit from moments has no rows to look at)."""
    return {"name": name, "n": int(counts.sum()), "d": d, "k": len(counts), "class_counts": [int(c) for c in counts],
            "input_dtype": input_dtype, "options": dict(options), "warnings": []}


def prepare_fit(x: Tensor | np.ndarray, y: Tensor | np.ndarray) -> tuple[Tensor, Tensor, Tensor, int]:
    """Validated float64 `(n, d)` copy of x on x's device, labels, the raw flat x, and K."""
    flat, _ = flatten_features(x)
    labels, k = check_labels(y, len(flat))
    return flat.to(torch.float64), labels.to(flat.device), flat, k
