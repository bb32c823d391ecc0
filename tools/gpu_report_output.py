"""tools/gpu_report.py's two files: the JSON report (strict: non-finite figures become null) and its markdown."""

from __future__ import annotations

import datetime as dt
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from tools.gpu_report_model import Report

JSON_NAME, MD_NAME = "gpu_report.json", "gpu_report.md"


def finite(value: Any) -> Any:
    """JSON-safe copy: non-finite floats become None (the JSON stays strict; the test checks figures are finite)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [finite(v) for v in value]
    return value


def now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")


def write_report(report: Report, out: Path) -> None:
    """Both files, atomically (temp file + rename): a kill while writing leaves the previous version."""
    report.updated = now()
    for name, text in ((JSON_NAME, json.dumps(finite(report.to_json()), indent=1, allow_nan=False)),
                       (MD_NAME, markdown(report))):
        tmp = out / f".{name}.tmp"
        tmp.write_text(text + "\n")
        os.replace(tmp, out / name)


def fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "[" + ", ".join(fmt(x) for x in v[:8]) + (", …" if len(v) > 8 else "") + "]"
    return str(v)


def flat_items(d: dict[str, Any], prefix: str = "", depth: int = 0) -> Iterable[tuple[str, Any]]:
    for k, v in d.items():
        if isinstance(v, dict) and depth < 3:
            yield from flat_items(v, f"{prefix}{k}.", depth + 1)
        else:
            yield f"{prefix}{k}", v


def markdown(report: Report) -> str:
    env, dev, c = report.env, report.env.device, report.counts
    git = env.git
    lines = [f"# GPU report: {dev.name} ({report.mode} mode)", "",
             f"- device: {dev.name}" + (f", {dev.total_memory_gb:.1f} GB" if dev.total_memory_gb else "")
             + f"; host CPU: {env.host.cpu}",
             f"- python {env.python}, torch {env.torch} (CUDA {env.cuda or '-'}), commit {git.commit}"
             + (" (with uncommitted changes)" if git.dirty else "") + f", source digest {git.tree_digest}",
             f"- started {report.started}, updated {report.updated or '?'}, {report.total_s:.0f} s; steps: "
             f"{c['ok']} ok, {c['failed']} failed, {c['skipped']} skipped"
             + ("" if report.finished else " (not finished)"), ""]
    if env.install.missing:
        lines += [f"- not importable: {', '.join(env.install.missing)}", ""]
    lines += ["| step | status | seconds | result |", "|---|---|---:|---|"]
    for name, r in report.steps.items():
        seconds = "" if r.seconds is None else r.seconds
        lines.append(f"| {name} | {r.status} | {seconds} | {r.line.replace('|', '/')} |")
    failed = [(n, r) for n, r in report.steps.items() if r.status == "failed"]
    if failed:
        lines += ["", "## Failures"]
        for name, r in failed:
            lines += ["", f"### {name}", "", f"`{r.error or ''}`"]
            if r.tail:
                lines += ["", "```", r.tail, "```"]
    lines += ["", "## Figures"]
    for name, r in report.steps.items():
        if r.figures:
            lines += ["", f"### {name}", ""]
            lines += [f"- {k}: {fmt(v)}" for k, v in flat_items(r.figures) if not k.endswith("failures")]
            for k, v in flat_items(r.figures):
                if k.endswith("failures") and v:
                    lines += [f"- {k}:"] + [f"  - {x}" for x in v]
    return "\n".join(lines)
