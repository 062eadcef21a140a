"""What a site is to us: its disposition. Every report that lists sites says it in these words.

A site is carried by a case, accepted by design, read and not carried, or a candidate. Reports
match the known sites again when they render. So a rule added since the run needs no new run.
What the run itself matched (`HuntSite.carried`, `allowed`) comes first.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from hostsync.sites.known import NONE_KNOWN, KnownSites, load_known_sites, reason
from hostsync.sites.records import HuntSite
from hostsync.workspace.layout import Layout


class Disposition(StrEnum):
    """What a site is to us."""

    CARRIED = "carried"
    ACCEPTED = "accepted"
    NOT_CARRIED = "not carried"
    CANDIDATE = "candidate"


@dataclass(frozen=True)
class Disposed:
    """A site with its disposition and why. `why` is the case carrying it, or the rule's reason;
    a candidate has none."""

    hunted: HuntSite
    disposition: Disposition
    why: str = ""

    def __str__(self) -> str:
        said = {
            Disposition.CARRIED: f"carried by case {self.why}",
            Disposition.ACCEPTED: f"accepted: {self.why}",
            Disposition.NOT_CARRIED: f"not carried: {self.why}",
            Disposition.CANDIDATE: Disposition.CANDIDATE.value,
        }
        return said[self.disposition]


def disposed(hunted: HuntSite, known: KnownSites = NONE_KNOWN) -> Disposed:
    """`hunted` with its disposition: its run's match first, then the first of `known`."""
    if hunted.carried:
        return Disposed(hunted, Disposition.CARRIED, hunted.carried)
    accepted = hunted.allowed or reason(known.allow, hunted.site, hunted.caller)
    if accepted:
        return Disposed(hunted, Disposition.ACCEPTED, accepted)
    left = reason(known.not_carried, hunted.site, hunted.caller)
    if left:
        return Disposed(hunted, Disposition.NOT_CARRIED, left)
    return Disposed(hunted, Disposition.CANDIDATE)


def known_now(layout: Layout) -> KnownSites:
    """known_sites.toml as it is now: what a report matches each candidate on."""
    return load_known_sites(layout.known_sites)
