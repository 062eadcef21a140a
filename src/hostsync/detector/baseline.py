"""A baseline of host syncs, to adopt the gate by: the syncs each test makes today, written once,
reviewed and committed, so that a gate fails only on syncs that are new.

A codebase starts with many known syncs, and a gate that fails on all of them is never switched
on (mypy, ruff and pylint offer a baseline for the same reason). An entry is one site of one
test (`SiteCount`), matched on its site's identity (`Site.identity`: file, function and code),
so a line that moves matches still, whoever calls it; its line, kinds and count are there for
the reviewer. Standard library only: the pytest plugin reads it in
any project's environment.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hostsync.detector.codec import Record
from hostsync.detector.sites import SiteCount

SCHEMA = 1


@dataclass(frozen=True)
class Baseline(Record):
    """The accepted sites of each test, by pytest node id: `line`, `kinds` and `count` of each as
    written, for review only."""

    schema: int
    tests: dict[str, tuple[SiteCount, ...]]

    @classmethod
    def of(cls, surveyed: Mapping[str, Sequence[SiteCount]]) -> Baseline:
        """The baseline of a run's syncs: each test that made any, its sites as found."""
        return cls(
            SCHEMA, {test: tuple(sites) for test, sites in sorted(surveyed.items()) if sites}
        )

    @classmethod
    def read(cls, path: Path) -> Baseline:
        """The baseline at `path`; a file that is not one is refused in one line."""
        try:
            baseline = cls.from_json(json.loads(path.read_text()))
        except (OSError, ValueError) as error:  # RecordError and JSONDecodeError are ValueErrors
            raise BaselineError(
                f"{path} is not a host-sync baseline ({error}): fix it, or delete it and rerun to"
                " write it afresh from the syncs of today"
            ) from None
        if baseline.schema != SCHEMA:
            raise BaselineError(
                f"{path} is a baseline of schema {baseline.schema}, this plugin reads {SCHEMA}:"
                " delete it and rerun to write it afresh"
            )
        return baseline

    def write(self, path: Path) -> None:
        """Written whole, sorted and indented, so that a change reads as a small diff."""
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".part")
        partial.write_text(json.dumps(self.to_json(), indent=1, sort_keys=True) + "\n")
        partial.replace(path)

    def new(self, test: str, found: Sequence[SiteCount]) -> list[SiteCount]:
        """The sites of `test` that its entries do not hold."""
        known = {entry.site.identity for entry in self.tests.get(test, ())}
        return [synced for synced in found if synced.site.identity not in known]

    def gone(self, test: str, found: Sequence[SiteCount]) -> list[SiteCount]:
        """The entries of `test` that its run no longer made."""
        made = {synced.site.identity for synced in found}
        return [entry for entry in self.tests.get(test, ()) if entry.site.identity not in made]


class BaselineError(ValueError):
    """A baseline file that cannot be read; the message names the file and the fix."""
