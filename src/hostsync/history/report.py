"""The history's results in words. A bisect's summary and report: per site, its first and last
release, and the evidence for each. The watch's digest, read in a minute. `bisect` and `watch`
search; this module only renders what they found."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from hostsync.history.records import (
    BisectResult,
    Boundary,
    CaseWatch,
    Change,
    GitNarrowing,
    ProjectWatch,
    SiteHistory,
    WatchResult,
)
from hostsync.measure.records import Judgement
from hostsync.upstream import presence
from hostsync.upstream.records import Presence
from hostsync.workspace import results, table
from hostsync.workspace.layout import Layout

# --- a bisect ------------------------------------------------------------------------------------


def report(layout: Layout, folder: Path, result: BisectResult) -> None:
    """Print the summary, write the result and its Markdown."""
    print(table.text(SUMMARY, [_summary(history) for history in result.sites]))
    path = results.write(folder, result, keep_elsewhere=layout.unsaved)
    markdown = results.write_markdown(
        path, BisectResult, lambda made, at: render(made, str(at.relative_to(layout.root)))
    )
    for written in [path, *markdown]:
        print(f"wrote {written.relative_to(layout.root)}")


SUMMARY = (
    "site",
    "project",
    "first",
    "last",
    "before first",
    "after last",
    "contiguous",
    "reads since",
    "added by",
    "removed by",
)


def _summary(history: SiteHistory) -> list[object]:
    by = {n.change: (n.first, n.pull_request) for n in history.narrowed if n.first}
    commits = [
        by[change][0].commit[:10] + (f" (#{by[change][1]})" if by[change][1] else "")
        if change in by
        else None
        for change in (Change.ADDED, Change.REMOVED)
    ]
    since = next(
        (f"{b.newer} ({b.decided})" for b in history.boundaries if b.side == "first"), None
    )
    return [
        presence.described(history.site),
        history.project,
        history.first,
        history.last,
        history.before_first,
        history.after_last,
        history.contiguous,
        since,
        *commits,
    ]


def render(result: BisectResult, source: str) -> str:
    """The Markdown report: per site, its first and last release and the evidence for each."""
    who = f"case {result.stamp.case}" if result.stamp.case else "a site named on the command line"
    out = [
        f"# Since when: {who}",
        "",
        f"From `{source}` ({result.stamp.created}), package index {result.index}. Releases: the"
        " final ones with an sdist, each read from its sdist verified against the index's sha256.",
    ]
    for history in result.sites:
        out += ["", f"## {history.project}: {presence.described(history.site)}", ""]
        out.append(_sentence(history))
        out += ["", *[f"- {note}" for note in history.notes]]
        out += [line for boundary in history.boundaries for line in ("", _decided(boundary))]
        out += [line for narrowed in history.narrowed for line in ("", _narrowed(narrowed))]
        rows = [
            (
                release.version,
                release.uploaded,
                release.finding.presence,
                "; ".join(f"{presence.located(at)} `{at.code}`" for at in release.finding.found)
                or None,
                "; ".join(f"{c.label}: {c.verdict} ({c.reason})" for c in release.judged) or None,
            )
            for release in history.releases
        ]
        out += ["", table.markdown(("release", "uploaded", "site", "where", "tests"), rows)]
    return "\n".join(out) + "\n"


def _sentence(history: SiteHistory) -> str:
    first = next(r for r in history.releases if r.version == history.first)
    where = ", ".join(presence.located(at) for at in first.finding.found)
    since = (
        f"since {history.project} {history.first} (uploaded {first.uploaded or 'on a day unknown'}"
        f"; {history.before_first} does not have it)"
        if history.before_first
        else f"in {history.first}, the oldest release searched, already"
    )
    until = (
        f"through {history.last}, gone in {history.after_last}"
        if history.after_last
        else f"through {history.last}, the newest"
    )
    return f"There {since}, {until}; in {history.first} at {where}."


def _decided(boundary: Boundary) -> str:
    """How a boundary was decided, and each run tried for it."""
    older = f"{boundary.older} and " if boundary.older else ""
    runs = "; ".join(
        f"{run.version}{_beside(run)}: {run.verdict} ({run.probe}: {run.reason})"
        for run in boundary.judged
    )
    tried = f" Runs: {runs}." if runs else " Not judged by running (bisect --judge runs it)."
    return f"The reads begin between {older}{boundary.newer}, by {boundary.decided}.{tried}"


def _beside(run: Judgement) -> str:
    return f" (beside {', '.join(run.beside)})" if run.beside else ""


def _narrowed(narrowed: GitNarrowing) -> str:
    span = f"{narrowed.commits} first-parent commits from {narrowed.older} to {narrowed.newer}"
    if narrowed.first is None:
        read = f"{span}; " if narrowed.commits else ""
        return f"Git ({narrowed.remote}): {read}{narrowed.note}"
    pr = f", pull request #{narrowed.pull_request}" if narrowed.pull_request else ""
    return (
        f"Git ({narrowed.remote}): of {span}, the site was {narrowed.change} by"
        f" {narrowed.first.commit[:12]} ({narrowed.first.date})"
        f' "{narrowed.first.subject}"{pr}; {len(narrowed.probed)} commits read.'
    )


# --- a watch's digest ----------------------------------------------------------------------------

_STATES = {
    Presence.PRESENT: "still present at",
    Presence.ELSEWHERE: "moved, now at",
    Presence.ABSENT: "gone",
    Presence.MISSING: "gone, with the code it lay in",
}


def digest(result: WatchResult, source: str) -> str:
    """A page a contributor reads in a minute: the projects' newest releases, then each case."""
    out = [
        f"# Watch, {result.stamp.created[:10]}",
        "",
        f"The newest final releases on {result.index} against pin.toml, and every case there"
        f" (`{source}`).",
        "",
        "## Projects",
        "",
    ]
    out += [line for watched in result.projects for line in _project(watched)]
    out += ["", "## Cases", ""]
    out += [line for watched in result.cases for line in _case(watched)]
    return "\n".join(out) + "\n"


def _project(watched: ProjectWatch) -> Iterator[str]:
    released = f"{watched.project} {watched.newest} ({watched.uploaded or 'upload day unknown'})"
    if watched.newest == watched.pinned:
        yield f"- {released}: as pinned."
    else:
        behind = ", ".join(watched.newer)
        yield (
            f"- {released}: pin.toml installs {watched.pinned or 'no release of it'};"
            f" {len(watched.newer)} newer: {behind}."
        )
    if watched.hunt:
        yield f"  - hunt: {watched.hunt}."
    for hunted in watched.new_sites:
        site = hunted.site
        yield (
            f"  - new per-step read at {site.file}:{site.line} ({site.function}):"
            f" `{site.code}`, {hunted.per_step} per step ({hunted.when})."
        )


def _case(watched: CaseWatch) -> Iterator[str]:
    newest = (
        "the pinned release" if watched.newest == watched.pinned else f"pinned {watched.pinned}"
    )
    fixed = f"; upstream fixed it in {watched.fixed}" if watched.fixed else ""
    behind = (
        f"; behind: `nox -s repin -- --case {watched.case}`"
        if watched.newest != watched.pinned and not watched.fixed
        else ""
    )
    yield f"- **{watched.case}** ({watched.project} {watched.newest}, {newest}{fixed}{behind}):"
    for site in watched.sites:
        where = ", ".join(presence.located(at) for at in site.finding.found)
        state = f"{_STATES[site.finding.presence]} {where}".strip()
        run = f"; run there: {site.judged.verdict} ({site.judged.reason})" if site.judged else ""
        yield f"  - {site.project} {site.version}: {presence.described(site.site)} {state}{run}."
    yield f"  - series on {watched.newest}: {watched.series}."
    for check in watched.tests:
        yield f"  - {check.check} on {check.label}: {check.verdict} ({check.reason})."
