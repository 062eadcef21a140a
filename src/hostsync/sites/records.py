"""What ranks record of a step's sites, and a tree's sites over its ranks and steps.

The hunt, the census, the scan and the watch read these and never one another, so the records
they share sit on the site layer. A rank returns its steps (`HuntStep`, in a `TrainerRank`).
`summary` sums them into a tree's sites (`HuntSite`, `HuntTree`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hostsync.detector.codec import FLAT, OPTIONAL, Record
from hostsync.detector.records import Cost, Idle
from hostsync.detector.sites import Site
from hostsync.workspace.records import Device, NodeShare, TreeInfo

# --- what a rank records of a step ---------------------------------------------------------------


@dataclass(frozen=True)
class StepSite(Record):
    """A sync site of one hunted step on one rank: the kind of wait, where, which function
    called it (a read in a shared helper is paid for by its caller), how often, and how many of
    those stalled."""

    kind: str
    site: Site = field(metadata=FLAT)
    caller: str
    count: int
    stalls: int


@dataclass(frozen=True)
class HuntStep(Record):
    """One optimizer step under the detector, on one rank: whether it is the warm-up or logs,
    its sites, its cost, and the reads of host memory (no wait on a GPU)."""

    step: int
    warmup: bool
    logging: bool
    sites: tuple[StepSite, ...]
    cost: Cost
    host_reads: int


@dataclass(frozen=True)
class ProfiledRead(Record):
    """Scalar reads the PyTorch profiler saw in the profiled step: the Python function that led
    to them and, where it was not a plain `.item()`, the kernel they were made in (`via`)."""

    step: int
    logging: bool
    file: str
    function: str
    via: str | None
    count: int


@dataclass(frozen=True)
class HuntRecording(Record):
    """What one rank of a hunted run recorded: its detected steps, the profiled step's reads,
    and, where its steps ran compiled, why they were not judged."""

    steps: tuple[HuntStep, ...]
    profiled: tuple[ProfiledRead, ...]
    not_judged: str | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class LoggedStep(Record):
    """What the Trainer (or the loop) logged at one optimizer step."""

    loss: float
    grad_norm: float | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class TrainerRank(Record):
    """What one rank of the engine's Trainer worker (`rank/workers/trainer.py`) returns: the
    groups it formed, where it ran, the model, what it logged by step, its seconds, and, when
    hunting, what it recorded."""

    world_size: int
    sp_size: int
    device: Device
    backend: str
    model: str
    logged: dict[str, LoggedStep]
    seconds: float
    hunt: HuntRecording | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class HuntRank(Record):
    """One rank's hunt record as a hunt or census result keeps it: its rank, where it ran, the
    model, and what it recorded."""

    rank: int
    device: Device
    backend: str
    model: str
    hunt: HuntRecording = field(metadata=FLAT)


# --- a tree's sites ------------------------------------------------------------------------------


@dataclass(frozen=True)
class HuntPlan(Record):
    """Which steps the detector watched, which one the profiler watched, and its twin."""

    steps: int
    logging_steps: int
    profile: int
    twin: int


@dataclass(frozen=True)
class HuntSite(Record):
    """One host-sync site of a hunted tree, from one caller, over all ranks and steps, with its
    verdict."""

    package: str
    site: Site = field(metadata=FLAT)
    caller: str
    kinds: tuple[str, ...]
    steps: tuple[int, ...]
    when: str
    per_step: int
    rate: float
    carried: str | None
    allowed: str | None
    # Of `rate`, the reads that stalled: device work was queued since the host last waited.
    stall_rate: float = field(default=0.0, metadata=OPTIONAL)
    # The idle windows after the site's stalls in the steady steps, every rank's; `idle_rate`
    # their sum per rank per step (microseconds of host time, measured on CPU).
    idle: Idle = field(default=Idle(), metadata=OPTIONAL)
    idle_rate: float = field(default=0.0, metadata=OPTIONAL)

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What names a hunted site across releases: its site's identity and its caller, as a
        read inside a shared helper is paid by each caller, and each is judged on its own."""
        return (*self.site.identity, self.caller)


@dataclass(frozen=True)
class ProfilerOnly(Record):
    """Scalar reads the profiler saw beyond what the detector saw in the same function."""

    package: str
    file: str
    function: str
    via: str
    count: int
    ranks: tuple[int, ...]


@dataclass(frozen=True)
class CrossCheck(Record):
    rank: int
    profiler: int
    detector: int


@dataclass(frozen=True)
class HuntTree(Record):
    """One tree in one DeepSpeed setup: its sites, or why it could not be measured."""

    label: str
    tree: str
    setup: str
    info: TreeInfo = field(metadata=FLAT)
    stacked: tuple[str, ...]
    seconds: float
    error: str | None = field(default=None, metadata=OPTIONAL)
    # Why its steps were not judged though it ran (a torch.compile'd region): no sites then.
    not_judged: str | None = field(default=None, metadata=OPTIONAL)
    plan: HuntPlan | None = field(default=None, metadata=OPTIONAL)
    sites: tuple[HuntSite, ...] = ()
    profiler_only: tuple[ProfilerOnly, ...] = ()
    cross_check: tuple[CrossCheck, ...] = ()
    ranks: tuple[HuntRank, ...] = ()
    nodes: tuple[NodeShare, ...] = field(default=(), metadata=OPTIONAL)
    # Reads, stalls and device work over every rank's steps after the warm-up.
    cost: Cost | None = field(default=None, metadata=OPTIONAL)

    @property
    def measured(self) -> bool:
        return self.error is None and self.not_judged is None
