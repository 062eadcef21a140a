"""A site judged by running it: its line, in one release, under the sync detector.

The engine side of `hostsync.probe`: the release's sdist unpacked as a tree, the environment
that fits the release (built when none does), the probe run there as its own process group, and
its run turned into a verdict: "device read", "line present, no device read", or "not run" with
the reason (the release does not install here, the probe failed on it, or never reached the
line). `bisect --judge`, `test_patch --release` and `watch --tests` judge the same way.
"""

from __future__ import annotations

import json
from pathlib import Path, PurePosixPath

from hostsync import cases, envs, probe
from hostsync.cases import Sdist
from hostsync.errors import WorkspaceError
from hostsync.launchers import Run, RunFailed, run_group
from hostsync.layout import Layout
from hostsync.projects import Project
from hostsync.records import Finding, Judgement, ProbeRun, ProbeVerdict, Tree, TreeRole
from hostsync.upstream.sdists import fetch_sdist


def snippet_of(layout: Layout, case: cases.Case | None) -> Path | None:
    """The case's one-process snippet, the probe of a site no generated call reaches."""
    return layout.repro / case.card.repro.snippet if case and case.card.repro.snippet else None


def release(layout: Layout, project: Project, version: str, sdist: Sdist, finding: Finding,
            snippet: Path | None, timeout: float) -> Judgement:  # fmt: skip
    """The site's lines (as `finding` places them) run under the detector on `version`, in an
    environment built for it."""
    if not finding.found:
        return Judgement(version, ProbeVerdict.NOT_RUN, "no probe", "its source lacks the site")
    at = finding.found[0]
    file = str(PurePosixPath(at.file).relative_to(PurePosixPath(project.import_root)))
    function = at.function if "." not in at.function else None
    named = snippet.name if snippet else None
    what = f"a generated call of {function}" if function else f"the snippet {named}"
    not_run = ProbeVerdict.NOT_RUN
    if not function and snippet is None:
        return Judgement(version, not_run, what, "a method and no snippet")
    published = cases.Release(version, f"v{version}", sdist)
    try:
        python = envs.python_for(layout, project, published)
    except WorkspaceError as error:
        return Judgement(version, not_run, what, f"does not install here: {error}")
    root = probe.unpacked(fetch_sdist(layout, sdist),
                          layout.work / "probes" / f"{project.name}-{version}")  # fmt: skip
    tree = Tree(f"probe-{version}", TreeRole.RELEASE, root, version, "",
                "the PyPI sdist", project, python)  # fmt: skip
    run = Run(layout.new_run_dir(f"probe-{project.name}-{version}"), tree, layout)
    out = run.run_dir / "probe.json"
    lines = sorted({place.line for place in finding.found if place.file == at.file})
    command = [python, "-m", "hostsync.probe", "--file", file, "--out", str(out), "--lines",
               *map(str, lines)]  # fmt: skip
    command += ["--function", function] if function else ["--snippet", str(snippet)]
    try:
        status = run_group(run, command, timeout=timeout)
    except RunFailed as error:
        return Judgement(version, not_run, what, str(error))
    if status != 0 or not out.exists():
        return Judgement(version, not_run, what,
                         f"the probe exited with status {status}: see {run.log_file}")  # fmt: skip
    return verdict_of(version, what, ProbeRun.from_json(json.loads(out.read_text())),
                      lines)  # fmt: skip


def verdict_of(version: str, what: str, seen: ProbeRun, lines: list[int]) -> Judgement:
    """A probe's run as a verdict: a read at one of the site's `lines`, a line that ran and
    read nothing, or not run (an error, or the lines never reached)."""
    if seen.error:
        return Judgement(version, ProbeVerdict.NOT_RUN, what, seen.error)
    if not seen.reached:
        return Judgement(version, ProbeVerdict.NOT_RUN, what,
                         f"the probe did not reach line {', '.join(map(str, lines))}")  # fmt: skip
    read = [r for r in seen.reads if int(r.rpartition(":")[2]) in seen.reached]
    verdict = ProbeVerdict.READ if read else ProbeVerdict.NO_READ
    return Judgement(version, verdict, what, "; ".join(read) or "ran, read nothing")
