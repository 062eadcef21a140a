"""`python -m hostsync profile`: before/after profiles of a case's measured code, tree by tree.

For each tree one torchrun of the case's profile script (its card's `[profile] script`) warms the
reproducer up, then records a few steps whose measured code runs inside the range
`protocol.MEASURED_RANGE` (a part measured apart, such as the model forward, inside it in
`protocol.EXCLUDED_RANGE`; the card names both in words). Where `nsys` is on the PATH and the ranks
have GPUs, Nsight Systems records them (`--capture-range=cudaProfilerApi`) and `nsys stats` makes
the figures; when it cannot, the summary says why and the PyTorch profiler takes over, as it does
everywhere else. Its Chrome traces open in ui.perfetto.dev.

The figures come from the traces themselves: per step, inside the range, the calls of
`aten::_local_scalar_dense` (the host read every `if t > 0`, `max(t, 1)` and `.item()` becomes),
`aten::item` and `aten::is_nonzero`, the forward's share apart; the range's wall time; on CUDA
the device-to-host copies the range launched, their bytes, `cudaStreamSynchronize` and
`cudaMemcpyAsync` calls, and how long the GPU sat idle inside the range.

`profiles/<case>/profile-<stamp>.json` holds the summary; the folder beside it, named like it
without `.json`, the traces (`<tree>-<backend>-ws<N>-rank<R>.trace.json.gz`), `summary.md` and
the timeline PNG. The JSON also records the output of the case's one-process snippet on each tree,
which the issue draft quotes. Times are shown only from a GPU: on a CPU the summary and the
timeline give counts and the order of events, since a tiny model's CPU milliseconds say nothing
about the stall on a GPU.
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import logging
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from hostsync import cases, environment, results, table, upstream
from hostsync.cases import Case
from hostsync.errors import WorkspaceError, last_line
from hostsync.files import sha256
from hostsync.launch import (
    ENGINE_SRC,
    Run,
    RunFailed,
    launch,
    run_group,
    torchrun_command,
)
from hostsync.layout import Layout
from hostsync.options import (
    ALL_CASES,
    add_case,
    add_device,
    add_timeout,
    case_layouts,
    comma_list,
)
from hostsync.protocol import (
    EXCLUDED_RANGE,
    MEASURED_RANGE,
    RUN_DIR_ENV,
    SYNC_OP,
    SYNC_OPS,
    TREE_PACKAGE_ENV,
    TREE_SRC_ENV,
    free_port,
)

log = logging.getLogger(__name__)

CUDA_CALLS = ("cudaStreamSynchronize", "cudaMemcpyAsync")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cpu_op", "cuda_runtime", "cuda_driver")
NSYS_REPORTS = ("cuda_api_sum", "cuda_gpu_mem_size_sum")
# What a rank reads from its environment besides the usual: set them to rerun a capture by hand.
RERUN_ENV = ("PYTHONPATH", RUN_DIR_ENV, TREE_SRC_ENV, TREE_PACKAGE_ENV)


class NsysFailed(WorkspaceError):
    """nsys ran but made no usable report (e.g. a copy that records .qdstrm but cannot export)."""


class Window(NamedTuple):
    """One occurrence of a named range on one host thread, in trace microseconds."""

    pid: int
    tid: int
    start: float
    end: float

    def holds(self, event: dict) -> bool:
        return (
            (event["pid"], event["tid"]) == (self.pid, self.tid)
            and self.start <= event["ts"]
            and event["ts"] + event.get("dur", 0) <= self.end
        )


# --- reading a trace -----------------------------------------------------------------------------


def load_trace(path: Path) -> dict:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as trace:
        return json.load(trace)


def windows(events: Sequence[dict], name: str) -> list[Window]:
    found = [e for e in events if e.get("cat") == "user_annotation" and e.get("name") == name]
    return sorted(Window(e["pid"], e["tid"], e["ts"], e["ts"] + e["dur"]) for e in found)


def analyse_trace(trace: dict) -> list[dict]:
    """The figures of each measured step of one rank's Chrome trace (times in ms)."""
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    steps = windows(events, MEASURED_RANGE)
    if not steps:
        raise WorkspaceError(
            f"the trace has no {MEASURED_RANGE!r} range: was it recorded by a profile script?"
        )
    forwards = windows(events, EXCLUDED_RANGE)
    host = [e for e in events if e.get("cat") in HOST_CATEGORIES]
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
    cuda = bool(trace.get("deviceProperties")) or bool(gpu)
    return [step_figures(step, forwards, host, gpu if cuda else None) for step in steps]


def step_figures(
    step: Window, forwards: list[Window], host: list[dict], gpu: list[dict] | None
) -> dict:
    """What one step's range holds; `gpu` is None on a CPU-only trace."""
    inside = [e for e in host if step.holds(e)]
    in_forward = [e for e in inside if any(f.holds(e) for f in forwards)]

    def ms(us: float) -> float:
        """Trace microseconds as milliseconds from the start of the range."""
        return round((us - step.start) / 1000, 3)

    figures = {
        "range_ms": round((step.end - step.start) / 1000, 3),
        "ops": _count(inside, SYNC_OPS),
        "ops_in_forward": _count(in_forward, SYNC_OPS),
        "timeline": {
            "forward_ms": [[ms(f.start), ms(f.end)] for f in forwards if _within(f, step)],
            "sync_ms": [ms(e["ts"]) for e in inside if e["name"] == SYNC_OP],
            "gpu_busy_ms": None,
            "dtoh_ms": None,
        },
        "cuda_calls": None,
        "dtoh_copies": None,
        "dtoh_bytes": None,
        "gpu_idle_ms": None,
    }
    if gpu is None:
        return figures
    launched = {e["args"]["correlation"] for e in inside if "correlation" in e.get("args", {})}
    dtoh = [
        e
        for e in gpu
        if e["cat"] == "gpu_memcpy"
        and "DtoH" in e["name"]
        and e.get("args", {}).get("correlation") in launched
    ]
    busy = busy_intervals(gpu, step.start, step.end)
    figures.update(
        cuda_calls=_count(inside, CUDA_CALLS),
        dtoh_copies=len(dtoh),
        dtoh_bytes=sum(int(e["args"].get("bytes", 0)) for e in dtoh),
        gpu_idle_ms=round((step.end - step.start - sum(b - a for a, b in busy)) / 1000, 3),
    )
    figures["timeline"].update(
        gpu_busy_ms=[[ms(a), ms(b)] for a, b in busy], dtoh_ms=[ms(e["ts"]) for e in dtoh]
    )
    return figures


def busy_intervals(gpu: list[dict], start: float, end: float) -> list[tuple[float, float]]:
    """The union of the GPU's activity (any stream) clipped to [start, end]."""
    spans = sorted(
        (max(e["ts"], start), min(e["ts"] + e.get("dur", 0), end))
        for e in gpu
        if e["ts"] < end and e["ts"] + e.get("dur", 0) > start
    )
    merged: list[tuple[float, float]] = []
    for a, b in spans:
        if merged and a <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], b))
        else:
            merged.append((a, b))
    return merged


def _within(inner: Window, outer: Window) -> bool:
    return (inner.pid, inner.tid) == (outer.pid, outer.tid) and (
        outer.start <= inner.start and inner.end <= outer.end
    )


def _count(events: list[dict], names: Sequence[str]) -> dict[str, int]:
    counts = Counter(e["name"] for e in events if e["name"] in names)
    return {name: counts[name] for name in names}


# --- per capture: the ranks' steps combined ------------------------------------------------------


def combine(per_rank_steps: list[list[dict]]) -> dict:
    """Per-step figures of one capture: counts as the largest over ranks of each rank's mean per
    step (a step waits for its slowest rank), times as the median over every rank's steps; the
    timeline is rank 0's median step."""

    def largest(value: Callable[[dict], float | None]) -> float | None:
        if value(per_rank_steps[0][0]) is None:
            return None
        return _tidy(max(statistics.fmean(map(value, steps)) for steps in per_rank_steps))

    def median(value: Callable[[dict], float | None]) -> float | None:
        values = [value(step) for steps in per_rank_steps for step in steps]
        return None if None in values else round(statistics.median(values), 3)

    def counts(key: str, names: Sequence[str]) -> dict | None:
        if per_rank_steps[0][0][key] is None:
            return None
        return {name: largest(lambda step, name=name: step[key][name]) for name in names}

    rank0 = sorted(per_rank_steps[0], key=lambda step: step["range_ms"])
    typical = rank0[len(rank0) // 2]
    return {
        "range_ms": median(lambda step: step["range_ms"]),
        "ops": counts("ops", SYNC_OPS),
        "ops_in_forward": counts("ops_in_forward", SYNC_OPS),
        "cuda_calls": counts("cuda_calls", CUDA_CALLS),
        "dtoh_copies": largest(lambda step: step["dtoh_copies"]),
        "dtoh_bytes": largest(lambda step: step["dtoh_bytes"]),
        "gpu_idle_ms": median(lambda step: step["gpu_idle_ms"]),
        "timeline": typical["timeline"] | {"range_ms": typical["range_ms"]},
    }


def _tidy(value: float) -> float | int:
    return int(value) if float(value).is_integer() else round(value, 3)


# --- nsys ----------------------------------------------------------------------------------------


def nsys_command(report: Path, command: Sequence[str]) -> list[str]:
    """Nsight Systems around the launcher, recording between cudaProfilerStart and Stop."""
    return [
        "nsys", "profile", "-t", "cuda,nvtx,osrt",
        "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
        "-o", str(report), *command,
    ]  # fmt: skip


def nsys_stats_command(report: Path, prefix: Path) -> list[str]:
    reports = [arg for name in NSYS_REPORTS for arg in ("--report", name)]
    return [
        "nsys", "stats", *reports, "--format", "csv", "--output", str(prefix),
        f"--filter-nvtx={MEASURED_RANGE}", str(report),
    ]  # fmt: skip


def nsys_figures(stats_dir: Path, prefix: str, steps: int) -> dict:
    """cuda_api_sum and cuda_gpu_mem_size_sum CSVs as per-step figures (all ranks together)."""
    api = _csv_rows(stats_dir / f"{prefix}_cuda_api_sum.csv")
    memory = _csv_rows(stats_dir / f"{prefix}_cuda_gpu_mem_size_sum.csv")
    calls = {row["Name"].split("_v")[0]: int(row["Num Calls"]) for row in api}
    dtoh = [row for row in memory if re.search(r"Device-to-Host|DtoH", row["Operation"])]
    return {
        "cuda_calls": {call: _tidy(calls.get(call, 0) / steps) for call in CUDA_CALLS},
        "dtoh_copies": _tidy(sum(int(row["Count"]) for row in dtoh) / steps),
        "dtoh_mb_total": sum(float(row["Total (MB)"]) for row in dtoh),
    }


def _csv_rows(path: Path) -> list[dict]:
    if not path.exists():
        raise NsysFailed(f"nsys stats wrote no {path.name}")
    with path.open(newline="") as table_file:
        return list(csv.DictReader(table_file))


# --- one capture ---------------------------------------------------------------------------------


def capture_name(tree: str, backend: str, world_size: int) -> str:
    return f"{tree.replace('+', '-')}-{backend}-ws{world_size}"


def shown(layout: Layout, command: Sequence[str], run: Run | None = None,
          env: dict[str, str] | None = None) -> str:  # fmt: skip
    """The command as a user reruns it by hand from the workspace root, with the variables the
    ranks read (no paths of this machine: it goes into result files)."""
    root = str(layout.root) + os.sep

    def relative(text: str) -> str:
        return text.replace(str(ENGINE_SRC), "src").replace(root, "")

    pythons = {sys.executable, run and run.tree.python}
    words = ["python" if word in pythons else relative(word) for word in command]
    if run is None:
        return shlex.join(words)
    env = env or {}
    variables = {name: run.environment(env)[name] for name in (*RERUN_ENV, *env)}
    # Paths once each (PYTHONPATH may name the engine's src/ twice).
    parts = {name: dict.fromkeys(relative(value).split(os.pathsep))
             for name, value in variables.items()}  # fmt: skip
    assignments = [f"{name}={os.pathsep.join(found)}" for name, found in parts.items()]
    mkdir = shlex.join(["mkdir", "-p", relative(str(run.run_dir))])
    return f"{mkdir} && {shlex.join(assignments + words)}"


def capture(
    layout: Layout,
    tree: upstream.Tree,
    run_dir: Path,
    artifacts: Path,
    *,
    options: argparse.Namespace,
    profiler: str,
) -> dict:
    """One torchrun of the worker on `tree`; its per-step figures and where its files went."""
    args = [
        "--device", options.device, "--profiler", profiler, "--scenario", options.scenario,
        "--warmup", str(options.warmup), "--steps", str(options.steps),
    ]  # fmt: skip
    script = layout.repro / options.case.profile["script"]
    command = torchrun_command(tree.python, script, options.sp_size, args)
    nsys_report = run_dir / "capture"
    if profiler == "nsys":
        command = nsys_command(nsys_report, command)
    run = Run(run_dir, tree, layout)
    env = environment.device_env(options.device)
    by_hand = shown(layout, command, run, env)
    print(f"{tree.label}: {by_hand}")
    started = time.monotonic()
    ranks = launch(run, command, nprocs=options.sp_size, timeout=options.timeout, env=env)
    seconds = round(time.monotonic() - started, 1)
    name = capture_name(tree.label, ranks[0]["backend"], ranks[0]["world_size"])
    record = {
        "tree": tree.label,
        "version": tree.version,
        "commit": tree.commit,
        "backend": ranks[0]["backend"],
        "world_size": ranks[0]["world_size"],
        "device": ranks[0]["device"],
        "profiler": profiler,
        "command": by_hand,
        "wall_s": seconds,
        "artifacts": [],
    }
    if profiler == "nsys":
        report = nsys_report.with_suffix(".nsys-rep")
        if not report.exists():
            raise NsysFailed("nsys recorded no .nsys-rep report (only a .qdstrm, or nothing)")
        stats = nsys_stats_command(report, run_dir / "stats")
        print(f"{tree.label}: {shown(layout, stats)}")
        made = subprocess.run(stats, capture_output=True, text=True, timeout=600)
        if made.returncode != 0:
            raise NsysFailed(f"`nsys stats` failed on the report ({last_line(made.stderr)})")
        figures = nsys_figures(run_dir, "stats", options.steps)
        shutil.move(report, artifacts / f"{name}.nsys-rep")
        range_s = [s for rank in ranks for s in rank["range_seconds"]]
        figures["range_ms"] = round(1000 * statistics.median(range_s), 3)  # the ranks' clocks
        record |= {"artifacts": [f"{name}.nsys-rep"], "nsys": figures}
        return record
    per_rank = []
    for result in ranks:
        trace = run_dir / result["trace"]
        per_rank.append(analyse_trace(load_trace(trace)))
        target = f"{name}-rank{result['rank']}.trace.json.gz"
        shutil.move(trace, artifacts / target)
        record["artifacts"].append(target)
    record["per_step"] = combine(per_rank)
    return record


def capture_with_fallback(
    layout: Layout,
    tree: upstream.Tree,
    staging: Path,
    options: argparse.Namespace,
    notes: list[str],
) -> dict:
    """nsys when chosen; when it cannot make a report, say so and use the PyTorch profiler."""
    artifacts = staging / "artifacts"
    if options.profiler == "nsys":
        try:
            return capture(
                layout,
                tree,
                staging / f"{tree.label}-nsys",
                artifacts,
                options=options,
                profiler="nsys",
            )
        except (NsysFailed, RunFailed) as error:
            notes.append(
                f"{tree.label}: nsys is on the PATH but {error}; the figures come from"
                " the PyTorch profiler instead"
            )
            log.warning("%s", notes[-1])
    return capture(layout, tree, staging / tree.label, artifacts, options=options, profiler="torch")


# --- the issue snippet ---------------------------------------------------------------------------


def snippet_path(layout: Layout, case: Case) -> Path | None:
    """The case's one-process snippet, which an issue quotes with its output (if it has one)."""
    name = case.profile.get("snippet")
    return layout.repro / name if name else None


def run_snippet(layout: Layout, case: Case, tree: upstream.Tree, run_dir: Path,
                device: str) -> str:  # fmt: skip
    """The line the snippet prints on `tree` (its card's `snippet_output` pattern)."""
    run = Run(run_dir, tree, layout)
    env = {"MASTER_PORT": str(free_port())} | environment.device_env(device)
    snippet = snippet_path(layout, case)
    status = run_group(run, [tree.python, str(snippet)], timeout=300, env=env)
    output = run.log_file.read_text()
    found = re.findall(case.profile["snippet_output"], output, re.MULTILINE)
    if status != 0 or not found:
        raise WorkspaceError(
            f"{snippet.name} failed on {tree.label} (exit status {status}): see {run.log_file}"
        )
    return found[-1]


# --- presenting ----------------------------------------------------------------------------------


def artifacts_dir(result: Path) -> Path:
    """Where a profile result's traces, summary.md and PNG lie: beside it, named like it."""
    return result.with_suffix("")


def headers(payload: dict) -> list[str]:
    """The summary's columns; times only from a GPU, where they mean something."""
    labels = payload["labels"]
    found = ["tree", "release", "profiler", f"host reads ({SYNC_OP})", f"in {labels['measured']}",
             f"in {labels['excluded']}", "aten::item", "aten::is_nonzero"]  # fmt: skip
    if on_gpu(payload):
        found += ["range ms (median)", "DtoH copies", "DtoH bytes", *CUDA_CALLS]
        found += ["GPU idle ms (median)"]
    return found


def on_gpu(payload: dict) -> bool:
    return any(c["device"].startswith("cuda") for c in payload["captures"])


def summary_table(payload: dict) -> tuple[list[str], list[list[object]]]:
    """Per-step figures by tree; times and the CUDA columns only when the capture ran on CUDA."""
    cuda = on_gpu(payload)
    return headers(payload), [summary_row(c, cuda) for c in payload["captures"]]


def summary_row(c: dict, cuda: bool) -> list[object]:
    if "per_step" not in c:  # nsys: the figures of its reports only
        nsys = c["nsys"]
        counts = [nsys["dtoh_copies"], f"{nsys['dtoh_mb_total']} MB in all"]
        calls = [nsys["cuda_calls"][call] for call in CUDA_CALLS]
        return [c["tree"], c["version"], "nsys", *["-"] * 5, nsys["range_ms"], *counts, *calls, "-"]
    step = c["per_step"]
    ops, in_forward = step["ops"], step["ops_in_forward"][SYNC_OP]
    row = [c["tree"], c["version"], c["profiler"], ops[SYNC_OP], _tidy(ops[SYNC_OP] - in_forward),
           in_forward, ops["aten::item"], ops["aten::is_nonzero"]]  # fmt: skip
    if cuda:
        calls = step["cuda_calls"] or {}
        row += [step["range_ms"], step["dtoh_copies"], step["dtoh_bytes"],
                *(calls.get(k) for k in CUDA_CALLS), step["gpu_idle_ms"]]  # fmt: skip
    return row


def setting(payload: dict) -> str:
    """One line saying what was profiled, for every table of these figures."""
    first = payload["captures"][0]
    return (
        f"Profiled: the {payload['labels']['measured']}, per step, {payload['steps']} profiled"
        f" steps after {payload['warmup_steps']} warm-up steps, scenario"
        f" `{payload['setting']['scenario']}`, {first['world_size']} ranks ({first['backend']},"
        f" {first['device'].split(':')[0]})"
    )


def caveats(payload: dict) -> list[str]:
    """What the figures cannot say, as Markdown paragraphs: CPU runs, nsys trouble."""
    lines = []
    if not on_gpu(payload):
        lines += [
            "Measured on CPU: these are counts of host reads; there are no device copies or GPU"
            f" idle time to measure, and no times are shown. Each `{SYNC_OP}` is a host read"
            " that waits for the device when the same step runs on a GPU.",
            "",
        ]
    return lines + [f"Note: {note}\n" for note in payload["notes"]]


def summary_markdown(payload: dict, result_name: str, png: str | None) -> str:
    headers, rows = summary_table(payload)
    lines = [
        f"# Profile of the {payload['labels']['measured']}:"
        f" {', '.join(c['tree'] for c in payload['captures'])}",
        "",
        f"Source: `{result_name}` ({payload['created']}). {setting(payload)}.",
        "Counts are calls inside the range per step, the largest over ranks; the host reads are",
        f"split into those of the {payload['labels']['excluded']} and the rest.",
        "",
        table.markdown(headers, rows),
        "",
        *caveats(payload),
    ]
    lines += [f"![timeline]({png})", ""] if png else []
    lines += ["| tree | command (run from the workspace root) | files |", "| --- | --- | --- |"]
    lines += [
        f"| {c['tree']} | `{c['command']}` | {', '.join(c['artifacts'])} |"
        for c in payload["captures"]
    ]
    return "\n".join(lines) + "\n"


def plot_timelines(payload: dict, path: Path) -> None:
    """Each tree's median measured step, before above after, host reads marked: on a time axis
    from a GPU; from a CPU as the share of the step elapsed, since its times mean nothing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    captures = [c for c in payload["captures"] if "per_step" in c]
    figure, axes = plt.subplots(len(captures), 1, figsize=(10, 0.8 + 1.6 * len(captures)),
                                sharex=True, squeeze=False)  # fmt: skip
    gpu = on_gpu(payload)
    labels = payload["labels"]
    for axis, c in zip(axes[:, 0], captures, strict=True):
        draw_step(axis, c, labels, scale=None if gpu else c["per_step"]["timeline"]["range_ms"])
    where = (
        f"ms from the start of the {labels['measured']}, measured on a GPU"
        if gpu
        else f"share of the {labels['measured']} elapsed, measured on a CPU (no times shown)"
    )
    axes[-1, 0].set_xlabel(
        f"{where}; rank 0, its median step, {captures[0]['backend']},"
        f" {captures[0]['world_size']} ranks\n"
        f"red: host reads of a device value in the {labels['measured']};"
        f" grey: in the {labels['excluded']}"
    )
    figure.tight_layout()
    figure.savefig(path, dpi=110, metadata={"Software": None})
    plt.close(figure)


def draw_step(axis, capture: dict, labels: dict, scale: float | None) -> None:
    """One lane each for the range, the excluded part, the host reads and, on CUDA, the GPU.
    With `scale`, times are divided by it (the step's length: a share of the step)."""
    step, line = capture["per_step"], capture["per_step"]["timeline"]
    gpu = line["gpu_busy_ms"] is not None
    measured, excluded = labels["measured"], labels["excluded"]
    lanes = ["GPU"] * gpu + ["host reads", excluded, measured]
    y = {lane: i for i, lane in enumerate(lanes)}
    unit = scale or 1.0

    def bars(lane: str, spans: list, color: str) -> None:
        spans = [(a / unit, (b - a) / unit) for a, b in spans]
        axis.broken_barh(spans, (y[lane] - 0.3, 0.6), color=color)

    def marks(lane: str, xs: list[float], color: str) -> None:
        axis.plot([x / unit for x in xs], [y[lane]] * len(xs), "v", color=color, markersize=8)

    bars(measured, [(0, line["range_ms"])], "#4c72b0")
    bars(excluded, line["forward_ms"], "#8da0cb")
    in_forward = [x for x in line["sync_ms"] if any(a <= x <= b for a, b in line["forward_ms"])]
    aggregation = [x for x in line["sync_ms"] if x not in in_forward]
    marks("host reads", in_forward, "#999999")
    marks("host reads", aggregation, "#c44e52")
    for x in aggregation:
        axis.axvline(x / unit, color="#c44e52", linewidth=0.8, alpha=0.4)
    if aggregation:
        axis.annotate(f"x{len(aggregation)}", (aggregation[-1] / unit, y["host reads"]),
                      xytext=(6, 6), textcoords="offset points", color="#c44e52")  # fmt: skip
    if gpu:
        bars("GPU", line["gpu_busy_ms"], "#55a868")
        marks("GPU", line["dtoh_ms"], "#c44e52")
    axis.set_yticks(list(y.values()), list(y))
    axis.set_ylim(-0.6, len(lanes) - 0.4)
    reads, in_model = step["ops"][SYNC_OP], step["ops_in_forward"][SYNC_OP]
    axis.set_title(
        f"{capture['tree']} ({capture['version']}): {_tidy(reads - in_model)} host reads per"
        f" step in the {measured}, {in_model} in the {excluded}",
        loc="left", fontsize=9,
    )  # fmt: skip


def timeline_name(payload: dict) -> str:
    first = payload["captures"][0]
    return f"timeline-{first['backend']}-ws{first['world_size']}.png"


def publish(layout: Layout, payload: dict, staging: Path) -> Path:
    """Write the result file, then its folder: the traces, summary.md and the timeline PNG."""
    result = results.write(layout, "profile", payload)
    folder = artifacts_dir(result)
    if folder.exists():
        raise WorkspaceError(f"{folder} already exists: move it aside, it is an earlier capture")
    (staging / "artifacts").rename(folder)
    png = timeline_name(payload) if any("per_step" in c for c in payload["captures"]) else None
    if png:
        plot_timelines(payload, folder / png)
    document = json.loads(result.read_text())  # with `created`, as review will read it
    (folder / "summary.md").write_text(summary_markdown(document, result.name, png))
    return result


# --- command line --------------------------------------------------------------------------------


def choose_profiler(requested: str, device: str) -> str:
    found = shutil.which("nsys")
    if requested == "auto":
        return "nsys" if found and device == "cuda" else "torch"
    if requested == "nsys" and device != "cuda":
        raise WorkspaceError("--profiler nsys records CUDA: use --device cuda, or --profiler torch")
    if requested == "nsys" and not found:
        raise WorkspaceError(
            "--profiler nsys: no nsys on the PATH; install Nsight Systems or use --profiler torch"
        )
    return requested


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync profile",
        description="Profile a case's measured code before and after, tree by tree: Nsight"
        " Systems where nsys and GPUs exist, the PyTorch profiler everywhere.",
    )
    add_case(parser)
    parser.add_argument("--trees", help="trees to profile, before first (default: the card's)")
    parser.add_argument("--scenario", help="one of the case's (default: the card's)")
    parser.add_argument("--warmup", type=int, default=2, help="unprofiled steps first (default: 2)")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (default: 3)")
    add_device(parser)
    parser.add_argument(
        "--profiler",
        choices=("auto", "torch", "nsys"),
        default="auto",
        help="auto: nsys when it is on the PATH and the ranks have GPUs",
    )
    add_timeout(parser, "one torchrun")
    return parser


def profile_case(layout: Layout, options: argparse.Namespace) -> None:
    case = options.case = cases.load(layout.root, layout.case)
    if not case.profile:
        raise WorkspaceError(f"case {case.name} has no [profile] in its card: nothing to profile")
    options.sp_size = case.profile["ranks"]
    options.scenario = options.scenario or case.profile["scenario"]
    if options.scenario not in case.scenarios:
        raise WorkspaceError(
            f"--scenario {options.scenario}: choose one of {', '.join(case.scenarios)}"
        )
    names = comma_list(options.trees, "--trees") if options.trees else list(case.trees)
    trees = upstream.trees(layout, names)
    options.device = environment.resolve_device(options.device, options.sp_size, trees[0].python)
    options.profiler = choose_profiler(options.profiler, options.device)
    notes = [
        f"{name}: not profiled, the series is empty (the patched tree would equal pinned)"
        for name in names
        if case.tree_name(name) not in {tree.label for tree in trees}
    ]
    staging = layout.new_run_dir("profile")
    (staging / "artifacts").mkdir()
    captures = [capture_with_fallback(layout, tree, staging, options, notes) for tree in trees]
    snippet = snippet_path(layout, case)
    outputs = {
        tree.label: run_snippet(
            layout, case, tree, staging / f"snippet-{tree.label}", options.device
        )
        for tree in (trees if snippet else ())
    }
    payload = {
        "environment": environment.describe(trees[0].python),
        "trees": upstream.describe_trees(layout, trees),
        "setting": {"scenario": options.scenario, "ranks": options.sp_size},
        "labels": {"measured": case.profile["measured"], "excluded": case.profile["excluded"]},
        "warmup_steps": options.warmup,
        "steps": options.steps,
        "notes": notes,
        "captures": captures,
        "snippet": {
            "file": snippet and snippet.name,
            "sha256": snippet and sha256(snippet),
            "output": outputs,
        },
    }
    result = publish(layout, payload, staging)
    shutil.rmtree(staging)
    table_headers, rows = summary_table(payload)
    print(table.text(table_headers, rows))
    for note in notes:
        print(f"note: {note}")
    folder = artifacts_dir(result).relative_to(layout.root)
    print(f"wrote {result.relative_to(layout.root)} and {folder}/", file=sys.stderr)


def main(argv: list[str]) -> int:
    options = parser().parse_args(argv)
    if options.warmup < 1 or options.steps < 1:
        raise WorkspaceError("--warmup and --steps must be at least 1: the first step is slow")
    for layout in case_layouts(options.case):
        if options.case == ALL_CASES and not cases.load(layout.root, layout.case).profile:
            log.info("case %s has no [profile] in its card: not profiled", layout.case)
            continue
        profile_case(layout, argparse.Namespace(**vars(options)))
    return 0
