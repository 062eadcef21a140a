"""What a host wait costs: the device work queued before it, and the idle window after it, per
site and per measured region.

The detector writes these; the workspace's records compose them into its results.
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from dataclasses import dataclass, field
from itertools import zip_longest

from hostsync.detector.codec import FLAT, OPTIONAL, Record
from hostsync.detector.sites import Site


@dataclass(frozen=True)
class DeviceWork(Record):
    """What a GPU would run on its streams: kernels launched (collectives among them, counted
    as NCCL's would be), the bytes they read and write, their FLOPs (torch.utils.flop_counter's
    formulas; 0 for operators it has none for)."""

    kernels: int = 0
    collectives: int = 0
    bytes: int = 0
    flops: int = 0

    def __add__(self, other: DeviceWork) -> DeviceWork:
        return DeviceWork(*(a + b for a, b in zip(self.figures, other.figures, strict=True)))

    def __sub__(self, other: DeviceWork) -> DeviceWork:
        return DeviceWork(*(a - b for a, b in zip(self.figures, other.figures, strict=True)))

    @property
    def figures(self) -> tuple[int, int, int, int]:
        return (self.kernels, self.collectives, self.bytes, self.flops)

    @property
    def queued(self) -> bool:
        """Whether a device would have anything to run, so that a read waits for it."""
        return self.kernels > 0


@dataclass(frozen=True)
class HostSpan(Record):
    """A statement the host reached inside idle windows (`file:line`), and the host time, in
    microseconds, that ran before it got there."""

    statement: str
    us: float


@dataclass(frozen=True)
class Idle(Record):
    """The idle windows after a site's draining waits: host time, in microseconds on the CPU
    that measured it, from the wait's return to the next kernel launch, the detector's own time
    taken out. A GPU has nothing to run during it. `lines`: where that time went, the three
    statements that took most of it."""

    windows_us: tuple[float, ...] = ()
    lines: tuple[HostSpan, ...] = ()

    @property
    def median_us(self) -> float:
        return statistics.median(self.windows_us) if self.windows_us else 0.0

    @property
    def spread_us(self) -> tuple[float, float]:
        """The shortest and the longest window."""
        return (min(self.windows_us), max(self.windows_us)) if self.windows_us else (0.0, 0.0)

    def __add__(self, other: Idle) -> Idle:
        return Idle(self.windows_us + other.windows_us, top_lines((*self.lines, *other.lines)))


def top_lines(spans: Iterable[HostSpan], keep: int = 3) -> tuple[HostSpan, ...]:
    """The statements that took the most host time, each once, most first."""
    totals: dict[str, float] = {}
    for span in spans:
        totals[span.statement] = totals.get(span.statement, 0.0) + span.us
    ranked = sorted(totals.items(), key=lambda item: (-item[1], item[0]))[:keep]
    return tuple(HostSpan(statement, round(us, 1)) for statement, us in ranked)


@dataclass(frozen=True)
class SiteCost(Record):
    """One source line's host waits (reads and blocking copies to the device), how many
    stalled (device work was queued since the host last waited), the device work those stalls
    waited for, and the idle windows after them."""

    site: Site = field(metadata=FLAT)
    reads: int
    stalls: int
    waited_for: DeviceWork
    idle: Idle = field(default=Idle(), metadata=OPTIONAL)


@dataclass(frozen=True)
class Cost(Record):
    """A measured region's host waits, stalls and device work, over `steps` steps, and the
    idle windows of each step, summed (`idle_us`, one figure per optimizer step seen, or one
    for the region when it saw none)."""

    steps: int
    reads: int
    stalls: int
    work: DeviceWork
    sites: tuple[SiteCost, ...] = ()
    idle_us: tuple[float, ...] = field(default=(), metadata=OPTIONAL)

    def __add__(self, other: Cost) -> Cost:
        """Two ranks' (or regions') costs together, over the same steps: their idle time adds
        up step by step, as every device's idle time does."""
        paired = zip_longest(self.idle_us, other.idle_us, fillvalue=0.0)
        idle = tuple(round(a + b, 1) for a, b in paired)
        return Cost(
            self.steps,
            self.reads + other.reads,
            self.stalls + other.stalls,
            self.work + other.work,
            self.sites + other.sites,
            idle,
        )

    @staticmethod
    def in_sequence(costs: Iterable[Cost]) -> Cost:
        """Regions measured one after another (a step each): their steps and figures add up, their
        idle time per step is kept step by step."""
        total = Cost(0, 0, 0, DeviceWork())
        for cost in costs:
            total = Cost(
                total.steps + cost.steps,
                total.reads + cost.reads,
                total.stalls + cost.stalls,
                total.work + cost.work,
                total.sites + cost.sites,
                total.idle_us + cost.idle_us,
            )
        return total
