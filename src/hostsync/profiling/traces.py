"""Reading what a profiler recorded: a rank's Chrome trace, or events made of `nsys stats` tables.

The figures come from the traces themselves: per step, inside the range
`protocol.MEASURED_RANGE`, the calls of `aten::_local_scalar_dense` (the host read every
`if t > 0`, `max(t, 1)` and `.item()` becomes), `aten::item` and `aten::is_nonzero`, the share of
the part measured apart (`protocol.EXCLUDED_RANGE`); the range's wall time; on CUDA the
device-to-host copies the range launched, their bytes, the synchronising CUDA calls
(`CUDA_CALLS`), and how long the GPU sat idle inside the range.
"""

from __future__ import annotations

import gzip
import json
import statistics
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import NamedTuple

from hostsync.errors import WorkspaceError
from hostsync.protocol import EXCLUDED_RANGE, MEASURED_RANGE, SYNC_OP, SYNC_OPS
from hostsync.records import StepFigures, Timeline

# The CUDA calls that make the host wait for the device (a copy to pageable host memory waits
# too, whichever call queued it).
CUDA_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaMemcpy")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cpu_op", "cuda_runtime", "cuda_driver")


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


# --- reading a trace ---------------------------------------------------------------------------


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
    gpu = any(e.get("cat") in GPU_CATEGORIES for e in events)
    return analyse_events(events, cuda=bool(trace.get("deviceProperties")) or gpu)


def analyse_events(events: list[dict], cuda: bool) -> list[dict]:
    """The figures of each measured step in one rank's complete events; `cuda`: the recording
    watched CUDA (else its CUDA figures are None, not 0)."""
    steps = windows(events, MEASURED_RANGE)
    if not steps:
        raise WorkspaceError(
            f"the trace has no {MEASURED_RANGE!r} range: was it recorded by a profile script?"
        )
    forwards = windows(events, EXCLUDED_RANGE)
    host = [e for e in events if e.get("cat") in HOST_CATEGORIES]
    gpu = [e for e in events if e.get("cat") in GPU_CATEGORIES]
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


# --- a capture: the ranks' steps combined --------------------------------------------------------


def combine_ranks(per_rank_steps: list[list[dict]]) -> StepFigures:
    """Per-step figures of one capture: counts as the largest over ranks of each rank's mean per
    step (a step waits for its slowest rank), times as the median over every rank's steps; the
    timeline is rank 0's median step."""

    def largest(value: Callable[[dict], float | None]) -> float | None:
        if value(per_rank_steps[0][0]) is None:
            return None
        return tidy(max(statistics.fmean(map(value, steps)) for steps in per_rank_steps))

    def median(value: Callable[[dict], float | None]) -> float | None:
        values = [value(step) for steps in per_rank_steps for step in steps]
        return None if None in values else round(statistics.median(values), 3)

    def counts(key: str, names: Sequence[str]) -> dict | None:
        if per_rank_steps[0][0][key] is None:
            return None
        return {name: largest(lambda step, name=name: step[key][name]) for name in names}

    rank0 = sorted(per_rank_steps[0], key=lambda step: step["range_ms"])
    typical = rank0[len(rank0) // 2]
    return StepFigures(
        range_ms=median(lambda step: step["range_ms"]),
        ops=counts("ops", SYNC_OPS),
        ops_in_forward=counts("ops_in_forward", SYNC_OPS),
        cuda_calls=counts("cuda_calls", CUDA_CALLS),
        dtoh_copies=largest(lambda step: step["dtoh_copies"]),
        dtoh_bytes=largest(lambda step: step["dtoh_bytes"]),
        gpu_idle_ms=median(lambda step: step["gpu_idle_ms"]),
        timeline=Timeline.from_json(typical["timeline"] | {"range_ms": typical["range_ms"]}),
    )


def tidy(value: float) -> float | int:
    """A whole number as an int: counts per step read as counts."""
    return int(value) if float(value).is_integer() else round(value, 3)
