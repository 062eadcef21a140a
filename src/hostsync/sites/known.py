"""The known sites: those accepted by design, and the candidates left as they are.

`known_sites.toml` holds one `[[allow]]` table per accepted site. Each names a `file` (a path
suffix), and may name a `function`, `line`, `code` or `caller`. `caller` picks the callers of a
shared helper. `host_memory = true` marks a site that reads host memory the detector cannot see
being made: its reads are no waits. Each has a `reason` a reviewer can check. `[[not_carried]]`
tables name the candidates read and left as they are, each with why. A case's card names the
sites its fix removes (`[[carries]]`).
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from hostsync.detector.codec import Strict
from hostsync.detector.sites import AllowRule, Site
from hostsync.workspace.cases import Case
from hostsync.workspace.config import load_toml


@dataclass(frozen=True)
class KnownSites(Strict):
    """known_sites.toml: the sites accepted by design (`allow`), and the candidates left as
    they are (`not_carried`). Each is a rule with its reason."""

    allow: tuple[AllowRule, ...] = ()
    not_carried: tuple[AllowRule, ...] = ()


# What a report matches candidates on without the file: nothing.
NONE_KNOWN = KnownSites()


def load_known_sites(path: Path) -> KnownSites:
    """known_sites.toml, every rule checked field by field."""
    return load_toml(path, KnownSites)


def host_memory_args(rules: Iterable[AllowRule]) -> list[str]:
    """The worker's option naming the rules that read host memory. Its scopes must know them
    while they run, as such a read drains nothing."""
    reading_host = [dataclasses.asdict(rule) for rule in rules if rule.host_memory]
    return ["--host-memory", json.dumps(reading_host)] if reading_host else []


def carried_rules(everyone: Iterable[Case]) -> tuple[AllowRule, ...]:
    """Every case's `[[carries]]` (`cases.every`), as rules whose reason is the case's name."""
    return tuple(rule for case in everyone for rule in case.carries)


def reason(rules: Sequence[AllowRule], site: Site, caller: str = "") -> str | None:
    """The reason of the first rule naming `site` when called from `caller`, or None."""
    found = next((rule for rule in rules if rule.matches(site, caller)), None)
    return found.reason if found else None
