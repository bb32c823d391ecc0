"""What `tools/bench_mdl.py --json` writes (outputs/bench/bench_mdl.json): written from this type, read back into it
by the GPU report's bench_mdl step (`make plan` reads the JSON's median_s and seeds itself). A file written before a
key existed reads the key's default here; a key this type does not declare is ignored."""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class BenchSummary:
    device: str = ""
    n: int | None = None  # rows of the synthetic data
    d: int | None = None  # features per row
    epochs: int | None = None  # per block model, no early stopping
    seeds: int | None = None  # seeds per run (the median is over the run, all seeds)
    repeats: int | None = None
    threads: int | None = None
    median_s: dict[str, float] = field(default_factory=dict)  # variant (naive, ours, fused) -> median seconds
    speedup: dict[str, float] = field(default_factory=dict)  # variant -> naive / variant
    peak_mb: dict[str, float] = field(default_factory=dict)
    runs: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # every repeat's worker figures
    bandwidth: dict[str, Any] | None = None  # GPU only: device read, host→device copy, one epoch

    def to_json(self) -> str:
        out = dataclasses.asdict(self)
        if self.bandwidth is None:
            del out["bandwidth"]
        return json.dumps(out, indent=1)

    @classmethod
    def from_json(cls, value: dict[str, Any]) -> BenchSummary:
        return cls(**{f.name: value[f.name] for f in dataclasses.fields(cls) if f.name in value})

