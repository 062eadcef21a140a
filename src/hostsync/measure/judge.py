"""A site judged by running it: its line, in one release, under the sync detector.

The engine side of `hostsync.measure.probe`: the release's sdist unpacked as a tree, the environment
that fits the release (built when none does), the probe run there as its own process group, and
its run turned into a verdict: "device read", "line present, no device read", or "not run" with
the reason (the release does not install here, the probe failed on it, or never reached the
line). `bisect --judge`, `test_patch --release` and `watch --tests` judge the same way.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import tarfile
import tempfile
from pathlib import Path, PurePosixPath

from hostsync.launch.processes import Run, RunFailed, run_group
from hostsync.measure import probe
from hostsync.measure.records import Judgement, ProbeReport, ProbeVerdict
from hostsync.upstream import envs
from hostsync.upstream.git import git
from hostsync.upstream.presence import lines_run
from hostsync.upstream.records import Finding
from hostsync.upstream.sdists import fetch_sdist
from hostsync.upstream.trees import Tree
from hostsync.workspace import cases
from hostsync.workspace.cases import Sdist
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import Project
from hostsync.workspace.records import TreeRole


def snippet_of(layout: Layout, case: cases.Case | None) -> Path | None:
    """The case's one-process snippet, the probe of a site no generated call reaches."""
    return layout.repro / case.card.repro.snippet if case and case.card.repro.snippet else None


def release(
    layout: Layout,
    project: Project,
    version: str,
    sdist: Sdist,
    finding: Finding,
    snippet: Path | None,
    timeout: float,
) -> Judgement:
    """The site's lines (as `finding` places them) run under the detector on `version`, in an
    environment built for it: a release older than the pinned one beside the other pinned
    projects of its day (`envs.companions_of_its_day`)."""
    beside: tuple[str, ...] = ()
    try:
        companions = envs.companions_of_its_day(layout, project, version)
        beside = tuple(f"{name} {at}" for name, at in sorted(companions.items()))
        python = envs.python_for(
            layout, project, cases.Release(version, f"v{version}", sdist), companions=companions
        )
    except WorkspaceError as error:
        what = " then ".join(words for _, words in _probes(finding, snippet)) or "no probe"
        return Judgement(
            version, ProbeVerdict.NOT_RUN, what, f"does not install here: {error}", beside
        )
    root = probe.unpacked(
        fetch_sdist(layout, sdist), layout.work / "probes" / f"{project.name}-{version}"
    )
    judged = tree(layout, project, version, root, python, finding, snippet, timeout)
    return dataclasses.replace(judged, beside=beside)


def revision(
    layout: Layout,
    project: Project,
    repo: Path,
    commit: str,
    python: str,
    finding: Finding,
    snippet: Path | None,
    timeout: float,
) -> Judgement:
    """The site's lines run under the detector at `commit` of the git repository `repo`, with
    the interpreter `python` (the environment of the release after it)."""
    root = layout.work / "probes" / f"{project.name}-{commit[:12]}"
    if not root.exists():
        partial = root.with_name(root.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        partial.mkdir(parents=True)
        with tempfile.NamedTemporaryFile(suffix=".tar") as archive:
            git(repo, "archive", "--format=tar", f"--output={archive.name}", commit)
            with tarfile.open(archive.name) as tar:
                tar.extractall(partial, filter="data")
        partial.rename(root)
    return tree(layout, project, commit[:12], root, python, finding, snippet, timeout)


# TorchScript off: a release that scripts functions at import (DeepSpeed's MoE gating, which
# accelerate imports) would compile them inside the scope, where the detector's observed torch
# functions are no builtins TorchScript knows; eager, they are judged like any other code.
_EAGER = {"PYTORCH_JIT": "0"}


def _probes(finding: Finding, snippet: Path | None) -> list[tuple[list[str], str]]:
    """The probes to try, in order, as their options and in words: a generated call of the
    site's function where it is a function of its module, then the case's snippet."""
    function = finding.found[0].function if finding.found else ""
    probes = []
    if function and "." not in function:
        probes.append((["--function", function], f"a generated call of {function}"))
    if snippet is not None:
        probes.append((["--snippet", str(snippet)], f"the snippet {snippet.name}"))
    return probes


def tree(
    layout: Layout,
    project: Project,
    label: str,
    root: Path,
    python: str,
    finding: Finding,
    snippet: Path | None,
    timeout: float,
) -> Judgement:
    """The site's lines run under the detector in the source tree `root` (`label`: its
    release or commit), by the interpreter `python`, each probe as a process group of its
    own until one runs: a generated call may fail where the snippet runs."""
    probes = _probes(finding, snippet)
    if not finding.found or not probes:
        reason = "its source lacks the site" if not finding.found else "a method and no snippet"
        return Judgement(label, ProbeVerdict.NOT_RUN, "no probe", reason)
    at = finding.found[0]
    file = str(PurePosixPath(at.file).relative_to(PurePosixPath(project.import_root)))
    source = Tree(f"probe-{label}", TreeRole.RELEASE, root, label, "", "probed", project, python)
    text = (root / at.file).read_text(errors="replace")
    lines = sorted(
        {n for place in finding.found if place.file == at.file for n in lines_run(text, place.line)}
    )
    tried = []
    for options, what in probes:
        run = Run(layout.new_run_dir(f"probe-{project.name}-{label}"), source, layout)
        out = run.run_dir / "probe.json"
        command = [
            python,
            "-m",
            "hostsync.measure.probe",
            "--file",
            file,
            "--out",
            str(out),
            *options,
            "--lines",
            *map(str, lines),
        ]
        try:
            status = run_group(run, command, timeout=timeout, env=_EAGER)
        except RunFailed as error:
            judged = Judgement(label, ProbeVerdict.NOT_RUN, what, str(error))
        else:
            failed = f"the probe exited with status {status}: see {run.log_file}"
            seen = ProbeReport.from_json(json.loads(out.read_text())) if out.exists() else None
            judged = (
                verdict_of(label, what, seen, lines)
                if status == 0 and seen
                else Judgement(label, ProbeVerdict.NOT_RUN, what, failed)
            )
        if judged.verdict != ProbeVerdict.NOT_RUN:
            return judged
        tried.append(judged)
    reasons = "; ".join(
        f"{run.probe}: {run.reason}" if len(tried) > 1 else run.reason for run in tried
    )
    return Judgement(label, ProbeVerdict.NOT_RUN, " then ".join(w for _, w in probes), reasons)


def verdict_of(version: str, what: str, seen: ProbeReport, lines: list[int]) -> Judgement:
    """A probe's run as a verdict: a read at one of the site's `lines`, a line that ran and
    read nothing, or not run (an error, or the lines never reached)."""
    if seen.error:
        return Judgement(version, ProbeVerdict.NOT_RUN, what, seen.error)
    if not seen.reached:
        return Judgement(
            version,
            ProbeVerdict.NOT_RUN,
            what,
            f"the probe did not reach line {_spans(lines)}",
        )
    read = [r for r in seen.reads if int(r.rpartition(":")[2]) in seen.reached]
    verdict = ProbeVerdict.READ if read else ProbeVerdict.NO_READ
    return Judgement(version, verdict, what, "; ".join(read) or "ran, read nothing")


def _spans(lines: list[int]) -> str:
    """Sorted line numbers as runs: `287-292, 300`."""
    runs: list[list[int]] = []
    for line in lines:
        if runs and line == runs[-1][-1] + 1:
            runs[-1].append(line)
        else:
            runs.append([line])
    return ", ".join(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]) for run in runs)
