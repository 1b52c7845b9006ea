"""Markdown tables and cells, the one way every generated page writes them."""

from __future__ import annotations

import re
from collections.abc import Sequence

_CODE = re.compile(r"(`[^`]*`)")


def cell(text: object) -> str:
    """One table cell: no line breaks, pipes escaped outside code (inside it the table
    reads them as text, and an escape would show)."""
    parts = _CODE.split(" ".join(str(text).split()))
    return "".join(p if i % 2 else p.replace("|", "\\|") for i, p in enumerate(parts))


def code(text: object) -> str:
    """Inline code, or nothing for an empty text (``table`` escapes its pipes)."""
    words = " ".join(str(text).split())
    return f"`{words}`" if words else ""


def table(header: Sequence[str], rows: Sequence[Sequence[object]], align: str = "") -> str:
    """``align``: one letter a column, ``l`` or ``r`` (default: all left)."""
    marks = [("---:" if a == "r" else "---") for a in align.ljust(len(header), "l")]
    lines = [
        "| " + " | ".join(cell(h) for h in header) + " |",
        "| " + " | ".join(marks) + " |",
    ]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def number(value: float | None, digits: int = 2) -> str:
    """A figure as a table shows it: thousands separated, ``digits`` after the point
    below 100, whole above; a dash for none."""
    if value is None:
        return "-"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"
