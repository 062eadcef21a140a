"""The records every layer's results share, and the words cards and records use.

A result file is a frozen dataclass (`Result`), so its producer, its readers and its file agree
on one shape. `to_json()` gives the document. `from_json(data)` checks each field's type and
raises `RecordError` naming the field (`runs[3].ranks: ...`); `results.read` adds the file. The
schema version is written into every result file.

Each layer keeps its own records in its `records.py`, and each result kind there registers in
`KINDS`. What a case decides the shape of (a rank script's figures, a card's columns) stays JSON
(`Json`); everything the engine itself reads is typed. Built on `hostsync.detector.codec`
alone, so every other module can import it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from datetime import UTC, datetime
from enum import StrEnum
from typing import ClassVar

from hostsync.detector.codec import FLAT, OPTIONAL, Json, Record

SCHEMA_VERSION = 4


# --- the words cards and records share -----------------------------------------------------------


class Device(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


class Launcher(StrEnum):
    """How a case's reproducer, or a scanned script, starts its ranks (see
    `hostsync.launch.launchers`)."""

    PYTHON = "python"
    FORK = "fork"
    TORCHRUN = "torchrun"
    ACCELERATE = "accelerate"
    DEEPSPEED = "deepspeed"


class TreeRole(StrEnum):
    """What a tree under test is to its case: its pinned release, that release with the case's
    series, upstream's fixed release, or another release."""

    PINNED = "pinned"
    PATCHED = "patched"
    FIXED = "fixed"
    RELEASE = "release"


class UpstreamState(StrEnum):
    """What upstream knows of a case's bug; it decides which drafts a case sends."""

    NONE = "none"
    ISSUE = "issue"
    OPEN_PR = "open-pr"
    FIXED = "fixed"


class PrChangeSource(StrEnum):
    """Where the patch carrying an open PR's own change was taken from: the PR's diff, or its
    description where no diff is on record (the figures then hold only while the two match)."""

    DIFF = "diff"
    DESCRIPTION = "description"


class ThreadKind(StrEnum):
    """What an upstream thread a card cites is."""

    ISSUE = "issue"
    PR = "pr"


class ThreadState(StrEnum):
    """Where an upstream thread stood when it was read; only a PR is merged."""

    OPEN = "open"
    CLOSED = "closed"
    MERGED = "merged"


class Precision(StrEnum):
    FP32 = "fp32"
    BF16 = "bf16"
    FP16 = "fp16"


# --- what every result file holds ----------------------------------------------------------------


@dataclass(frozen=True)
class Provenance(Record):
    """The inputs a result depends on, by sha256: when one changes, the result is stale.
    `case_sha256` is the card less its `[upstream]` table (`provenance.card_digest`);
    `detector_sha256` is the detector and its op table (`provenance.detector_digest`), which
    decide what a measuring result counts; "" in a result that recorded none."""

    pin_sha256: str
    case_sha256: str
    patches: dict[str, str]
    scripts: dict[str, str]
    detector_sha256: str = field(default="", metadata=OPTIONAL)


@dataclass(frozen=True)
class Stamp(Record):
    """Who made a result, when, from what: the keys every result file starts with."""

    created: str
    command: str
    case: str
    provenance: Provenance

    @classmethod
    def now(cls, command: str, case: str, provenance: Provenance) -> Stamp:
        created = datetime.now(UTC).replace(microsecond=0)
        return cls(created.isoformat().replace("+00:00", "Z"), command, case, provenance)

    @property
    def time(self) -> datetime:
        return datetime.fromisoformat(self.created.replace("Z", "+00:00"))


# Every result kind by its name, as the records module of its layer defines it.
KINDS: dict[str, type[Result]] = {}


@dataclass(frozen=True)
class Result(Record):
    """A result file: its stamp at the top level, then what its kind measured. `DETECTED`: its
    figures are what the detector counted, so another detector makes it stale."""

    KIND: ClassVar[str] = ""
    # What writes this kind of result, so what replaces a bad one; most kinds have a session.
    MADE_BY: ClassVar[str] = ""
    DETECTED: ClassVar[bool] = False
    stamp: Stamp = field(metadata=FLAT)

    def __init_subclass__(cls) -> None:
        """A kind registers under its name."""
        super().__init_subclass__()
        KINDS[cls.KIND] = cls

    @classmethod
    def made_by(cls) -> str:
        return cls.MADE_BY or f"`nox -s {cls.KIND}`"

    def document(self) -> dict[str, Json]:
        return {"kind": self.KIND, "schema": SCHEMA_VERSION, **self.to_json()}


@dataclass(frozen=True)
class Environment(Record):
    """What an interpreter offers: Python, the installed versions of the packages the
    projects name, the device and platform. The packages sit at the top level in the file."""

    python: str
    packages: dict[str, str] = field(metadata=FLAT)
    platform: str
    device: str  # the first GPU's name, or cpu
    device_count: int
    devices: tuple[str, ...] = field(default=(), metadata=OPTIONAL)

    def with_devices(self, devices: list[str]) -> Environment:
        """This environment, naming the devices a run used."""
        return dataclasses.replace(self, devices=tuple(devices))

    @property
    def versions(self) -> dict[str, str]:
        """Python and the packages: what a report lists as the versions it ran with."""
        return {"python": self.python, **self.packages}


@dataclass(frozen=True)
class TreeInfo(Record):
    """What a result file says of a tree it measured."""

    project: str
    version: str
    commit: str
    origin: str
    src: str


@dataclass(frozen=True)
class NodeShare(Record):
    """Per-node provenance of a world run across nodes: which node, on which host, ran which of
    its ranks (global RANKs: torchrun's c10d rendezvous orders the nodes itself)."""

    world: str
    node_rank: int
    host: str
    ranks: tuple[int, ...]


# --- side files: what one process leaves for another ---------------------------------------------


@dataclass(frozen=True)
class LockHolder(Record):
    """Who holds a case's lock, as it wrote itself into the lock file (`locks`)."""

    pid: int
    command: str
    since: str
