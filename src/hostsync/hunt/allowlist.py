"""The sites the hunt sets apart from the candidates: accepted by design, or carried by a case.

`hunt_allowlist.toml` holds one `[[allow]]` table per accepted site: `file` (a path suffix),
optionally `function`, `line`, `code`, `caller` (for a read inside a shared helper: which of its
callers is accepted), and a `reason` a reviewer can check. A site a case's fix removes is named
by that case's card (`[[carries]]`), with the case's name as its reason. `[[not_carried]]` tables,
with the same keys, name the candidates read and left as they are, each with why: the census
report shows that reason where it would show a bare candidate.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable
from dataclasses import fields
from pathlib import Path

from hostsync.detector.sites import AllowRule, Site, first_match
from hostsync.workspace.cases import Case
from hostsync.workspace.errors import WorkspaceError

_RULE_KEYS = {item.name for item in fields(AllowRule)}
# The tables of hunt_allowlist.toml: sites accepted by design, and candidates not carried.
ACCEPTED, NOT_CARRIED = "allow", "not_carried"


def load_allowlist(path: Path, table: str = ACCEPTED) -> tuple[AllowRule, ...]:
    """The sites of `path`'s `[[table]]` entries (accepted, or not carried), each a rule with
    its reason."""
    if not path.exists():
        raise WorkspaceError(f"no allow-list at {path}: restore it from version control")
    try:
        entries = tomllib.loads(path.read_text()).get(table, [])
    except tomllib.TOMLDecodeError as error:
        raise WorkspaceError(f"{path.name} is not valid TOML ({error}): fix that line") from None
    rules = []
    for number, entry in enumerate(entries, start=1):
        unknown = sorted(set(entry) - _RULE_KEYS)
        where = f"{path.name}, [[{table}]] #{number}"
        if unknown:
            raise WorkspaceError(f"{where} has unknown keys {unknown}: use {sorted(_RULE_KEYS)}")
        if not str(entry.get("file", "")).strip() or not str(entry.get("reason", "")).strip():
            raise WorkspaceError(f"{where} needs a file and a reason a reviewer can check")
        rules.append(AllowRule(**entry))
    return tuple(rules)


def carried_rules(everyone: Iterable[Case]) -> tuple[AllowRule, ...]:
    """Every case's `[[carries]]` (`cases.every`), as rules whose reason is the case's name."""
    return tuple(rule for case in everyone for rule in case.carries)


def reason(rules: tuple[AllowRule, ...], site: Site, caller: str = "") -> str | None:
    """The reason of the first rule accepting `site` when called from `caller`, or None."""
    found = first_match(rules, site, caller)
    return found.reason if found else None
