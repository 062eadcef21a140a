"""A card moved to another release of its project: the `[pin]` table rewritten, the rest kept.

`watch` says which cards are behind the index; `repin` moves one. The new release's sdist is
downloaded and checked against the index's sha256, and an environment found or built for it beside
pin.toml's other pins, before the card changes; the card's text is edited in place (its comments and
layout kept), with a dated comment saying from which release it moved. Every result of the case is
stale from then on: its sessions rerun, and its reference is refreshed once its drafts pass.
"""

from __future__ import annotations

import datetime
import itertools
import re
import textwrap
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from hostsync.upstream import envs
from hostsync.upstream.releases import tag_format
from hostsync.upstream.sdists import Published, fetch_sdist, index_url, published
from hostsync.workspace.cases import Case, Release
from hostsync.workspace.errors import WorkspaceError

# The sessions a pin move reruns, in order, and the drafts' refresh last: what `--run` runs.
SESSIONS = ("repro", "test-patch", "profile", "bisect")

_PIN_TABLE = re.compile(r"^\[pin\]\n(?P<body>(?:(?!\[).*\n)*)", re.MULTILINE)
_KEYS = ("version", "tag", "sdist")


@dataclass(frozen=True)
class Repin:
    """A card's move: from `was` to `now` (uploaded on `uploaded`), the card's new text."""

    case: str
    was: str
    now: Release
    uploaded: str
    text: str


def newest(case: Case) -> Published:
    """The project's newest final release on the index."""
    releases = published(case.project.name)
    if not releases:
        raise WorkspaceError(f"{index_url()} lists no release of {case.project.name}")
    return releases[-1]


def chosen(case: Case, version: str | None) -> Published:
    """The release asked for, or the newest; never one older than the pin."""
    if version is None:
        return newest(case)
    found = [r for r in published(case.project.name) if r.version == version]
    if not found:
        raise WorkspaceError(
            f"{index_url()} has no final release {case.project.name} {version}: check the number"
        )
    if Version(version) < Version(case.pin.version):
        raise WorkspaceError(
            f"{case.name} is pinned to {case.pin.version}, newer than {version}: a card moves"
            " forward; edit [pin] by hand to go back"
        )
    return found[0]


def repinned(case: Case, target: Published, today: datetime.date) -> Repin:
    """The card's text with `[pin]` moved to `target`: version, tag (named like the pinned one's)
    and sdist replaced, a dated comment added above them, saying whether it is the newest."""
    release = Release(
        version=target.version,
        tag=tag_format(case.pin).format(version=target.version),
        sdist=target.sdist,
    )
    text = case.layout.case_file.read_text(encoding="utf-8")
    table = _PIN_TABLE.search(text)
    if table is None:
        raise WorkspaceError(f"{case.layout.case_file.name} has no [pin] table: add one first")
    body = table["body"]
    for key in _KEYS:
        if len(re.findall(rf"^{key} = .*$", body, re.MULTILINE)) != 1:
            raise WorkspaceError(
                f"{case.layout.case_file.name}: [pin] does not hold one `{key} = ...` line:"
                " write version, tag and sdist one line each, then repin"
            )
    values = {
        "version": f'"{release.version}"',
        "tag": f'"{release.tag}"',
        "sdist": f'{{ url = "{release.sdist.url}", size = {release.sdist.size},'
        f' sha256 = "{release.sdist.sha256}" }}',
    }
    for key, value in values.items():
        body = re.sub(rf"^{key} = .*$", f"{key} = {value}", body, count=1, flags=re.MULTILINE)
    which = "the newest final release" if target == newest(case) else "a release"
    said = textwrap.fill(
        f"Re-pinned on {today.isoformat()} from {case.pin.version}: {release.version}, {which}"
        f" on the index that day (uploaded {target.uploaded or 'on a day it does not say'}).",
        width=100,
        initial_indent="# ",
        subsequent_indent="# ",
    )
    said += "\n"
    first_key = re.search(rf"^(?:{'|'.join(_KEYS)}) = ", body, re.MULTILINE)
    if first_key is None:
        raise WorkspaceError(f"{case.name}'s card has no {', '.join(_KEYS)}: restore its [pin]")
    body = body[: first_key.start()] + said + body[first_key.start() :]
    moved = text[: table.start("body")] + body + text[table.end("body") :]
    return Repin(case.name, case.pin.version, release, target.uploaded, moved)


def apply(case: Case, repin: Repin) -> Path | None:
    """The new release's sdist checked against the index's sha256 and an environment found or
    built for it beside pin.toml's other pins (else nothing changes), then the card written; the
    case's clone, of the release it leaves, moved aside (never removed: it may hold edits).
    Returns where the clone went, if there was one."""
    fetch_sdist(case.layout, repin.now.sdist)
    try:
        envs.python_for(case.layout, case.project, repin.now)
    except WorkspaceError as error:
        raise WorkspaceError(
            f"{case.name} stays on {repin.was}: {repin.now.version} does not install beside"
            f" pin.toml's pins ({error}); move pin.toml's companions first"
        ) from None
    case.layout.case_file.write_text(repin.text, encoding="utf-8")
    clone = case.layout.clone
    if not clone.exists():
        return None
    aside = clone.with_name(f"{clone.name}-{repin.was}")
    for number in itertools.count(2):
        if not aside.exists():
            break
        aside = clone.with_name(f"{clone.name}-{repin.was}-{number}")
    clone.rename(aside)
    return aside
