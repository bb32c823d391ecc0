"""tools/gpu_report.py's report as types, and the one reader/writer of its JSON (`Report.to_json`,
`Report.from_json`): the runner, the markdown, `--merge`, the sweep-cost step and `make plan` read fields, not dicts.

Plain dataclasses (standard library only): the GPU machine runs the report with nothing but the wheelhouse.
A record keeps the keys it does not declare in `extra` (a newer report read by older code loses nothing).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, TypeVar

SCHEMA = "erasure-mdl gpu-report 1"
STATUSES = ("ok", "failed", "skipped")
NOT_RUN = ("not reached", "no time")  # a skipped step's reason when the report never ran it (budget, end)

R = TypeVar("R")


def build(cls: type[R], raw: Any) -> R:
    """`cls` from a JSON object: its declared fields, the other keys in `extra` (when `cls` has it)."""
    raw = raw if isinstance(raw, dict) else {}
    names = {f.name for f in dataclasses.fields(cls)}  # type: ignore[arg-type]
    known = {k: v for k, v in raw.items() if k in names and k != "extra"}
    if "extra" in names:
        known["extra"] = {k: v for k, v in raw.items() if k not in names}
    return cls(**known)


def as_json(obj: Any) -> dict[str, Any]:
    """A record as JSON: its fields without None, `extra` merged back in."""
    out = {f.name: getattr(obj, f.name) for f in dataclasses.fields(obj) if f.name != "extra"}
    out = {k: v for k, v in out.items() if v is not None}
    return {**getattr(obj, "extra", {}), **out}


@dataclass
class StepRecord:
    """One step: its status (ok | failed | skipped), why (summary, reason or error), its time and figures."""

    group: str = ""
    title: str = ""
    status: str = "skipped"
    reason: str | None = None
    error: str | None = None
    tail: str | None = None
    summary: str | None = None
    started: str | None = None
    timeout_s: float | None = None
    seconds: float | None = None
    cpu_s: float | None = None
    figures: dict[str, Any] = field(default_factory=dict)
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def line(self) -> str:
        return self.summary or self.reason or self.error or ""

    @property
    def ran(self) -> bool:
        """False for a step the report skipped without trying it (no time left, or it ended before)."""
        return not (self.status == "skipped" and str(self.reason or "").startswith(NOT_RUN))

    @property
    def ok_figures(self) -> dict[str, Any] | None:
        return self.figures if self.status == "ok" else None


@dataclass
class DeviceInfo:
    name: str = "?"
    type: str | None = None
    total_memory_gb: float | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass
class GitInfo:
    tree_digest: str = "?"
    commit: str = "?"
    dirty: bool | None = None
    commit_given: str | None = None


@dataclass
class HostInfo:
    cpu: str = "?"
    cores: int | None = None
    platform: str | None = None
    memory_gb: float | None = None


@dataclass
class InstallInfo:
    wheels: int = 0
    missing: list[str] = field(default_factory=list)
    seconds: float | None = None
    pip: dict[str, Any] | None = None


@dataclass
class Env:
    python: str = "?"
    torch: str = "?"
    cuda: str | None = None
    cudnn: int | None = None
    host: HostInfo = field(default_factory=HostInfo)
    git: GitInfo = field(default_factory=GitInfo)
    device: DeviceInfo = field(default_factory=DeviceInfo)
    packages: dict[str, str | None] = field(default_factory=dict)
    install: InstallInfo = field(default_factory=InstallInfo)

    @classmethod
    def from_json(cls, raw: Any) -> Env:
        env = build(cls, raw)
        env.host, env.git = build(HostInfo, env.host), build(GitInfo, env.git)
        env.device, env.install = build(DeviceInfo, env.device), build(InstallInfo, env.install)
        return env

    def to_json(self) -> dict[str, Any]:
        return {**as_json(self), "host": as_json(self.host), "git": as_json(self.git), "device": as_json(self.device),
                "install": as_json(self.install)}


@dataclass
class Report:
    """The whole report: what ran where (env), each step's record, in order, and the totals."""

    started: str = "?"
    argv: list[str] = field(default_factory=list)
    schema: str = SCHEMA
    mode: str = "toy"
    device: str = "cpu"
    finished: bool = False
    total_s: float = 0.0
    updated: str | None = None
    env: Env = field(default_factory=Env)
    sizes: dict[str, Any] = field(default_factory=dict)
    steps: dict[str, StepRecord] = field(default_factory=dict)
    merged_from: list[dict[str, Any]] | None = None

    @property
    def counts(self) -> dict[str, int]:
        return {s: sum(r.status == s for r in self.steps.values()) for s in STATUSES}

    def to_json(self) -> dict[str, Any]:
        out = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        out.update(env=self.env.to_json(), steps={n: as_json(r) for n, r in self.steps.items()}, counts=self.counts)
        return {k: v for k, v in out.items() if v is not None}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Report:
        fields = {f.name for f in dataclasses.fields(cls)}
        rep = cls(**{k: v for k, v in raw.items() if k in fields and k not in ("env", "steps")})
        rep.env = Env.from_json(raw["env"] if "env" in raw else {})
        rep.steps = {n: build(StepRecord, r) for n, r in (raw["steps"] if "steps" in raw else {}).items()}
        return rep

    def ok_figures(self, step: str) -> dict[str, Any] | None:
        """The figures of `step` if it finished ok in this report."""
        return self.steps[step].ok_figures if step in self.steps else None
