"""Since when a site is upstream, and what the newest releases change: bisect and watch.

A bisect reads releases' sdists and narrows between them on git (`SiteHistory`). The watch puts
each case against its project's newest release (`CaseWatch`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import ClassVar

from hostsync.detector.codec import FLAT, OPTIONAL, Record
from hostsync.detector.sites import AllowRule
from hostsync.measure.records import CheckRecord, Judgement, ProbeVerdict
from hostsync.sites.records import HuntSite
from hostsync.upstream.records import Finding, Presence
from hostsync.workspace.records import Provenance, Result

# --- bisect --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReleaseEvidence(Record):
    """One release a bisect read: its sdist, the site's finding in it, and, where the case's
    tests could be run on it (`--tests`), their checks."""

    version: str
    uploaded: str
    sdist_sha256: str
    finding: Finding = field(metadata=FLAT)
    judged: tuple[CheckRecord, ...] = field(default=(), metadata=OPTIONAL)


@dataclass(frozen=True)
class CommitEvidence(Record):
    """One commit a narrowing read: the site's presence, and where it was run, the verdict."""

    commit: str
    date: str
    subject: str
    presence: Presence
    verdict: ProbeVerdict | None = field(default=None, metadata=OPTIONAL)


class Change(StrEnum):
    """What happened to a site between two releases."""

    ADDED = "added"
    REMOVED = "removed"
    READING = "made a device read"  # the line was there; its value became a device tensor


@dataclass(frozen=True)
class GitNarrowing(Record):
    """The commits between two releases, the site's state changing between them (the
    first-parent path of `older..newer`), bisected on presence down to the first commit in the
    newer state, and the pull request that commit names."""

    remote: str
    older: str
    newer: str
    change: Change
    commits: int
    probed: tuple[CommitEvidence, ...]
    first: CommitEvidence | None
    pull_request: int | None
    note: str = field(default="", metadata=OPTIONAL)


class Decided(StrEnum):
    """What a boundary of a site's history rests on."""

    TEXT = "text match"
    JUDGED = "judged run"


@dataclass(frozen=True)
class Boundary(Record):
    """Where a site's reads begin (`side` first) or end (last), between the releases `older`
    (None: the oldest searched) and `newer`, and how that was decided: a judged run on both
    sides, else the source's text (its syntax tree) alone, with the runs tried; `stated` is
    how a draft says it: the release and what it rests on."""

    side: str
    older: str | None
    newer: str
    decided: Decided
    stated: str
    judged: tuple[Judgement, ...] = ()


@dataclass(frozen=True)
class SiteHistory(Record):
    """Since which release a site is there, and until which: the releases searched (final
    ones with an sdist, oldest first), the one the search started from, the boundaries with
    their neighbours, and every release read."""

    project: str
    site: AllowRule
    searched: tuple[str, ...]
    anchor: str
    first: str
    last: str
    before_first: str | None
    after_last: str | None
    contiguous: bool
    notes: tuple[str, ...]
    releases: tuple[ReleaseEvidence, ...]
    narrowed: tuple[GitNarrowing, ...] = field(default=(), metadata=OPTIONAL)
    boundaries: tuple[Boundary, ...] = field(default=(), metadata=OPTIONAL)


@dataclass(frozen=True)
class BisectResult(Result):
    KIND: ClassVar[str] = "bisect"
    index: str
    sites: tuple[SiteHistory, ...]


# --- watch ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ProjectWatch(Record):
    """A project's newest release on the index against the release pin.toml installs, and
    (asked for) the sites the hunt finds in the newest that it does not find in the pinned."""

    project: str
    pinned: str
    newest: str
    uploaded: str
    newer: tuple[str, ...]
    hunt: str = field(default="", metadata=OPTIONAL)
    new_sites: tuple[HuntSite, ...] = field(default=(), metadata=OPTIONAL)


@dataclass(frozen=True)
class SiteWatch(Record):
    """One of a case's sites in its project's newest release; judged by running there when
    asked (`watch --tests`), as bisect --judge judges a release."""

    project: str
    version: str
    site: AllowRule
    finding: Finding = field(metadata=FLAT)
    judged: Judgement | None = field(default=None, metadata=OPTIONAL)


@dataclass(frozen=True)
class CaseWatch(Record):
    """One case against the newest releases: each of its sites in the newest release of its
    project, whether its series applies there, and (asked for) how its tests go there."""

    case: str
    project: str
    pinned: str
    newest: str
    provenance: Provenance
    fixed: str | None
    sites: tuple[SiteWatch, ...]
    series: str
    tests: tuple[CheckRecord, ...] = field(default=(), metadata=OPTIONAL)


@dataclass(frozen=True)
class WatchResult(Result):
    KIND: ClassVar[str] = "watch"
    index: str
    projects: tuple[ProjectWatch, ...]
    cases: tuple[CaseWatch, ...]
