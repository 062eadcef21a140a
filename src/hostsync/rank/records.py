"""What a rank returns, and the fork launcher's plan: the records of the rank side.

A rank writes a `RankReport` into its run folder. Its payload is read back with the record its
script returns (`ReproRank`, `ProfiledRank`). The fork launcher reads its plan (`ForkPlan`). Built
on the detector alone, so a rank imports nothing of the launcher's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hostsync.detector.codec import FLAT, OPTIONAL, Json, R, Record
from hostsync.detector.records import Cost
from hostsync.detector.sites import SiteCount

# --- what a rank returns -------------------------------------------------------------------------


@dataclass(frozen=True)
class RanOn(Record):
    """The node, and its host, that ran a rank of a world run across nodes."""

    node: int
    host: str


@dataclass(frozen=True)
class RankReport(Record):
    """What one rank returned, as `protocol.rank_entry` writes it into the run folder: its rank,
    the payload its script returned, which each command reads with its own record
    (`read`), and, once pooled across nodes, the node that ran it."""

    rank: int
    payload: dict[str, Json]
    ran_on: RanOn | None = field(default=None, metadata=OPTIONAL)

    def read(self, kind: type[R]) -> R:
        """The payload as the record `kind`, every field checked; a bad one names the rank."""
        return kind.from_json(self.payload, f"rank {self.rank}")


@dataclass(frozen=True)
class RankRow(Record):
    """One scenario as one rank's script reports it (`ReproRank`): the counts every case reports,
    typed (`host_syncs`, the reads no rule accepts, where the script counts them; `problems`;
    `cost`, where it accounts), its lists of sites by figure name (`site_lists`: the scope's
    `sync_sites()`, or sites the script picked), and the case's own figures (values, flags) as
    they are."""

    scenario: str
    host_syncs: int | None = field(default=None, metadata=OPTIONAL)
    problems: tuple[str, ...] = field(default=(), metadata=OPTIONAL)
    cost: Cost | None = field(default=None, metadata=OPTIONAL)
    site_lists: dict[str, tuple[SiteCount, ...]] = field(default_factory=dict, metadata=OPTIONAL)
    figures: dict[str, Json] = field(default_factory=dict, metadata=FLAT)


@dataclass(frozen=True)
class ReproRank(Record):
    """What a case's rank script returns to `repro`: one row per scenario asked, in order."""

    runs: tuple[RankRow, ...]


@dataclass(frozen=True)
class ProfiledRank(Record):
    """What a profile rank script returns (`rankkit.profiled_rank`): where the rank ran, the
    steps recorded, each measured range's seconds and its trace file (None under nsys, whose
    report is the record); `more`, the script's own figures."""

    rank: int
    world_size: int
    backend: str
    device: str  # the torch device the rank ran on, with its index (cuda:0)
    scenario: str
    warmup_steps: int
    steps: int
    range_seconds: tuple[float, ...]
    trace: str | None
    more: dict[str, Json] = field(default_factory=dict, metadata=FLAT)


# --- the fork launcher's plan --------------------------------------------------------------------


@dataclass(frozen=True)
class ForkWorld(Record):
    """One world the fork launcher runs: its rank count, run folder, arguments and variables."""

    ranks: int
    run_dir: str
    args: tuple[str, ...]
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ForkSnippet(Record):
    """The case's snippet, run after the worlds from the same interpreter, its output in `log`."""

    script: str
    log: str
    env: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ForkPlan(Record):
    """What `hostsync.rank.prefork` runs: the script it imports once, then each world of it, and
    the snippet; with `keep_going` a failed world does not stop the next ones."""

    script: str
    worlds: tuple[ForkWorld, ...]
    keep_going: bool = False
    snippet: ForkSnippet | None = None


@dataclass(frozen=True)
class ForkTree(Record):
    """One tree's plan in an interpreter the trees of one environment share: its `ForkPlan`, the
    tree's entries for the front of sys.path, its own variables, and where how it ended goes (a
    `SnippetExit`)."""

    plan: ForkPlan
    path: tuple[str, ...]
    env: dict[str, str]
    exit: str


@dataclass(frozen=True)
class SharedForkPlan(Record):
    """What `hostsync.rank.prefork` runs for trees of one environment: each in a fork of one
    interpreter that imported what their script imports before the project under test."""

    trees: tuple[ForkTree, ...]


@dataclass(frozen=True)
class SnippetExit(Record):
    """How a snippet, or a tree's plan in a shared interpreter, ended in a fork of the fork
    launcher's interpreter (`hostsync.rank.prefork`)."""

    exit_status: int
    seconds: float
