"""The sites the hunt sets apart from the candidates: accepted by design, or carried by a case.

`hunt_allowlist.toml` holds one `[[allow]]` table per accepted site: `file` (a path suffix),
optionally `function`, `line`, `code`, `caller` (for a read inside a shared helper: which of its
callers is accepted), `host_memory = true` where the site reads host memory the detector cannot
see being made (its reads are then no waits), and a `reason` a reviewer can check. A site a
case's fix removes is named by that case's card (`[[carries]]`), with the case's name as its
reason. `[[not_carried]]` tables, with the same keys, name the candidates read and left as they
are, each with why: the census report shows that reason where it would show a bare candidate.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from hostsync.detector.codec import Strict
from hostsync.detector.sites import AllowRule, Site, first_match
from hostsync.workspace.cases import Case
from hostsync.workspace.config import load_toml


@dataclass(frozen=True)
class AllowList(Strict):
    """hunt_allowlist.toml: the sites accepted by design (`allow`), and the candidates read and
    left as they are (`not_carried`), each a rule with its reason."""

    allow: tuple[AllowRule, ...] = ()
    not_carried: tuple[AllowRule, ...] = ()


def load_allowlist(path: Path) -> AllowList:
    """hunt_allowlist.toml, every rule checked field by field."""
    return load_toml(path, AllowList)


def host_memory_args(rules: Iterable[AllowRule]) -> list[str]:
    """The worker's option that hands it the rules naming reads of host memory: its scopes must
    know them while they run, as such a read drains nothing."""
    reading_host = [dataclasses.asdict(rule) for rule in rules if rule.host_memory]
    return ["--host-memory", json.dumps(reading_host)] if reading_host else []


def carried_rules(everyone: Iterable[Case]) -> tuple[AllowRule, ...]:
    """Every case's `[[carries]]` (`cases.every`), as rules whose reason is the case's name."""
    return tuple(rule for case in everyone for rule in case.carries)


def reason(rules: tuple[AllowRule, ...], site: Site, caller: str = "") -> str | None:
    """The reason of the first rule accepting `site` when called from `caller`, or None."""
    found = first_match(rules, site, caller)
    return found.reason if found else None
