"""What a host read costs: the device work queued before it, per site and per measured region.

The detector writes these; the workspace's records compose them into its results.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hostsync.detector.codec import FLAT, Record
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
class SiteCost(Record):
    """One source line's host reads, how many stalled (device work was queued since the host
    last waited), and the device work those stalls waited for."""

    site: Site = field(metadata=FLAT)
    reads: int
    stalls: int
    waited_for: DeviceWork


@dataclass(frozen=True)
class Cost(Record):
    """A measured region's host reads, stalls and device work, over `steps` steps."""

    steps: int
    reads: int
    stalls: int
    work: DeviceWork
    sites: tuple[SiteCost, ...] = ()

    def __add__(self, other: Cost) -> Cost:
        """Two ranks' (or regions') costs together, over the same steps."""
        return Cost(
            self.steps,
            self.reads + other.reads,
            self.stalls + other.stalls,
            self.work + other.work,
            self.sites + other.sites,
        )
