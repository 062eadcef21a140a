"""`python -m hostsync bisect`: since which release a site is there, and until which.

A site is one of a case's `[[carries]]` (each in the project whose package its file names), or
one named on the command line (`--project`, `--file`, `--code` or `--function`). The releases
searched are the project's final releases with an sdist on the package index, oldest first;
`--since` and `--until` bound them, and with them the downloads. The search starts from a
release that carries the site (the case's pinned release, else the newest, or `--anchor`) and
bisects each side on presence. That assumes the site is there in one contiguous run of
releases: the releases just beyond each boundary's pair are read too, so that a site that came
and went is noticed (`contiguous` false, and the notes say where). Each sdist is downloaded
once into the shared cache, verified against the index's sha256, and read without unpacking
(`upstream.presence`).

A site is found by what it does (`upstream.presence`): its code on the syntax tree, local names
abstracted, and its function followed, from the anchor's body, where it was renamed, moved or
inlined. That is still text: `--judge` decides where the reads begin by running them
(`hostsync.measure.judge`): the site under the detector on the releases between the text's first and
the anchor, bisected on "device read", each in an environment built for it; a release whose line
runs without a device read (a value still a Python number there) moves the boundary on, one
that does not install or run is "not run" and leaves the text's boundary. Each boundary records
which it rests on, and the words a draft says it in (`stated`). `--tests` also runs the case's
tests on the boundary releases through test-patch's checks (expensive: a tree each).

`--remote` (a local clone or mirror with the release tags) narrows each boundary to the commits
between its two releases (the first-parent path), bisected the same way, down to the commit that
added (or removed) the site and the pull request its subject names.

Writes profiles/<case>/bisect-<time>.json (profiles/sites/ for a site named on the command line)
with its Markdown beside it, and bisect.md from the newest.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from hostsync.detector.sites import AllowRule
from hostsync.history.records import (
    BisectResult,
    Boundary,
    Change,
    CommitEvidence,
    Decided,
    GitNarrowing,
    ReleaseEvidence,
    SiteHistory,
)
from hostsync.measure import judge, provenance, test_patch
from hostsync.measure.records import CheckRecord, Judgement, ProbeVerdict
from hostsync.upstream import envs, presence, sdists
from hostsync.upstream.git import git, rev
from hostsync.upstream.records import Finding
from hostsync.upstream.releases import tag_format
from hostsync.upstream.sdists import Published
from hostsync.workspace import cases
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import Project

ASSUMPTION = (
    "bisected on presence, assuming the site is there in one contiguous run of releases; the"
    " releases just beyond each boundary were read too"
)
DEFAULT_TAG_FORMAT = "v{version}"
_PULL_REQUEST = re.compile(r"\(#(\d+)\)\s*$|^Merge pull request #(\d+)\b")


def bisect_run(count: int, anchor: int, carried: Callable[[int], bool]) -> tuple[int, int]:
    """The first and last of `count` ordered items in the run of carrying ones around `anchor`
    (which carries), assuming one contiguous run: about 2 log2(count) calls of `carried`, and
    each boundary's pair (the last item without, the first with) among them."""
    without, first = -1, anchor
    while first - without > 1:
        middle = (without + first) // 2
        without, first = (without, middle) if carried(middle) else (middle, first)
    last, beyond = anchor, count
    while beyond - last > 1:
        middle = (last + beyond) // 2
        last, beyond = (middle, beyond) if carried(middle) else (last, middle)
    return first, last


def pull_request(subject: str) -> int | None:
    """The pull request a commit subject names: a squash merge's `(#1234)`, or a merge commit's
    `Merge pull request #1234`."""
    match = _PULL_REQUEST.search(subject)
    return int(match[1] or match[2]) if match else None


@dataclass(frozen=True)
class Target:
    """One site to bisect, in the project whose tree holds it, from which release."""

    site: AllowRule
    project: Project
    anchor: str | None  # None: the newest release searched


class Reader:
    """The releases of each project and each site's finding in each release, each read once
    per run (the sdists once per cache). The bounds apply to the releases of `bounded` (the
    project a case pins, or --project): a case's sites in another project are searched through
    all its releases. A site whose function was read in a release that carries it (`follow`) is
    followed by that body where the function is renamed, moved or inlined."""

    def __init__(
        self,
        layout: Layout,
        targets: list[Target],
        bounded: Project | None,
        since: str | None = None,
        until: str | None = None,
    ) -> None:
        self.layout, self.targets = layout, targets
        self.bounded, self.since, self.until = bounded, since, until
        self._releases: dict[str, list[Published]] = {}
        self._findings: dict[tuple[str, str, AllowRule], Finding] = {}
        self._references: dict[AllowRule, presence.Body | None] = {}

    def releases(self, project: Project) -> list[Published]:
        if project.name not in self._releases:
            since, until = (self.since, self.until) if project == self.bounded else (None, None)
            found = [r for r in sdists.published(project.name) if _within(r.version, since, until)]
            if not found:
                raise WorkspaceError(
                    f"{sdists.index_url()} lists no final release of {project.name} with an sdist"
                    f" {_range(since, until)}: widen --since/--until"
                )
            self._releases[project.name] = found
        return self._releases[project.name]

    def sources(self, project: Project, release: Published) -> presence.Sources:
        """The release's package source (`presence.sdist_sources` keeps the last few read)."""
        return presence.sdist_sources(self.layout, release.sdist, project)

    def follow(self, project: Project, release: Published, site: AllowRule) -> None:
        """Follow the site's function by the body it has in `release` (which carries it)."""
        body = presence.body_of(site, self.sources(project, release), project)
        self._references[site] = body

    def finding(self, project: Project, release: Published, site: AllowRule) -> Finding:
        key = (project.name, release.version, site)
        if key not in self._findings:
            sources = self.sources(project, release)
            reference = self._references.get(site)
            self._findings[key] = presence.locate(site, sources, project, reference)
        return self._findings[key]

    def reference(self, site: AllowRule) -> presence.Body | None:
        return self._references.get(site)

    def was_read(self, project: Project, version: str, site: AllowRule) -> bool:
        return (project.name, version, site) in self._findings


def _anchor(target: Target, versions: list[str], notes: list[str]) -> str:
    """The release the search starts from: the target's when searched, else the newest."""
    if target.anchor is None or target.anchor in versions:
        return target.anchor or versions[-1]
    if Version(versions[0]) < Version(target.anchor) < Version(versions[-1]):
        raise WorkspaceError(
            f"{target.project.name} {target.anchor} is no final release with an sdist on"
            f" {sdists.index_url()}: name one of {', '.join(versions)} with --anchor"
        )
    notes.append(f"{target.anchor} lies outside the releases searched: started from the newest")
    return versions[-1]


def history(reader: Reader, target: Target) -> SiteHistory:
    """The site's run of releases: its boundaries, the releases just beyond them, and every
    release read, as evidence."""
    releases = reader.releases(target.project)
    versions = [r.version for r in releases]
    notes = [ASSUMPTION]
    place = versions.index(_anchor(target, versions, notes))

    def finding(index: int) -> Finding:
        return reader.finding(target.project, releases[index], target.site)

    if not finding(place).presence.carried:
        raise WorkspaceError(
            f"{target.project.name} {versions[place]} does not carry"
            f" {presence.described(target.site)} ({finding(place).presence}): name a release"
            " that does with --anchor, or check the site"
        )
    reader.follow(target.project, releases[place], target.site)
    first, last = bisect_run(len(releases), place, lambda i: finding(i).presence.carried)
    breaks = [
        f"{versions[i]} {'carries' if finding(i).presence.carried else 'lacks'} the site though it"
        f" lies {'outside' if finding(i).presence.carried else 'inside'} the run"
        f" {versions[first]}..{versions[last]}: the releases are no one contiguous run"
        for i in (first - 2, first + 1, last - 1, last + 2)
        if 0 <= i < len(releases) and finding(i).presence.carried != (first <= i <= last)
    ]
    if first == 0:
        notes.append(f"{versions[0]}, the oldest release searched, carries it: widen --since")
    return SiteHistory(
        project=target.project.name,
        site=target.site,
        searched=tuple(versions),
        anchor=versions[place],
        first=versions[first],
        last=versions[last],
        before_first=versions[first - 1] if first > 0 else None,
        after_last=versions[last + 1] if last + 1 < len(versions) else None,
        contiguous=not breaks,
        notes=tuple(notes + breaks),
        releases=tuple(
            ReleaseEvidence(r.version, r.uploaded, r.sdist.sha256, finding(i))
            for i, r in enumerate(releases)
            if reader.was_read(target.project, r.version, target.site)
        ),
    )


# --- narrowing to commits ------------------------------------------------------------------------


def narrow(
    remote: Path,
    project: Project,
    site: AllowRule,
    older: str,
    newer: str,
    change: Change,
    reference: presence.Body | None = None,
    run: Callable[[str, Finding], Judgement] | None = None,
) -> GitNarrowing:
    """The first commit on the first-parent path from tag `older` to tag `newer` whose tree is
    in `newer`'s state (the site added, removed, or with `run` its line made a device read),
    bisected on that state (the site's function followed by `reference`), and its pull
    request."""
    narrowing = GitNarrowing(str(remote), older, newer, change, 0, (), None, None)
    missing = [tag for tag in (older, newer) if not rev(remote, tag)]
    if missing:
        note = f"{remote} has no tag {', '.join(missing)}: nothing narrowed"
        return dataclasses.replace(narrowing, note=note)
    path = git(remote, "rev-list", "--first-parent", "--reverse", f"{older}..{newer}").stdout
    commits = path.split()
    probed: dict[str, CommitEvidence] = {}

    def probe(revision: str) -> CommitEvidence:
        commit, date, subject = (
            git(remote, "log", "-1", "--format=%H%x00%as%x00%s", revision)
            .stdout.strip()
            .split("\0")
        )
        if commit not in probed:
            sources = presence.git_sources(remote, commit, project)
            found = presence.locate(site, sources, project, reference)
            verdict = run(commit, found).verdict if run and found.presence.carried else None
            probed[commit] = CommitEvidence(commit, date, subject, found.presence, verdict)
        return probed[commit]

    def in_newer_state(evidence: CommitEvidence) -> bool:
        if change == Change.READING:
            return evidence.verdict == ProbeVerdict.READ
        return evidence.presence.carried == (change == Change.ADDED)

    ends = tuple(in_newer_state(probe(tag)) for tag in (older, newer))
    narrowing = dataclasses.replace(narrowing, commits=len(commits))
    if ends != (False, True) or not commits:
        states = [f"{tag}: {probe(tag).verdict or probe(tag).presence}" for tag in (older, newer)]
        note = f"the tags differ from the releases ({', '.join(states)}): nothing narrowed"
        return dataclasses.replace(narrowing, probed=tuple(probed.values()), note=note)
    changed = lambda index: in_newer_state(probe(commits[index]))  # noqa: E731
    found = probe(commits[bisect_run(len(commits), len(commits) - 1, changed)[0]])
    return dataclasses.replace(
        narrowing,
        probed=tuple(probed.values()),
        first=found,
        pull_request=pull_request(found.subject),
    )


def narrow_reads(
    layout: Layout,
    reader: Reader,
    target: Target,
    made: SiteHistory,
    settings: BisectSettings,
    tags: str,
    snippet: Path | None,
) -> SiteHistory:
    """Where a judged boundary's older release runs the line without a device read, the commit
    that made it read: its value turned into a device tensor with the same text."""
    (boundary,) = [b for b in made.boundaries if b.side == "first"]
    ran = {run.version: run.verdict for run in boundary.judged}
    older, remote = boundary.older, settings.remote
    if boundary.decided != Decided.JUDGED or older is None or remote is None:
        return made
    if ran.get(older) != ProbeVerdict.NO_READ:
        return made
    newer = next(r for r in reader.releases(target.project) if r.version == boundary.newer)
    release = cases.Release(newer.version, tags.format(version=newer.version), newer.sdist)
    python = envs.python_for(layout, target.project, release)

    def run(commit: str, finding: Finding) -> Judgement:
        return judge.revision(
            layout,
            target.project,
            remote,
            commit,
            python,
            finding,
            snippet,
            settings.timeout,
        )

    narrowed = narrow(
        remote,
        target.project,
        target.site,
        tags.format(version=older),
        tags.format(version=boundary.newer),
        Change.READING,
        reader.reference(target.site),
        run,
    )
    return dataclasses.replace(made, narrowed=(*made.narrowed, narrowed))


# --- the search ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class BisectSettings:
    """What `bisect` was asked, read once from the command line."""

    since: str | None
    until: str | None
    anchor: str | None
    remote: Path | None
    tag_format: str | None
    judge: bool
    tests: bool
    timeout: float


def _within(version: str, since: str | None, until: str | None) -> bool:
    return (since is None or Version(version) >= Version(since)) and (
        until is None or Version(version) <= Version(until)
    )


def _range(since: str | None, until: str | None) -> str:
    return (
        " ".join(f"{word} {value}" for word, value in (("since", since), ("until", until)) if value)
        or "at all"
    )


def case_targets(case: cases.Case, anchor: str | None) -> list[Target]:
    """A case's sites, each in the project its file names, searched from the case's pinned
    release (or `anchor`) in its own project and from the newest in another."""
    if not case.carries:
        raise WorkspaceError(
            f"cases/{case.name}.toml names no site ([[carries]]): add the one its fix removes"
        )
    targets = []
    for site in case.carries:
        project = presence.project_of(site, case.project)
        home = project == case.project
        targets.append(Target(site, project, (anchor or case.pin.version) if home else None))
    return targets


def judged(
    layout: Layout,
    case: cases.Case,
    made: SiteHistory,
    settings: BisectSettings,
    checks: dict[str, tuple[CheckRecord, ...]],
) -> SiteHistory:
    """`made` with the case's tests run on its boundary releases (`checks` keeps them per
    version, for the case's other sites)."""
    edges = (made.before_first, made.first, made.last, made.after_last)
    boundaries = {version for version in edges if version is not None}
    for version in sorted(boundaries - set(checks), key=Version):
        workdir = layout.new_run_dir(f"bisect-{layout.case}")
        found = test_patch.other_release_checks(layout, case, workdir, version, settings.timeout)
        checks[version] = tuple(check.record() for check in found)
    releases = tuple(
        dataclasses.replace(release, judged=checks.get(release.version, ()))
        for release in made.releases
    )
    return dataclasses.replace(made, releases=releases)


def judged_boundaries(
    reader: Reader, target: Target, made: SiteHistory, snippet: Path | None, timeout: float
) -> SiteHistory:
    """Where the site's reads begin, judged by running, between the text's first release and
    the anchor (which must read): bisected on "device read", a release that runs its line
    without one, or does not run here, counting as before the reads. The boundary is judged
    where the release before the oldest that reads ran and read nothing (or, before the text's
    first release, lacks the line); else it stays the text's, with the runs tried. Where the
    anchor runs the line without a read (a newer release of another project hands it a number),
    the text's first release is run: where it reads, the reads began there, judged, and the
    boundary says that the anchor's line reads nothing."""
    releases = reader.releases(target.project)
    versions = [r.version for r in releases]
    runs: dict[int, Judgement] = {}

    def verdict(index: int) -> ProbeVerdict:
        if index not in runs:
            release = releases[index]
            finding = reader.finding(target.project, release, target.site)
            runs[index] = judge.release(
                reader.layout,
                target.project,
                release.version,
                release.sdist,
                finding,
                snippet,
                timeout,
            )
        return runs[index].verdict

    first, anchor = versions.index(made.first), versions.index(made.anchor)
    boundary = first_boundary(made.before_first, made.first, Decided.TEXT)
    if verdict(anchor) == ProbeVerdict.READ:
        # The text's first release first: where it reads already, nothing between is run.
        low, high = first, first if verdict(first) == ProbeVerdict.READ else anchor
        while low < high:
            middle = (low + high) // 2
            low, high = (
                (low, middle) if verdict(middle) == ProbeVerdict.READ else (middle + 1, high)
            )
        if high == first or verdict(high - 1) == ProbeVerdict.NO_READ:
            older = versions[high - 1] if high > 0 else None
            boundary = first_boundary(older, versions[high], Decided.JUDGED)
        else:
            boundary = first_boundary(
                made.before_first, made.first, Decided.TEXT, reading=versions[high]
            )
    elif runs[anchor].verdict == ProbeVerdict.NO_READ:
        # The line stopped reading before the anchor (its value comes as a number now): where
        # the reads began is judged at the text's first release where it reads, and said with
        # the anchor's quiet line either way.
        ran = verdict(first)
        decided = Decided.JUDGED if ran == ProbeVerdict.READ else Decided.TEXT
        quiet = (versions[anchor], ran)
        boundary = first_boundary(made.before_first, made.first, decided, quiet=quiet)
    judged = tuple(runs[i] for i in sorted(runs))
    return dataclasses.replace(made, boundaries=(dataclasses.replace(boundary, judged=judged),))


def first_boundary(
    older: str | None,
    newer: str,
    decided: Decided,
    reading: str | None = None,
    quiet: tuple[str, ProbeVerdict] | None = None,
) -> Boundary:
    """Where the reads begin, with the words a draft says it in: a judged boundary is the
    release alone (the run is the evidence, not a reader's concern), unless `quiet` names a newer
    release that runs the line without a device read; one the source text decided says so, since
    a reader should weigh it. `reading`: the oldest release a run saw read, where the releases
    before it could not be judged; `quiet`: that newer release, and the verdict on `newer`."""
    if decided == Decided.JUDGED:
        if not quiet:
            return Boundary("first", older, newer, decided, newer)
        how = f"{quiet[0]} runs the line without a device read"
    elif reading:
        how = (
            f"by the source text; run under a sync detector, {reading} reads there, and the"
            " releases before it could not be run on CPU"
        )
    elif quiet:
        how = (
            f"by the source text; run under a sync detector, {quiet[0]} runs the line without"
            f" a device read; {newer}: {quiet[1]}"
        )
    else:
        how = "by the source text, not run"
    return Boundary("first", older, newer, decided, f"{newer} ({how})")


def bisect_sites(
    layout: Layout,
    reader: Reader,
    targets: list[Target],
    settings: BisectSettings,
    case: cases.Case | None,
) -> BisectResult:
    """Each target's history, narrowed to a commit in the home project's `--remote`, judged by
    the case's tests where asked."""
    measured_against = provenance.inputs(layout) if case else provenance.workspace_inputs(layout)
    home = case.project if case else targets[0].project
    tags = settings.tag_format or (tag_format(case.pin) if case else DEFAULT_TAG_FORMAT)
    checks: dict[str, tuple[CheckRecord, ...]] = {}
    histories = []
    for target in targets:
        made = history(reader, target)
        if settings.remote and target.project == home:
            boundaries = (
                (made.before_first, made.first, Change.ADDED),
                (made.last, made.after_last, Change.REMOVED),
            )
            narrowed = tuple(
                narrow(
                    settings.remote,
                    home,
                    target.site,
                    tags.format(version=older),
                    tags.format(version=newer),
                    change,
                    reader.reference(target.site),
                )
                for older, newer, change in boundaries
                if older and newer
            )
            made = dataclasses.replace(made, narrowed=narrowed)
        if settings.tests and case and target.project == home:
            made = judged(layout, case, made, settings, checks)
        if settings.judge:
            snippet = judge.snippet_of(layout, case)
            made = judged_boundaries(reader, target, made, snippet, settings.timeout)
            if settings.remote and target.project == home:
                made = narrow_reads(layout, reader, target, made, settings, tags, snippet)
        else:
            boundary = first_boundary(made.before_first, made.first, Decided.TEXT)
            made = dataclasses.replace(made, boundaries=(boundary,))
        histories.append(made)
    return BisectResult(
        stamp=provenance.stamp(layout, measured_against),
        index=sdists.index_url(),
        sites=tuple(histories),
    )
