"""Plain-text and Markdown tables: one renderer for every summary the workspace prints."""

from __future__ import annotations

from collections.abc import Sequence


def text(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Aligned columns for a terminal."""
    cells = [[str(h) for h in headers], *[[cell(v) for v in row] for row in rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    lines = [
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    ]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def markdown(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub-flavoured Markdown table (pipes in cells escaped)."""

    def line(values: Sequence[str]) -> str:
        return "| " + " | ".join(v.replace("|", "\\|") for v in values) + " |"

    out = [line([str(h) for h in headers]), line(["---"] * len(headers))]
    out += [line([cell(v) for v in row]) for row in rows]
    return "\n".join(out)


def cell(value: object) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)
