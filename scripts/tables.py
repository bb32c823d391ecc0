"""What the aggregate scripts share: the eraser order of the paper's tables, markdown tables, and the comparison
groups (results that differ in anything but the eraser and the seed are never compared)."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Any

# The paper's column order (Appendix C), then our additions; unknown erasers go last, alphabetically.
ERASER_ORDER = ["control", "leace", "alf_qleace", "gradient", "qleace", "random"]


def eraser_order(names: Iterable[str]) -> list[str]:
    return sorted(set(names), key=lambda e: (ERASER_ORDER.index(e) if e in ERASER_ORDER else len(ERASER_ORDER), e))


def md_cell(value: object) -> str:
    """A value as one markdown table cell: `|` escaped, line breaks folded (an error message may hold both)."""
    return " ".join(str(value).replace("|", r"\|").split("\n"))


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(md_cell(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(md_cell(c) for c in r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


# --- comparison groups ------------------------------------------------------------------------------------
# A group is a JSON object {key: value} of the config keys that split results into groups ("{}": one group).
def _show(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, default=str)


def group_label(group: str) -> str:
    """`optim.lr=0.001, regularizer.name=sd` ("" for the single group)."""
    return ", ".join(f"{k}={_show(v)}" for k, v in json.loads(group).items())


def group_labels(groups: Sequence[str]) -> dict[str, str]:
    """Each group's heading: the keys that differ between the groups, with its values; a key it did not record
    (`?`, e.g. `regularizer.lam` of regularizer none) only where the heading needs it to tell groups apart."""
    keys = differing_keys(groups)
    parsed = {g: json.loads(g) for g in groups}
    full = {g: ", ".join(f"{k}={_show(p.get(k, '?'))}" for k in keys) for g, p in parsed.items()}
    short = {g: ", ".join(f"{k}={_show(p[k])}" for k in keys if p.get(k, "?") != "?") for g, p in parsed.items()}
    distinct = len(set(short.values())) == len(groups) and all(short.values())
    return short if distinct else full


def groups_in(frame: Any) -> list[str]:
    """The distinct groups of a frame with a `group` column, in order of appearance (none: one group)."""
    if "group" not in frame:
        return ["{}"]
    return list(dict.fromkeys(g for g in frame["group"] if isinstance(g, str)))


def differing_keys(groups: Sequence[str]) -> dict[str, list[str]]:
    """Keys whose values differ between the groups, with their shown values."""
    parsed = [json.loads(g) for g in groups]
    out: dict[str, list[str]] = {}
    for k in sorted(set().union(*parsed)):
        values = list(dict.fromkeys(_show(p.get(k, "?")) for p in parsed))
        if len(values) > 1:
            out[k] = values
    return out


class MixedGroupsError(ValueError):
    """A comparison (claim, plot, table) asked for across results that differ in more than eraser and seed."""


def require_one_group(frame: Any, what: str) -> None:
    """Refuse, with one line naming the keys, `what` over results of more than one comparison group."""
    groups = groups_in(frame)
    if len(groups) > 1:
        keys = "; ".join(f"{k} ({' vs '.join(v)})" for k, v in differing_keys(groups).items())
        raise MixedGroupsError(f"refused: {what} would mix results that differ in {keys} besides the eraser and "
                               "seed; compare within one group (scripts/aggregate.py writes one table per group)")
