"""The hunt's result: its setup, the known sites it read, and each tree's sites.

A tree's record (`HuntTree`) sits on the site layer, which the census shares.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from hostsync.detector.codec import Record
from hostsync.detector.sites import AllowRule
from hostsync.sites.records import HuntTree
from hostsync.workspace.records import Device, Result


@dataclass(frozen=True)
class HuntSetup(Record):
    world_size: int
    sp_size: int
    model: str
    device: Device
    backend: str
    versions: dict[str, str]


@dataclass(frozen=True)
class HuntResult(Result):
    KIND: ClassVar[str] = "hunt"
    DETECTED: ClassVar[bool] = True
    setup: HuntSetup
    allowlist: tuple[AllowRule, ...]
    trees: tuple[HuntTree, ...]

    @property
    def measured(self) -> tuple[HuntTree, ...]:
        return tuple(tree for tree in self.trees if tree.measured)
