"""A site in words and in pictures. Where it is, its figures as a person writes them, and why
its line waits. The heat maps of sites: the census draws a PNG, the scan writes an SVG as text
(no plotting library to import, which took longer than writing the rest)."""

from __future__ import annotations

import html
import re
import textwrap
from collections.abc import Sequence
from pathlib import Path

from hostsync.detector.records import Idle
from hostsync.sites.dispositions import Disposed, Disposition
from hostsync.sites.records import HuntSite

# A disposition's colour in a heat map's site labels, and what the colours mean.
COLOURS = {  # matplotlib's tab:green, tab:gray, tab:blue, tab:red, as SVG reads them too
    Disposition.CARRIED: "#2ca02c",
    Disposition.ACCEPTED: "#7f7f7f",
    Disposition.NOT_CARRIED: "#1f77b4",
    Disposition.CANDIDATE: "#d62728",
}
LABEL_COLOURS = (
    "site labels: green carried, grey accepted, blue not carried, red without a disposition"
)


def where_text(hunted: HuntSite) -> str:
    """The site's file, line and function, and its caller where it is charged per caller."""
    site = hunted.site
    called = f" (from `{hunted.caller}`)" if hunted.caller else ""
    return f"{site.file}:{site.line} `{site.function}`{called}"


def rate_text(value: float | None) -> str:
    """A figure per step as a person writes it; none shows as "-"."""
    return "-" if not value else figure_text(value)


def figure_text(value: float) -> str:
    """A figure per step as a person writes it; 0 shows as 0."""
    return f"{value:.2f}".rstrip("0").rstrip(".")


def spans_text(idle: Idle) -> str:
    """Where a site's windows went: each statement with the host time (us) that ran before it."""
    return "; ".join(f"{span.statement} ({span.us:g})" for span in idle.lines)


# (pattern on the code line, why it waits; the tensor-side alternative where one is obvious).
_READINGS = (
    (
        r"\b(max|min)\(",
        "Python `max`/`min` compares a tensor with a number on the host;"
        " `tensor.clamp(min=...)` stays on the device",
    ),
    (
        r"\.item\(\)",
        "`.item()` copies the value to the host; if it is only logged or summed later, keep"
        " the tensor and read it once when it is logged",
    ),
    (
        r"^\s*(if|elif|while|assert)\b|\b(and|or|not)\b|\bbool\(",
        "a Python truth test of a tensor waits for its value; to choose between values,"
        " `torch.where` keeps it on the device",
    ),
    (r"\b(int|float)\(", "`int()`/`float()` of a tensor copies it to the host"),
    (r"\.shape\b|!=|==|<|>", "a comparison with a tensor operand is read on the host"),
)
_KIND_READINGS = {
    "device_copy": "a blocking copy, not a read: from pageable host memory to the device, the"
    " host waits for the stream's queued work and the copy",
    "host_copy": "copying device values into host memory reads them: the host waits for the device",
    "tolist": "`.tolist()` copies the tensor to the host",
    "cpu": "`.cpu()` copies a device tensor to the host and waits for it",
    "numpy": "`.numpy()` needs the tensor on the host",
    "nonzero": "the output size depends on the data, so the host waits for the count",
    "masked_select": "the output size depends on the data; `torch.where` keeps the shape fixed",
    "unique": "the output size depends on the data",
    "repeat_interleave": "without `output_size=` the host must read the repeats",
    "bool_index": "a boolean mask index has a data-dependent size; `torch.where`/`masked_fill`"
    " keep the shape fixed",
}


def reading(hunted: HuntSite) -> str:
    """Why this line waits, from its kind and code; the obvious alternative where there is one."""
    for kind in hunted.kinds:
        if kind in _KIND_READINGS:
            return _KIND_READINGS[kind]
    for pattern, text in _READINGS:
        if re.search(pattern, hunted.site.code):
            return text
    return "reads a tensor value on the host"


def draw_heat_map(
    path: Path,
    rows: Sequence[str],
    sites: Sequence[Disposed],
    values: Sequence[Sequence[float]],
    title: str,
) -> None:
    """`rows` x `sites` as a PNG at `path`, each cell written in, on a square-root scale. The
    site labels are coloured by disposition."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import PowerNorm

    width = 2.2 + 0.55 * len(sites)
    figure, axes = plt.subplots(figsize=(width, 1.6 + 0.42 * len(rows)))
    # A square-root scale: a one-off burst (ZeRO 3's trace check) must not wash out the rest.
    image = axes.imshow(values, cmap="Reds", aspect="auto", norm=PowerNorm(0.5, vmin=0))
    axes.set_yticks(range(len(rows)), rows, fontsize=8)
    labels = [
        f"#{n} {s.hunted.site.file.rsplit('/', 1)[-1]}:{s.hunted.site.line}"
        for n, s in enumerate(sites, start=1)
    ]
    axes.set_xticks(range(len(sites)), labels, rotation=70, ha="right", fontsize=7)
    for tick, site in zip(axes.get_xticklabels(), sites, strict=True):
        tick.set_color(COLOURS[site.disposition])
    for row, line in enumerate(values):
        for column, value in enumerate(line):
            if value:
                axes.text(column, row, rate_text(value), ha="center", va="center", fontsize=6)
    # Wrapped to the figure's width (about 12 characters an inch at this size).
    axes.set_title("\n".join(textwrap.wrap(title, int(12 * width))), fontsize=9)
    figure.colorbar(image, ax=axes, fraction=0.02)
    figure.tight_layout()
    figure.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(figure)


# The SVG heat map's cells and margins, in pixels; its scale, white to dark red (matplotlib's Reds).
_CELL, _ROW, _LEFT, _TOP = 64, 16, 120, 150
_REDS = ((255, 245, 240), (251, 106, 74), (103, 0, 13))


def svg_heat_map(
    rows: Sequence[str], sites: Sequence[Disposed], values: Sequence[Sequence[float]], title: str
) -> str:
    """`rows` x `sites` as an SVG (GitHub and browsers show it), each cell written in, on the
    PNG's square-root scale. The site labels are coloured by disposition."""
    peak = max((value for line in values for value in line), default=0) or 1
    width = _LEFT + _CELL * len(sites) + 90  # the last site's label leans out to the right
    lines = textwrap.wrap(title, width // 6)
    top = _TOP + 14 * len(lines)
    out = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}"'
        f' height="{top + _ROW * len(rows) + 10}" font-family="sans-serif" font-size="10">',
        '<rect width="100%" height="100%" fill="white"/>',
        *(
            f'<text x="4" y="{14 * (n + 1)}">{html.escape(line)}</text>'
            for n, line in enumerate(lines)
        ),
    ]
    for column, site in enumerate(sites):
        label = f"#{column + 1} {Path(site.hunted.site.file).name}:{site.hunted.site.line}"
        out.append(
            f'<text transform="translate({_LEFT + _CELL * column + _CELL // 2},{top - 6})'
            f' rotate(-60)" fill="{COLOURS[site.disposition]}">{html.escape(label)}</text>'
        )
    for row, (label, line) in enumerate(zip(rows, values, strict=True)):
        y = top + _ROW * row
        out.append(
            f'<text x="{_LEFT - 6}" y="{y + 12}" text-anchor="end">{html.escape(label)}</text>'
        )
        for column, value in enumerate(line):
            x, share = _LEFT + _CELL * column, (value / peak) ** 0.5
            out.append(
                f'<rect x="{x}" y="{y}" width="{_CELL}" height="{_ROW}" fill="{_red(share)}"'
                ' stroke="white"/>'
            )
            if value:
                out.append(
                    f'<text x="{x + _CELL // 2}" y="{y + 12}" text-anchor="middle"'
                    f' fill="{"white" if share > 0.6 else "black"}">{rate_text(value)}</text>'
                )
    return "\n".join([*out, "</svg>"]) + "\n"


def _red(share: float) -> str:
    """The colour of `share` (0 to 1) on the scale, between its stops."""
    low, high = (_REDS[0], _REDS[1]) if share <= 0.5 else (_REDS[1], _REDS[2])
    part = share * 2 if share <= 0.5 else share * 2 - 1
    return "#" + "".join(f"{round(a + (b - a) * part):02x}" for a, b in zip(low, high, strict=True))
