"""What both aggregate scripts share: the eraser order of the paper's tables and markdown tables."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# The paper's column order (Appendix C), then our additions; unknown erasers go last, alphabetically.
ERASER_ORDER = ["control", "leace", "alf_qleace", "gradient", "qleace", "random"]


def eraser_order(names: Iterable[str]) -> list[str]:
    return sorted(set(names), key=lambda e: (ERASER_ORDER.index(e) if e in ERASER_ORDER else len(ERASER_ORDER), e))


def md_table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"
