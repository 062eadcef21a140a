"""What to change at a host sync, from remedies.toml: one table of remedies every report reads.

A remedy is matched to a site by what the detector recorded there: the event kinds (its op
table's) and, where a kind is not enough, the statement's code. One matcher serves every record
that names a site (a summed-up `HuntSite`, one step's `StepSite`, a gate's finding). The first
remedy that matches wins, so the file lists the narrower ones first.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from hostsync.detector.codec import RecordError, Strict
from hostsync.detector.sites import Site
from hostsync.workspace.config import load_toml
from hostsync.workspace.layout import Layout

# What a report says where no remedy matches.
NONE = "no remedy in remedies.toml"


@dataclass(frozen=True)
class Remedy(Strict):
    """One change that removes a kind of wait: the kinds and statement it is for, what to do,
    why that removes the wait, and what it costs."""

    name: str
    kinds: tuple[str, ...]
    change: str
    reason: str
    cost: str
    # A regular expression searched in the site's statement; None: every statement.
    code: str | None = None

    def __post_init__(self) -> None:
        for name in ("name", "change", "reason", "cost"):
            if not getattr(self, name).strip():
                raise RecordError(name, "is blank: say it in a few words")
        if not self.kinds:
            raise RecordError("kinds", "is empty: name the detector's event kinds it is for")
        if self.code is not None:
            try:
                re.compile(self.code)
            except re.error as error:
                raise RecordError("code", f"is no regular expression ({error})") from None

    def matches(self, kinds: Iterable[str], site: Site) -> bool:
        return bool(set(self.kinds) & set(kinds)) and (
            self.code is None or re.search(self.code, site.code) is not None
        )


@dataclass(frozen=True)
class Remedies(Strict):
    """remedies.toml: the `[[remedy]]` tables, in the order they are tried."""

    remedy: tuple[Remedy, ...] = ()

    def __post_init__(self) -> None:
        names = [remedy.name for remedy in self.remedy]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:
            raise RecordError("remedy", f"names {twice} more than once: give each its own")

    def remedy_for(self, kinds: Iterable[str], site: Site) -> Remedy | None:
        """The first remedy for a site where the detector recorded `kinds`, or None."""
        kinds = tuple(kinds)
        return next((r for r in self.remedy if r.matches(kinds, site)), None)


def load_remedies(layout: Layout) -> Remedies:
    """remedies.toml, every table checked field by field."""
    return load_toml(layout.remedies, Remedies, what="remedy")


def remedy_text(remedy: Remedy | None) -> str:
    """A remedy in one line, its name and what to change; `NONE` where none matched."""
    return f"{remedy.name}: {remedy.change}" if remedy else NONE
