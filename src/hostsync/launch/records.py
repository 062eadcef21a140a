"""The launch side's records: a node's note, and the Trainer's loss with SP and without.

`nodes` leaves a `NodeNote` beside its share of a world's rank files. `trainer_step` compares
the Trainer's loss with SP against the same training without, for repro (`TrainerComparison`).
"""

from __future__ import annotations

from dataclasses import dataclass

from hostsync.detector.codec import Record
from hostsync.workspace.records import Device


@dataclass(frozen=True)
class NodeNote(Record):
    """What a node leaves beside its share of a world's rank files (`nodes`): which node, on
    which host, ran which ranks of which world, or why it has no results."""

    node: int
    host: str
    world: str
    ranks: tuple[int, ...]
    failure: str | None = None


@dataclass(frozen=True)
class TrainerComparison(Record):
    """The full Trainer path's per-step loss with SP against the same training without."""

    tree: str
    steps: int
    sp_size: int
    device: Device
    sp: tuple[float, ...]
    sp_ranks_agree: bool
    no_sp: tuple[float, ...]
    abs_diff: tuple[float, ...]
    max_abs_diff: float
    grad_norm: dict[str, tuple[float | None, ...]]
