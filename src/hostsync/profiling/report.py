"""Presenting a profile result: the summary table, `summary.md` and the timeline PNG.

Times are shown only from a GPU: on a CPU the summary and the timeline give counts and the order
of events, since a tiny model's CPU milliseconds say nothing about the stall on a GPU.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from hostsync.profiling.records import (
    Capture,
    NsysFigures,
    ProfileResult,
    RegionLabels,
    StepFigures,
)
from hostsync.profiling.traces import CUDA_CALLS, tidy
from hostsync.rank.protocol import SYNC_OP
from hostsync.workspace import results, table
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout

if TYPE_CHECKING:
    from matplotlib.axes import Axes


def cuda_columns(result: ProfileResult) -> bool:
    """The CUDA columns: from a GPU, or from nsys, which counts CUDA calls (0 on a CPU)."""
    return result.on_gpu or any(c.nsys for c in result.captures)


def headers(result: ProfileResult) -> list[str]:
    """The summary's columns; times only from a GPU, where they mean something."""
    labels = result.labels
    found = [
        "tree",
        "release",
        "profiler",
        f"host reads ({SYNC_OP})",
        f"in {labels.measured}",
        f"in {labels.excluded}",
        "aten::item",
        "aten::is_nonzero",
    ]
    if cuda_columns(result):
        found += ["range ms (median)", "DtoH copies", "DtoH bytes", *CUDA_CALLS]
        found += ["GPU idle ms (median)"]
    return found


def summary_table(result: ProfileResult) -> tuple[list[str], list[list[object]]]:
    """Per-step figures by tree; the CUDA columns from a GPU or nsys, times only from a GPU."""
    rows = [summary_row(c, cuda_columns(result), result.on_gpu) for c in result.captures]
    return headers(result), rows


def summary_row(c: Capture, cuda: bool, times: bool) -> list[object]:
    unknown = "-"
    step = c.figures
    if isinstance(step, NsysFigures):  # its reports' figures, no host reads (they are no CUDA)
        nsys = step
        range_ms = nsys.range_ms if times else unknown
        counted = [nsys.cuda_calls[call] for call in CUDA_CALLS]
        return [
            c.tree,
            c.version,
            "nsys",
            *[unknown] * 5,
            range_ms,
            nsys.dtoh_copies,
            nsys.dtoh_bytes,
            *counted,
            unknown,
        ]
    ops, in_forward = step.ops, step.ops_in_forward[SYNC_OP]
    row = [
        c.tree,
        c.version,
        c.profiler,
        ops[SYNC_OP],
        tidy(ops[SYNC_OP] - in_forward),
        in_forward,
        ops["aten::item"],
        ops["aten::is_nonzero"],
    ]
    if cuda:
        calls = step.cuda_calls or {}
        row += [
            step.range_ms if times else unknown,
            step.dtoh_copies,
            step.dtoh_bytes,
            *(calls.get(k) for k in CUDA_CALLS),
            step.gpu_idle_ms,
        ]
    return row


def setting(result: ProfileResult) -> str:
    """One line saying what was profiled, for every table of these figures."""
    first = result.captures[0]
    return (
        f"Profiled: the {result.labels.measured}, per step, {result.steps} profiled"
        f" steps after {result.warmup_steps} warm-up steps, scenario"
        f" `{result.setting.scenario}`, {first.world_size} ranks ({first.backend},"
        f" {first.device.split(':')[0]})"
    )


def caveats(result: ProfileResult) -> list[str]:
    """What the figures cannot say, as Markdown paragraphs: CPU runs, nsys trouble."""
    lines = []
    if not result.on_gpu:
        lines += [
            "Measured on CPU: these are counts of host reads; there are no device copies or GPU"
            f" idle time to measure, and no times are shown. Each `{SYNC_OP}` is a host read"
            " that waits for the device when the same step runs on a GPU.",
            "",
        ]
    if any(c.nsys for c in result.captures) and not result.on_gpu:
        lines += [
            "Nsight Systems on a CPU records the measured ranges (NVTX) and no CUDA: its CUDA"
            " counts are 0 there; the `.nsys-rep` shows the ranges and the OS runtime calls.",
            "",
        ]
    lines += [
        f"{c.tree}: nsys {c.nsys_version} saw {c.nsys.ranges} measured ranges, {c.nsys.steps}"
        " steps on the rank with most.\n"
        for c in result.captures
        if c.nsys
    ]
    return lines + [f"Note: {note}\n" for note in result.notes]


def summary_markdown(result: ProfileResult, result_name: str, png: str | None) -> str:
    headers, rows = summary_table(result)
    lines = [
        f"# Profile of the {result.labels.measured}: {', '.join(c.tree for c in result.captures)}",
        "",
        f"Source: `{result_name}` ({result.stamp.created}). {setting(result)}.",
        "Counts are calls inside the range per step, the largest over ranks; the host reads are",
        f"split into those of the {result.labels.excluded} and the rest.",
        "",
        table.markdown(headers, rows),
        "",
        *caveats(result),
    ]
    lines += [f"![timeline]({png})", ""] if png else []
    lines += ["| tree | command (run from the workspace root) | files |", "| --- | --- | --- |"]
    lines += [f"| {c.tree} | `{c.command}` | {', '.join(c.artifacts)} |" for c in result.captures]
    return "\n".join(lines) + "\n"


def plot_timelines(result: ProfileResult, path: Path) -> None:
    """Each tree's median measured step, before above after, host reads marked: on a time axis
    from a GPU; from a CPU as the share of the step elapsed, since its times mean nothing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    captures = [(c, step) for c in result.captures if (step := c.per_step) is not None]
    figure, axes = plt.subplots(
        len(captures), 1, figsize=(10, 0.8 + 1.6 * len(captures)), sharex=True, squeeze=False
    )
    gpu = result.on_gpu
    labels = result.labels
    for axis, (c, step) in zip(axes[:, 0], captures, strict=True):
        draw_step(axis, c, step, labels, scale=None if gpu else step.timeline.range_ms)
    where = (
        f"ms from the start of the {labels.measured}, measured on a GPU"
        if gpu
        else f"share of the {labels.measured} elapsed, measured on a CPU (no times shown)"
    )
    axes[-1, 0].set_xlabel(
        f"{where}; rank 0, its median step, {captures[0][0].backend},"
        f" {captures[0][0].world_size} ranks\n"
        f"red: host reads of a device value in the {labels.measured};"
        f" grey: in the {labels.excluded}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(figure)


def draw_step(
    axis: Axes, capture: Capture, step: StepFigures, labels: RegionLabels, scale: float | None
) -> None:
    """One lane each for the range, the excluded part, the host reads and, on CUDA, the GPU,
    of the capture's `step`. With `scale`, times are divided by it (the step's length: a share
    of the step)."""
    line = step.timeline
    gpu = line.gpu_busy_ms is not None
    measured, excluded = labels.measured, labels.excluded
    lanes = ["GPU"] * gpu + ["host reads", excluded, measured]
    y = {lane: i for i, lane in enumerate(lanes)}
    unit = scale or 1.0

    def bars(lane: str, spans: Iterable[Sequence[float]], color: str) -> None:
        scaled = [(a / unit, (b - a) / unit) for a, b in spans]
        axis.broken_barh(scaled, (y[lane] - 0.3, 0.6), color=color)

    def marks(lane: str, xs: Sequence[float], color: str) -> None:
        axis.plot([x / unit for x in xs], [y[lane]] * len(xs), "v", color=color, markersize=8)

    bars(measured, [(0, step.range_ms)], "#4c72b0")
    bars(excluded, line.forward_ms, "#8da0cb")
    in_forward = [x for x in line.sync_ms if any(a <= x <= b for a, b in line.forward_ms)]
    aggregation = [x for x in line.sync_ms if x not in in_forward]
    marks("host reads", in_forward, "#999999")
    marks("host reads", aggregation, "#c44e52")
    for x in aggregation:
        axis.axvline(x / unit, color="#c44e52", linewidth=0.8, alpha=0.4)
    if aggregation:
        axis.annotate(
            f"x{len(aggregation)}",
            (aggregation[-1] / unit, y["host reads"]),
            xytext=(6, 6),
            textcoords="offset points",
            color="#c44e52",
        )
    if gpu:
        bars("GPU", line.gpu_busy_ms or (), "#55a868")
        marks("GPU", line.dtoh_ms or (), "#c44e52")
    axis.set_yticks(list(y.values()), list(y))
    axis.set_ylim(-0.6, len(lanes) - 0.4)
    reads, in_model = step.ops[SYNC_OP], step.ops_in_forward[SYNC_OP]
    axis.set_title(
        f"{capture.tree} ({capture.version}): {tidy(reads - in_model)} host reads per"
        f" step in the {measured}, {in_model} in the {excluded}",
        loc="left",
        fontsize=9,
    )


def timeline_name(result: ProfileResult) -> str:
    first = result.captures[0]
    return f"timeline-{first.backend}-ws{first.world_size}.png"


def publish(layout: Layout, result: ProfileResult, staging: Path) -> Path:
    """Write the result file, then its folder: the traces, summary.md and the timeline PNG."""
    path = results.write(layout.profiles, result, keep_elsewhere=layout.unsaved)
    folder = results.attachments(path)
    if folder.exists():
        raise WorkspaceError(f"{folder} already exists: move it aside, it is an earlier capture")
    (staging / "artifacts").rename(folder)
    png = timeline_name(result) if any(c.per_step for c in result.captures) else None
    if png:
        plot_timelines(result, folder / png)
    (folder / "summary.md").write_text(summary_markdown(result, path.name, png))
    return path
