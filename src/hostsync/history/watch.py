"""`python -m hostsync watch`: what the newest releases changed, against the pins and every case.

For each project of `projects.PROJECTS`, its newest final release on the package index against
the release pin.toml installs. For each case: whether each of its sites is still in the newest
release of the project holding it (the presence check `bisect` makes, from the verified sdist),
and whether its series applies to its project's newest release (`git am` on that release's
tree); with `--tests`, how its tests go there (test-patch's checks for another release). With
`--hunt`, the hunt's training step on each project's pinned and newest release in a few setups,
and the sites the newest has that the pinned has not (matched on file, function, code and
caller: lines move).

Writes profiles/watch/watch-<time>.json and its Markdown digest beside it, and watch.md from the
newest: what a contributor reads in a minute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass

from packaging.version import Version

from hostsync.detector.sites import AllowRule
from hostsync.history.bisect import Reader, case_targets
from hostsync.hunt.allowlist import carried_rules, load_allowlist
from hostsync.hunt.measure import hunt_tree
from hostsync.hunt.run import DEFAULT_STEPS
from hostsync.measure import judge, provenance, test_patch
from hostsync.upstream import presence, sdists
from hostsync.upstream.patchqueue import PatchDoesNotApply, series
from hostsync.upstream.trees import checkout_tree, prepare_tree
from hostsync.workspace import cases, locks, pin
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import PROJECTS, DeepSpeedSetup, Project
from hostsync.workspace.records import (
    CaseWatch,
    HuntSite,
    Presence,
    ProjectWatch,
    SiteWatch,
    WatchResult,
)

# A small set: one hunt per setup and tree is a full training run.
DEFAULT_HUNT_SETUPS = ("bf16-zero1",)


@dataclass(frozen=True)
class WatchSettings:
    """What `watch` was asked, read once from the command line."""

    tests: bool
    hunt: bool
    setups: tuple[DeepSpeedSetup, ...]
    timeout: float


def series_state(case: cases.Case, version: str) -> str:
    """Whether the case's series applies to `version` of its project, in words."""
    if not series(case.layout):
        return "the series is empty"
    try:
        checkout_tree(case, f"{version}+series")
    except PatchDoesNotApply as error:
        return f"does not apply: {error}"
    return "applies"


def watch_case(case: cases.Case, reader: Reader, settings: WatchSettings) -> CaseWatch:
    """The case against the newest releases: its sites, its series, its tests when asked."""
    layout = case.layout
    measured_against = provenance.inputs(layout)
    sites = []
    for target in case_targets(case, None):
        releases = reader.releases(target.project)
        pinned = [r for r in releases if r.version == case.pin.version]
        if target.project == case.project and pinned:  # followed by its body where it moved
            reader.follow(target.project, pinned[0], target.site)
        newest = releases[-1]
        finding = reader.finding(target.project, newest, target.site)
        run = None
        if settings.tests and finding.presence.carried:
            run = judge.release(
                layout,
                target.project,
                newest.version,
                newest.sdist,
                finding,
                judge.snippet_of(layout, case),
                settings.timeout,
            )
        sites.append(SiteWatch(target.project.name, newest.version, target.site, finding, run))
    latest = reader.releases(case.project)[-1].version
    with locks.case(layout):
        state = series_state(case, latest)
        checks = []
        if settings.tests:
            workdir = layout.new_run_dir(f"watch-{layout.case}")
            checks = test_patch.other_release_checks(
                layout, case, workdir, latest, settings.timeout
            )
    return CaseWatch(
        case=case.name,
        project=case.project.name,
        pinned=case.pin.version,
        newest=latest,
        provenance=measured_against,
        fixed=case.fixed.version if case.fixed else None,
        sites=tuple(sites),
        series=state,
        tests=tuple(check.record() for check in checks),
    )


def watch_project(project: Project, pinned: str, reader: Reader) -> ProjectWatch:
    """The project's newest release, and every release newer than `pinned`."""
    releases = reader.releases(project)
    newer = tuple(r.version for r in releases if not pinned or Version(r.version) > Version(pinned))
    return ProjectWatch(project.name, pinned, releases[-1].version, releases[-1].uploaded, newer)


def hunt_new_sites(
    home: cases.Case, watched: ProjectWatch, settings: WatchSettings, carried: tuple[AllowRule, ...]
) -> tuple[str, tuple[HuntSite, ...]]:
    """The sites the hunt finds in the project's newest release and not in its pinned one, in
    each setup, and what was hunted; `home` is a case of the project (its trees' home) and
    `carried` every case's carried sites."""
    if watched.newest == watched.pinned:
        return "the newest release is the pinned one: nothing new to hunt", ()
    layout = home.layout
    rules = load_allowlist(layout.allowlist).allow
    found: dict[tuple[str, str, str, str], HuntSite] = {}
    with locks.case(layout):
        trees = [prepare_tree(home, version) for version in (watched.pinned, watched.newest)]
        for setup in settings.setups:
            pinned, newest = (
                hunt_tree(layout, tree, DEFAULT_STEPS, rules, settings.timeout, setup, carried)
                for tree in trees
            )
            failed = [tree for tree in (pinned, newest) if not tree.measured]
            if failed:
                return f"{failed[0].label} could not be hunted: {failed[0].error}", ()
            before = {hunted.key for hunted in pinned.sites}
            found |= {
                hunted.key: hunted
                for hunted in newest.sites
                if hunted.key not in before and hunted.allowed is None
            }
    setups = ", ".join(setup.label for setup in settings.setups)
    said = f"hunted {watched.pinned} and {watched.newest} through the training step ({setups})"
    return said, tuple(found.values())


def watch(layout: Layout, settings: WatchSettings) -> WatchResult:
    pins = pin.load(layout.pin_file).installs
    known = cases.every(layout.root)
    carried = carried_rules(known)
    targets = [target for case in known for target in case_targets(case, None)]
    reader = Reader(layout, targets, bounded=None)
    projects = []
    for project in PROJECTS.values():
        watched = watch_project(project, pins.get(project.name, ""), reader)
        home = next((case for case in known if case.project == project), None)
        if settings.hunt and home is not None:
            watched = _hunted(watched, *hunt_new_sites(home, watched, settings, carried))
        elif settings.hunt:
            watched = _hunted(watched, f"no case of {project.name}: its trees have no home")
        projects.append(watched)
    watched_cases = [watch_case(case, reader, settings) for case in known]
    return WatchResult(
        stamp=provenance.stamp(layout, provenance.workspace_inputs(layout)),
        index=sdists.index_url(),
        projects=tuple(projects),
        cases=tuple(watched_cases),
    )


def _hunted(watched: ProjectWatch, said: str, sites: tuple[HuntSite, ...] = ()) -> ProjectWatch:
    return dataclasses.replace(watched, hunt=said, new_sites=sites)


# --- the digest ----------------------------------------------------------------------------------

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
