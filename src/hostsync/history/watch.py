"""`python -m hostsync watch`: what the newest releases changed, against the pins and every case.

A pin ages quietly; this says which. For each project, its newest final release on the index
against the one pin.toml installs. For each case, whether each of its sites is still in the
newest release (the presence check `bisect` makes, from the verified sdist). Whether its series
applies there (`git am` on that release's tree). With `--tests`, how its tests go there. With
`--hunt`, the sites the hunt finds in the newest release and not in the pinned one, matched on
file, function, code and caller. The command hands that hunt in: watch imports no hunt.

Writes profiles/watch/watch-<time>.json and its Markdown digest beside it, and watch.md from the
newest: what a contributor reads in a minute (`history.report`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass

from packaging.version import Version

from hostsync.detector.sites import AllowRule
from hostsync.history.bisect import Reader, case_targets
from hostsync.history.records import CaseWatch, ProjectWatch, SiteWatch, WatchResult
from hostsync.measure import judge, provenance, test_patch
from hostsync.sites.known import carried_rules
from hostsync.sites.records import HuntSite
from hostsync.upstream import sdists
from hostsync.upstream.patchqueue import PatchDoesNotApply, series
from hostsync.upstream.trees import checkout_tree
from hostsync.workspace import cases, locks, pin
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import PROJECTS, Project

# The hunt of a project's new sites (`hunt.run.new_sites`): given a case of the project (its
# trees' home), the pinned and the newest release and every case's carried sites, what was
# hunted and the sites the newest adds. The command hands it in: watch imports no hunt.
NewSites = Callable[[cases.Case, str, str, tuple[AllowRule, ...]], tuple[str, tuple[HuntSite, ...]]]


@dataclass(frozen=True)
class WatchSettings:
    """What `watch` was asked, read once from the command line; `hunt` where --hunt was."""

    tests: bool
    timeout: float
    hunt: NewSites | None = None


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
    version = reader.releases(case.project)[-1].version
    with locks.case(layout):
        state = series_state(case, version)
        checks = []
        if settings.tests:
            workdir = layout.new_run_dir(f"watch-{layout.case}")
            checks = test_patch.other_release_checks(
                layout, case, workdir, version, settings.timeout
            )
    return CaseWatch(
        case=case.name,
        project=case.project.name,
        pinned=case.pin.version,
        newest=version,
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
        if settings.hunt is not None:
            watched = _hunted(watched, *_new_sites(settings.hunt, home, watched, carried))
        projects.append(watched)
    watched_cases = [watch_case(case, reader, settings) for case in known]
    return WatchResult(
        stamp=provenance.stamp(layout, provenance.workspace_inputs(layout)),
        index=sdists.index_url(),
        projects=tuple(projects),
        cases=tuple(watched_cases),
    )


def _new_sites(
    hunt: NewSites, home: cases.Case | None, watched: ProjectWatch, carried: tuple[AllowRule, ...]
) -> tuple[str, tuple[HuntSite, ...]]:
    """What `hunt` finds new in the project's newest release, or why nothing was hunted."""
    if home is None:
        return f"no case of {watched.project}: its trees have no home", ()
    if watched.newest == watched.pinned:
        return "the newest release is the pinned one: nothing new to hunt", ()
    return hunt(home, watched.pinned, watched.newest, carried)


def _hunted(watched: ProjectWatch, said: str, sites: tuple[HuntSite, ...] = ()) -> ProjectWatch:
    return dataclasses.replace(watched, hunt=said, new_sites=sites)
