"""What the upstream side records: a clone's bookkeeping, an environment's build, a site's place.

`git` and `envs` leave side files for a later command (`GitState`, `EnvRecord`). `harness` says
where trees' tests/ came from (`UpstreamTests`). `presence` says whether a release's source
carries a site (`Presence`, `Finding`), which measure and history read.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from hostsync.detector.codec import OPTIONAL, Record
from hostsync.detector.sites import Site


class Presence(StrEnum):
    """Whether a release's source carries a site (see `hostsync.upstream.presence`): at the
    place its rule names, only elsewhere in the package, not there though the code it lies in
    is (absent), or not there because that code is not (missing: nothing a test could judge)."""

    PRESENT = "present"
    ELSEWHERE = "elsewhere"
    ABSENT = "absent"
    MISSING = "missing"

    @property
    def carried(self) -> bool:
        return self in (Presence.PRESENT, Presence.ELSEWHERE)


@dataclass(frozen=True)
class Finding(Record):
    """One site in one source tree: whether it is there, and where (each `Site`'s file from the
    tree's top, its function as `Class.method`)."""

    presence: Presence
    found: tuple[Site, ...] = ()


@dataclass(frozen=True)
class UpstreamTests(Record):
    """Where the tests/ of trees made from an sdist came from: the git repository the user
    named, the commit taken (the release's tag where it has it, else its newest commit), that
    commit's date, how many files its tests/ holds, and the origin of the trees they went into
    (each tree gets those it lacks)."""

    repository: str
    commit: str
    committed: str
    ref: str
    files: int
    tree_origin: str


@dataclass(frozen=True)
class GitState(Record):
    """The workspace's bookkeeping in a clone's or a tree's git dir (`upstream.git`): where the
    clone came from; the commit and the patches/ files (by sha256) it was last seen to match; an
    apply under way, or the patch that failed; the base commit the patches apply on, and a
    tree's patches; the test patches left out for want of upstream's tests."""

    origin: str = field(default="", metadata=OPTIONAL)
    head: str = field(default="", metadata=OPTIONAL)
    series: dict[str, str] = field(default_factory=dict, metadata=OPTIONAL)
    applying: bool = field(default=False, metadata=OPTIONAL)
    failed: str | None = field(default=None, metadata=OPTIONAL)
    base: str = field(default="", metadata=OPTIONAL)
    patches: dict[str, str] = field(default_factory=dict, metadata=OPTIONAL)
    upstream_tests: str = field(default="", metadata=OPTIONAL)  # the commit they came from
    left_out: tuple[str, ...] = field(default=(), metadata=OPTIONAL)


@dataclass(frozen=True)
class EnvRecord(Record):
    """What an environment under work/envs/ was built with (`upstream.envs`): its interpreter,
    relative to its folder (an older record's is absolute), the specs installed, and what that
    installed, by canonical name."""

    python: str
    specs: tuple[str, ...]
    installed: dict[str, str]
