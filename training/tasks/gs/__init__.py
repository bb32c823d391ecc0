"""Gradient Starvation (Pezeshki et al. 2021): three tasks sharing one package, declared in gs_*.py (their common
declaration in base.py), their code beside them.

    task=gs_two_moons      2-layer ReLU net, full-batch SGD on two moons: accuracy, margin, boundary shape (moons.py)
    task=gs_colored_mnist  2×300 MLP, full-batch Adam on Colored MNIST: accuracy and the Fig. 3 probes
                           (colored_mnist.py)
    task=gs_erased_eval    μP model trained on original data, evaluated on held-out data erased by `eraser`
                           (erased_eval.py; it loads and erases data with the jobs' pipeline, training/inputs/)

Their result type is result.py's, their tables aggregate_gs.py's. Discovery (training/app/task_spec.py) reads `TASKS`.
"""

from __future__ import annotations

from training.tasks.gs.gs_colored_mnist import TASK as COLORED_MNIST
from training.tasks.gs.gs_erased_eval import TASK as ERASED_EVAL
from training.tasks.gs.gs_two_moons import TASK as TWO_MOONS

TASKS = (COLORED_MNIST, ERASED_EVAL, TWO_MOONS)
