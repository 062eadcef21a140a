"""A profile's records, and the GPU evidence measured with the profiling's tools.

A `ProfileResult` holds one `Capture` per tree: the PyTorch profiler's figures per step, or
nsys's. A `GpuResult` is the `gpu/` script's run on a GPU machine, which the drafts cite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hostsync.detector.codec import OPTIONAL, Record, RecordError
from hostsync.workspace.records import Environment, NodeShare, Result, TreeInfo

# --- profile -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProfiledScenario(Record):
    """The card's scenario a profile measured, and on how many ranks."""

    scenario: str
    ranks: int


@dataclass(frozen=True)
class RegionLabels(Record):
    """The card's words for the measured range and the part of it measured apart."""

    measured: str
    excluded: str


@dataclass(frozen=True)
class Timeline(Record):
    """One step drawn: spans and marks in ms from the start of its measured range."""

    forward_ms: tuple[tuple[float, ...], ...]
    sync_ms: tuple[float, ...]
    gpu_busy_ms: tuple[tuple[float, ...], ...] | None
    dtoh_ms: tuple[float, ...] | None
    range_ms: float | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class StepFigures(Record):
    """What the PyTorch profiler saw inside one measured range (None: not on this device)."""

    range_ms: float
    ops: dict[str, float]
    ops_in_forward: dict[str, float]
    cuda_calls: dict[str, float] | None
    dtoh_copies: float | None
    dtoh_bytes: float | None
    gpu_idle_ms: float | None
    timeline: Timeline


@dataclass(frozen=True)
class NsysFigures(Record):
    """What `nsys stats` reports inside the measured ranges, per step (the largest over ranks of
    each rank's mean, as `StepFigures`); `ranges`: the measured ranges it saw over all ranks,
    `steps`: the most of one rank."""

    cuda_calls: dict[str, float]
    dtoh_copies: float
    dtoh_bytes: float
    range_ms: float
    ranges: int
    steps: int


@dataclass(frozen=True)
class Capture(Record):
    """One tree's profiled run: its per-step figures (PyTorch profiler) or nsys's."""

    tree: str
    version: str
    commit: str
    backend: str
    world_size: int
    device: str  # its first rank's, as `ProfiledRank` has it
    profiler: str
    command: str
    wall_s: float
    artifacts: tuple[str, ...]
    per_step: StepFigures | None = field(default=None, metadata=OPTIONAL)
    nsys: NsysFigures | None = field(default=None, metadata=OPTIONAL)
    nsys_version: str | None = field(default=None, metadata=OPTIONAL)
    nodes: tuple[NodeShare, ...] = field(default=(), metadata=OPTIONAL)

    @property
    def figures(self) -> StepFigures | NsysFigures:
        """The figures it holds: the PyTorch profiler's, else nsys's."""
        figures = self.per_step or self.nsys
        if figures is None:
            raise RecordError("per_step", "a capture holds the profiler's figures or nsys's")
        return figures


@dataclass(frozen=True)
class ProfileResult(Result):
    KIND: ClassVar[str] = "profile"
    environment: Environment
    trees: dict[str, TreeInfo]
    setting: ProfiledScenario
    labels: RegionLabels
    warmup_steps: int
    steps: int
    notes: tuple[str, ...]
    captures: tuple[Capture, ...]

    @property
    def on_gpu(self) -> bool:
        return any(c.device.startswith("cuda") for c in self.captures)


# --- GPU evidence --------------------------------------------------------------------------------


@dataclass(frozen=True)
class GpuTreeFigures(Record):
    """One tree's measured call on a GPU, per step: the host reads (PyTorch profiler), the
    device-to-host copies and synchronising CUDA calls it launched (CUDA profiler), the warnings
    of `torch.cuda.set_sync_debug_mode("warn")`, and Nsight Systems' count where it ran; for a
    case's profiled step, its wall time (CUDA events) and the GPU's idle time between kernels,
    medians in ms. The GPU's figures are None from a dry run on a CPU."""

    tree: str
    version: str
    host_reads: float
    dtoh_copies: float | None
    dtoh_bytes: float | None
    cuda_calls: dict[str, float] | None
    sync_warnings: float | None
    nsys: NsysFigures | None = field(default=None, metadata=OPTIONAL)
    step_ms: float | None = field(default=None, metadata=OPTIONAL)
    gpu_idle_ms: float | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class GpuResult(Result):
    """A case's call measured on one GPU (`gpu/case_on_gpu.py`), for the drafts' GPU evidence."""

    KIND: ClassVar[str] = "gpu"
    MADE_BY: ClassVar[str] = "`measure` of the `gpu/` script on a GPU machine"
    device: str  # the GPU's name, or cpu for a dry run
    torch: str
    dry_run: bool
    warmup_steps: int
    steps: int
    trees: dict[str, TreeInfo]
    figures: tuple[GpuTreeFigures, ...]
