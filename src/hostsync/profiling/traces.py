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
from dataclasses import replace
from pathlib import Path
from typing import NamedTuple

from hostsync.detector.codec import Json
from hostsync.profiling.records import StepFigures, Timeline
from hostsync.rank.protocol import EXCLUDED_RANGE, MEASURED_RANGE, SYNC_OP, SYNC_OPS
from hostsync.workspace.errors import WorkspaceError

# The CUDA calls that make the host wait for the device (a copy to pageable host memory waits
# too, whichever call queued it).
CUDA_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaMemcpy")
GPU_CATEGORIES = ("kernel", "gpu_memcpy", "gpu_memset")
HOST_CATEGORIES = ("cpu_op", "cuda_runtime", "cuda_driver")


class TraceEvent(NamedTuple):
    """One complete event of a Chrome trace, or of the `nsys stats` tables made into one, as the
    figures read it (trace microseconds): `correlation` ties a CUDA call to the GPU work it
    launched, `bytes` is a copy's size."""

    name: str
    cat: str | None
    pid: int
    tid: int
    ts: float
    dur: float
    correlation: int | None = None
    bytes: int = 0


class Window(NamedTuple):
    """One occurrence of a named range on one host thread, in trace microseconds."""

    pid: int
    tid: int
    start: float
    end: float

    def holds(self, event: TraceEvent) -> bool:
        return (
            (event.pid, event.tid) == (self.pid, self.tid)
            and self.start <= event.ts
            and event.ts + event.dur <= self.end
        )


# --- reading a trace ---------------------------------------------------------------------------


def load_trace(path: Path) -> Json:
    """A Chrome trace file as its JSON document."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as trace:
        return json.load(trace)


def windows(events: Sequence[TraceEvent], name: str) -> list[Window]:
    found = [e for e in events if e.cat == "user_annotation" and e.name == name]
    return sorted(Window(e.pid, e.tid, e.ts, e.ts + e.dur) for e in found)


def analyse_trace(trace: Json) -> list[StepFigures]:
    """The figures of each measured step of one rank's Chrome trace document (times in ms)."""
    events = [
        TraceEvent(
            name=e.get("name"),
            cat=e.get("cat"),
            pid=e.get("pid"),
            tid=e.get("tid"),
            ts=e.get("ts"),
            dur=e.get("dur", 0),
            correlation=e.get("args", {}).get("correlation"),
            bytes=int(e.get("args", {}).get("bytes", 0)),
        )
        for e in trace["traceEvents"]
        if e.get("ph") == "X"
    ]
    gpu = any(e.cat in GPU_CATEGORIES for e in events)
    return analyse_events(events, cuda=bool(trace.get("deviceProperties")) or gpu)


def analyse_events(events: list[TraceEvent], cuda: bool) -> list[StepFigures]:
    """The figures of each measured step in one rank's complete events; `cuda`: the recording
    watched CUDA (else its CUDA figures are None, not 0)."""
    steps = windows(events, MEASURED_RANGE)
    if not steps:
        raise WorkspaceError(
            f"the trace has no {MEASURED_RANGE!r} range: was it recorded by a profile script?"
        )
    forwards = windows(events, EXCLUDED_RANGE)
    host = [e for e in events if e.cat in HOST_CATEGORIES]
    gpu = [e for e in events if e.cat in GPU_CATEGORIES]
    return [step_figures(step, forwards, host, gpu if cuda else None) for step in steps]


def step_figures(
    step: Window, forwards: list[Window], host: list[TraceEvent], gpu: list[TraceEvent] | None
) -> StepFigures:
    """What one step's range holds; `gpu` is None on a CPU-only trace."""
    inside = [e for e in host if step.holds(e)]
    in_forward = [e for e in inside if any(f.holds(e) for f in forwards)]

    def ms(us: float) -> float:
        """Trace microseconds as milliseconds from the start of the range."""
        return round((us - step.start) / 1000, 3)

    range_ms = round((step.end - step.start) / 1000, 3)
    timeline = Timeline(
        forward_ms=tuple((ms(f.start), ms(f.end)) for f in forwards if _within(f, step)),
        sync_ms=tuple(ms(e.ts) for e in inside if e.name == SYNC_OP),
        gpu_busy_ms=None,
        dtoh_ms=None,
        range_ms=range_ms,
    )
    figures = StepFigures(
        range_ms=range_ms,
        ops=_count(inside, SYNC_OPS),
        ops_in_forward=_count(in_forward, SYNC_OPS),
        cuda_calls=None,
        dtoh_copies=None,
        dtoh_bytes=None,
        gpu_idle_ms=None,
        timeline=timeline,
    )
    if gpu is None:
        return figures
    launched = {e.correlation for e in inside if e.correlation is not None}
    dtoh = [
        e for e in gpu if e.cat == "gpu_memcpy" and "DtoH" in e.name and e.correlation in launched
    ]
    busy = busy_intervals(gpu, step.start, step.end)
    drawn = replace(
        timeline,
        gpu_busy_ms=tuple((ms(a), ms(b)) for a, b in busy),
        dtoh_ms=tuple(ms(e.ts) for e in dtoh),
    )
    return replace(
        figures,
        cuda_calls=_count(inside, CUDA_CALLS),
        dtoh_copies=len(dtoh),
        dtoh_bytes=sum(e.bytes for e in dtoh),
        gpu_idle_ms=round((step.end - step.start - sum(b - a for a, b in busy)) / 1000, 3),
        timeline=drawn,
    )


def busy_intervals(gpu: list[TraceEvent], start: float, end: float) -> list[tuple[float, float]]:
    """The union of the GPU's activity (any stream) clipped to [start, end]."""
    spans = sorted(
        (max(e.ts, start), min(e.ts + e.dur, end))
        for e in gpu
        if e.ts < end and e.ts + e.dur > start
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


def _count(events: list[TraceEvent], names: Sequence[str]) -> dict[str, float]:
    counts = Counter(e.name for e in events if e.name in names)
    return {name: counts[name] for name in names}


# --- a capture: the ranks' steps combined --------------------------------------------------------


def combine_ranks(per_rank_steps: list[list[StepFigures]]) -> StepFigures:
    """Per-step figures of one capture: counts as the largest over ranks of each rank's mean per
    step (a step waits for its slowest rank), times as the median over every rank's steps; the
    timeline is rank 0's median step. The GPU's figures are every step's or none."""

    def largest(value: Callable[[StepFigures], float]) -> float:
        return tidy(max(statistics.fmean(map(value, steps)) for steps in per_rank_steps))

    def median(value: Callable[[StepFigures], float]) -> float:
        return round(statistics.median(value(s) for steps in per_rank_steps for s in steps), 3)

    def entry(of: Callable[[StepFigures], dict[str, float]], name: str) -> float:
        return largest(lambda step: of(step)[name])

    def counts(
        of: Callable[[StepFigures], dict[str, float]], names: Sequence[str]
    ) -> dict[str, float]:
        return {name: entry(of, name) for name in names}

    rank0 = sorted(per_rank_steps[0], key=lambda step: step.range_ms)
    typical = rank0[len(rank0) // 2]
    gpu = typical.gpu_idle_ms is not None
    return StepFigures(
        range_ms=median(lambda step: step.range_ms),
        ops=counts(lambda step: step.ops, SYNC_OPS),
        ops_in_forward=counts(lambda step: step.ops_in_forward, SYNC_OPS),
        cuda_calls=counts(lambda step: step.cuda_calls or {}, CUDA_CALLS) if gpu else None,
        dtoh_copies=largest(lambda step: step.dtoh_copies or 0) if gpu else None,
        dtoh_bytes=largest(lambda step: step.dtoh_bytes or 0) if gpu else None,
        gpu_idle_ms=median(lambda step: step.gpu_idle_ms or 0) if gpu else None,
        timeline=typical.timeline,
    )


def tidy(value: float) -> float | int:
    """A whole number as an int: counts per step read as counts."""
    return int(value) if float(value).is_integer() else round(value, 3)
