"""Small results made by hand, typed as the commands make them: inputs for the tests of what
reads results (review, the reports, storage). The real ones come from the commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from hostsync.detector.sites import AllowRule
from hostsync.history.bisect import first_boundary
from hostsync.history.records import BisectResult, Decided, ReleaseEvidence, SiteHistory
from hostsync.hunt.records import HuntResult, HuntSetup
from hostsync.launch.processes import ENGINE_SRC
from hostsync.measure import provenance
from hostsync.measure.records import (
    CheckRecord,
    CostComparison,
    FixAssessment,
    FixVerdict,
    Outcome,
    ReproResult,
    ScenarioRow,
    SnippetRuns,
    TestOutcome,
    TestPatchResult,
    Verdict,
)
from hostsync.profiling.records import (
    Capture,
    ProfiledScenario,
    ProfileResult,
    RegionLabels,
    StepFigures,
    Timeline,
)
from hostsync.sites.records import HuntTree
from hostsync.upstream.records import Finding, Presence
from hostsync.workspace import cases
from hostsync.workspace.files import sha256
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import Environment, TreeInfo

ENVIRONMENT = Environment(
    python="3.11.7", packages={"torch": "2.13.0"}, platform="Linux", device="cpu", device_count=0
)


def case_of(layout: Layout) -> cases.Case:
    """The case `layout` names, read as a command reads it once."""
    return cases.load(layout.root, layout.case)


# Runs a command as `python -m hostsync` does, and prints the case of each call of
# `cases.load` it made (in any thread), seen by Python's profiler hook: the real reader runs.
_COUNT_CARD_READS = """
import atexit, json, runpy, sys, threading
loads = []
def seen(frame, event, arg):
    code = frame.f_code
    if event == "call" and code.co_name == "load" and code.co_filename.endswith("cases.py"):
        loads.append(frame.f_locals["name"])
sys.setprofile(seen)
threading.setprofile(seen)
atexit.register(lambda: print("card reads:", json.dumps(loads)))
sys.argv = ["hostsync", *sys.argv[1:]]
runpy.run_module("hostsync", run_name="__main__")
"""


def card_reads(layout: Layout, *argv: str) -> tuple[int, list[str]]:
    """Run `python -m hostsync ARGV` in the workspace `layout`: its exit status, and the case
    of each card it read (`cases.load`), one entry per read."""
    env = os.environ | {"HOSTSYNC_ROOT": str(layout.root), "PYTHONPATH": str(ENGINE_SRC)}
    done = subprocess.run(
        [sys.executable, "-c", _COUNT_CARD_READS, *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    line = next(line for line in done.stdout.splitlines() if line.startswith("card reads:"))
    return done.returncode, json.loads(line.removeprefix("card reads:"))


def info(version: str) -> TreeInfo:
    return TreeInfo(
        project="transformers",
        version=version,
        commit="0" * 40,
        origin="made",
        src="work/trees/x/src",
    )


def stamp(layout: Layout):
    return provenance.stamp(layout, provenance.inputs(layout))


def row(tree: str, ranks: int, syncs: int, scenario: str = "all_tokens") -> ScenarioRow:
    return ScenarioRow(tree, "sp_loss.py", ranks, scenario, host_syncs=syncs)


def verdict(stalls: tuple[float, float], kernels: tuple[float, float]) -> CostComparison:
    """The fix judged on the scenario `repro` runs, from stalls and kernels per step."""
    judged = FixAssessment(
        FixVerdict.SAVES_IDLE, stalls, stalls, kernels, (0.0, 0.0), (0.0, 0.0), "", ""
    )
    return CostComparison("sp_loss.py", 2, "all_tokens", "pinned", "patched", judged)


def repro(
    layout: Layout,
    runs: tuple[ScenarioRow, ...],
    snippet_output: dict[str, str] | None = None,
    verdicts: tuple[CostComparison, ...] = (),
) -> ReproResult:
    trees = {run.tree: info("5.13.1") for run in runs}
    snippet = layout.repro / "issue_snippet.py"
    runs_of_snippet = (
        SnippetRuns(snippet.name, sha256(snippet), snippet_output) if snippet_output else None
    )
    return ReproResult(
        stamp(layout),
        ENVIRONMENT,
        trees,
        {"all_tokens": "every rank"},
        runs,
        (),
        snippet=runs_of_snippet,
        verdicts=verdicts,
    )


def check(
    label: str,
    verdict: Verdict,
    *tests: TestOutcome,
    expected: str = "all pass",
    name: str = "series tests",
) -> CheckRecord:
    counts: dict[str, int] = {}
    for test in tests:
        counts[test.outcome.value] = counts.get(test.outcome.value, 0) + 1
    return CheckRecord(name, label, None, expected, verdict, "", counts, tests, 1.0)


def failed(message: str, test: str = "T::test_sync") -> TestOutcome:
    return TestOutcome(test, Outcome.FAILED, message)


def test_patch(layout: Layout, *checks: CheckRecord) -> TestPatchResult:
    ok = all(c.verdict != Verdict.WRONG for c in checks)
    return TestPatchResult(stamp(layout), ok, checks)


def capture(tree: str, host_reads: int, in_forward: int = 0) -> Capture:
    ops = {"aten::_local_scalar_dense": host_reads, "aten::item": 0, "aten::is_nonzero": 0}
    forward = dict.fromkeys(ops, 0) | {"aten::_local_scalar_dense": in_forward}
    timeline = Timeline(
        ((0.1, 0.5),), tuple(0.6 + i / 10 for i in range(host_reads)), None, None, 1.0
    )
    figures = StepFigures(1.0, ops, forward, None, None, None, None, timeline)
    return Capture(
        tree,
        "5.13.1",
        "0" * 40,
        "gloo",
        2,
        "cpu",
        "torch",
        "python x.py",
        1.0,
        (f"{tree}-gloo-ws2-rank0.trace.json.gz",),
        per_step=figures,
    )


def profile(layout: Layout, *captures: Capture) -> ProfileResult:
    return ProfileResult(
        stamp(layout),
        ENVIRONMENT,
        {c.tree: info(c.version) for c in captures},
        ProfiledScenario("all_tokens", 2),
        RegionLabels("loss aggregation", "model forward"),
        2,
        3,
        (),
        captures,
    )


def hunt(layout: Layout, *trees: HuntTree) -> HuntResult:
    setup = HuntSetup(
        world_size=2,
        sp_size=2,
        model="m",
        device="cpu",
        backend="gloo",
        versions={"python": "3.11.7"},
    )
    return HuntResult(stamp=stamp(layout), setup=setup, allowlist=(), trees=trees)


def bisect(layout: Layout, first: str) -> BisectResult:
    """A bisect of one sp-loss site, there from `first` on, absent in 4.57.6 before it."""
    site = AllowRule("transformers/integrations/deepspeed.py", "sp-loss", code="max(")
    releases = (
        ReleaseEvidence("4.57.6", "2026-01-16", "0" * 64, Finding(Presence.ABSENT)),
        ReleaseEvidence(first, "2026-01-26", "1" * 64, Finding(Presence.PRESENT)),
    )
    boundary = first_boundary("4.57.6", first, Decided.TEXT)
    history = SiteHistory(
        "transformers",
        site,
        ("4.57.6", first),
        first,
        first,
        first,
        "4.57.6",
        None,
        True,
        (),
        releases,
        boundaries=(boundary,),
    )
    return BisectResult(stamp(layout), "https://pypi.org/simple", (history,))
