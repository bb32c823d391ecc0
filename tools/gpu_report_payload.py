"""The JSON argument of a tools/gpu_report_work.py measurement: built by the steps that start one
(tools/gpu_report_steps.py, gpu_report_env.py), sent as one JSON string, parsed once by the worker. Each kind reads
its own fields; the rest keep their defaults. Standard library only (it runs with the wheelhouse alone).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Payload:
    device: str = "cpu"
    threads: int | None = None  # torch threads of the worker (None: torch's own)
    # job: `python -m training.run <overrides>`, its peak memory written to memory_file
    overrides: list[str] = field(default_factory=list)
    memory_file: str = ""
    # erasers: n × d data of k classes; ALF-QLEACE's max_rank
    n: int = 0
    d: int = 0
    k: int = 0
    alf_max_rank: int = 0
    # throughput and loop: the data (n rows of `shape`), each architecture's overrides, the subset trained on
    archs: list[str] = field(default_factory=list)
    shape: list[int] = field(default_factory=list)
    arch_overrides: dict[str, list[str]] = field(default_factory=dict)
    subset: int = 0
    val: int = 0
    group: int = 1  # throughput: models trained at once in one vectorised group
    quick: bool = False  # toy run: one epoch per figure, no warm-up (the path, not the figure)
    # loop: one architecture for `seconds`, started together with the others through the ready/go files
    arch: str = ""
    seconds: float = 0.0
    ready: str = ""
    go: str = ""
    wait_s: float = 300.0  # how long a loop worker waits for the go file

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self))

    @classmethod
    def from_json(cls, text: str) -> Payload:
        """The payload a step sent; a key it does not declare is refused (TypeError: the sender is out of date)."""
        return cls(**json.loads(text))
