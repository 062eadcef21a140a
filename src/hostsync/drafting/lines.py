"""A `file:line` a draft cites is a line of the release the draft names beside it.

Lines move between releases, and a patched tree's lines are not any release's. So a draft that
cites `stage_1_and_2.py:3248` names the release (`DeepSpeed 0.19.8`), and the line is read there,
in the release's sdist: the file must be in it, once, and the line must hold code. Where the
draft's own results recorded a site at that file and line, the release's line must be the
site's code: a patched tree's line, or another release's, is refused. The release a citation
is of is the one of its project named last before it (else first after it); a file without
its package's folder (`trainer.py`) is of the case's own project.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from hostsync.detector.sites import Site, suffix_matches
from hostsync.upstream.presence import Sources
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.projects import PROJECTS

# `deepspeed/runtime/utils.py:887`, `trainer.py:2747`, `stage_1_and_2.py:3042-3044`.
CITED = re.compile(r"(?<![\w/.])(?P<file>[\w./-]*\w\.py):(?P<line>\d+)(?:-(?P<end>\d+))?")


@dataclass(frozen=True)
class Named:
    """A release a draft names, and where."""

    project: str
    version: str
    at: int


def named(text: str) -> list[Named]:
    """Every release of a known project the text names (`DeepSpeed 0.19.8`, `trl v1.16.0`)."""
    found = []
    for project in PROJECTS:
        pattern = rf"(?<![\w/-]){re.escape(project)} v?(\d+\.\d+\.\d+)\b"
        found += [Named(project, m[1], m.start()) for m in re.finditer(pattern, text, re.I)]
    return sorted(found, key=lambda release: release.at)


def check_lines(
    name: str,
    text: str,
    project: str,
    release: Callable[[str, str], Sources],
    sites: Iterable[Site],
) -> None:
    """Refuse `text` (the draft `name`, of a case of `project`) where a `file:line` it cites is
    not that line of the release it names; `release(project, version)` gives a release's
    source, `sites` the sites the draft's results recorded."""
    releases = named(text)
    recorded: dict[tuple[str, int], set[str]] = {}
    for site in sites:
        recorded.setdefault((site.file, site.line), set()).add(site.code.strip())
    for cited in CITED.finditer(text):
        path = cited["file"]
        owner = path.split("/")[0] if path.split("/")[0] in PROJECTS else project
        of = _release_of(name, cited, owner, releases)
        source = release(of.project, of.version)
        held = [file for file in source if suffix_matches(file, path)]
        if len(held) != 1:
            said = "is not in it" if not held else f"is {len(held)} files there"
            raise WorkspaceError(
                f"{name} cites `{cited[0]}`, but {path} {said} ({of.project} {of.version}):"
                " cite it by its path in that release"
            )
        lines = source[held[0]].splitlines()
        first, last = int(cited["line"]), int(cited["end"] or cited["line"])
        if last > len(lines) or not all(lines[n - 1].strip() for n in range(first, last + 1)):
            raise WorkspaceError(
                f"{name} cites `{cited[0]}`, which holds no code in {of.project} {of.version}:"
                " cite the line of the release the draft names"
            )
        codes = {
            code
            for (file, line), held_codes in recorded.items()
            if line == first and ("/" + held[0]).endswith("/" + file)
            for code in held_codes
        }
        there = lines[first - 1].strip()
        if codes and not any(_starts(lines[first - 1 :], code) for code in codes):
            raise WorkspaceError(
                f"{name} cites `{cited[0]}` for `{sorted(codes)[0]}`, but that line of"
                f" {of.project} {of.version} is `{there}`: cite the line of the release the"
                " draft names, not a patched tree's or another release's"
            )


def _starts(lines: list[str], code: str) -> bool:
    """Whether the statement `code` (its lines joined, as a site holds it) begins on `lines`."""
    wanted = "".join(code.split())
    return "".join("".join(lines[:40]).split()).startswith(wanted)


def _release_of(name: str, cited: re.Match[str], project: str, releases: list[Named]) -> Named:
    """The release of `project` named last before the citation, else first after it."""
    own = [release for release in releases if release.project == project]
    if not own:
        raise WorkspaceError(
            f"{name} cites `{cited[0]}` but names no {project} release: say which release"
            f" its lines are of (`{project} X.Y.Z`)"
        )
    before = [release for release in own if release.at < cited.start()]
    return before[-1] if before else own[0]
