"""Concept erasers for image datasets: LEACE, QLEACE, ALF-QLEACE, gradient moment erasure, random, control.

    import erasure
    eraser = erasure.fit("leace", x, y)          # x (n, d) or (n, C, H, W) float, y int64 0..K-1
    x_erased = eraser(x)                         # qleace needs labels: eraser(x, y)
    eraser.report(); eraser.save("e.pt"); erasure.load("e.pt")
    x_erased, report = erasure.erase("alf_qleace", x, y, {"target": 0.9})
    erasure.certificate(x_erased, y)             # moment gaps and held-out probe accuracies
"""

from . import cache, gradient
from .api import NAMES, data_options, default_options, erase, fit, resolve_options
from .base import Eraser, load
from .certificate import certificate
from .split import split_fit

__all__ = ["NAMES", "Eraser", "cache", "certificate", "data_options", "default_options", "erase", "fit", "gradient",
           "load", "resolve_options", "split_fit"]
