"""Concept erasers for image datasets: LEACE, QLEACE, ALF-QLEACE, gradient moment erasure, random, control.

    import erasure
    eraser = erasure.fit("leace", x, y)          # x (n, d) or (n, C, H, W) float, y int64 0..K-1
    x_erased = eraser(x)                         # qleace needs labels: eraser(x, y)
    eraser.report(); eraser.save("e.pt"); erasure.load("e.pt")
    x_erased, report = erasure.erase("alf_qleace", x, y, {"target": 0.9})
    erasure.certificate(x_erased, y)             # moment gaps and held-out probe accuracies
    with erasure.progress.use(tqdm): ...         # show the progress of a long fit (gradient) with any tqdm-like bar

A library of its own: it imports torch, numpy, the standard library and itself, nothing of the harness
(tests/test_layers.py checks it). Each eraser module registers itself in `registry.ERASERS` when imported; the list
below is every one of them (a new eraser adds its line here).
"""

# The eraser modules, each registering itself in ERASERS: imported before `api`, whose NAMES lists them.
from . import alf_qleace, control, gradient, leace, progress, qleace, random_projection, streaming
from .api import NAMES, data_options, default_options, erase, fit, resolve_options
from .base import Eraser, load
from .certificate import certificate
from .split import split_fit
from .traits import EraserTraits, eraser_traits

__all__ = ["NAMES", "Eraser", "EraserTraits", "alf_qleace", "certificate", "control", "data_options",
           "default_options", "erase", "eraser_traits", "fit", "gradient", "leace", "load", "progress", "qleace",
           "random_projection", "resolve_options", "split_fit", "streaming"]
