"""`test-patch`: the red/green proof that a case's series fixes what its own tests check.

The tests the series adds run the way upstream's CI runs them (pytest at the tree root, the
tree's package first on the path, in the environment that fits the tree's release) on three
trees: the pinned release with only the test patches, where the tests the case card names
`red_on_pinned` must fail on an assertion (one that passes there proves nothing); the patched
tree; and upstream's own fixed release with the test patches, when one exists, where all must
pass. Beside them: upstream's tests near the change, when the tree has them (a git clone does, a
PyPI sdist may not), and the project's own linters, at the versions the tree pins, on the files
the series touches. Another release (`--release`) is judged from its source: red where it
carries the case's sites, green where not; where the code the tests import or exercise is not in
it, its checks are "not comparable", which fails nothing.
"""

from __future__ import annotations

import logging
import shutil
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

from hostsync.detector.words import counted
from hostsync.launch.processes import Run, run_group
from hostsync.measure import cost, judge, linters, provenance
from hostsync.measure.records import (
    CheckRecord,
    Outcome,
    ProbeVerdict,
    TestOutcome,
    TestPatchResult,
    TreeRef,
    Verdict,
)
from hostsync.upstream import harness, patchqueue, presence
from hostsync.upstream.git import read_state
from hostsync.upstream.records import Presence, UpstreamTests
from hostsync.upstream.releases import from_sdist, release_for
from hostsync.upstream.trees import Tree, prepare_tree
from hostsync.workspace import cases, results, table
from hostsync.workspace.errors import WorkspaceError, last_line
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import TreeRole

log = logging.getLogger(__name__)

PASSED, FAILED, ERROR, SKIPPED = Outcome.PASSED, Outcome.FAILED, Outcome.ERROR, Outcome.SKIPPED
_JUNIT_OUTCOMES = {"failure": FAILED, "error": ERROR, "skipped": SKIPPED}
OK, WRONG, NOT_APPLICABLE = Verdict.OK, Verdict.WRONG, Verdict.NOT_APPLICABLE
NOT_COMPARABLE = Verdict.NOT_COMPARABLE
HEADERS = ("check", "tree", "passed", "failed", "skipped", "expected", "verdict", "reason")
# The check of the series' tests, and the tree where they run without the fix (its test patches).
SERIES, RED_TREE = "series tests", f"{TreeRole.PINNED.value}+tests"


@dataclass(frozen=True)
class Expectation:
    """What a run must show: the tests of `must_fail` fail on an assertion, all others pass."""

    label: str
    must_fail: frozenset[str] = frozenset()
    may_skip: bool = False
    # Failing on the pinned release as well: not the series' doing, shown but not held against it.
    fail_on_pinned: frozenset[str] = frozenset()


GREEN = Expectation("all pass")
PASS_OR_SKIP = Expectation("pass or skip", may_skip=True)


def red(case: cases.Case) -> Expectation:
    """What the pinned release must show: the case's bug-catching tests fail, the rest pass."""
    return Expectation(f"{len(case.red_on_pinned)} fail, rest pass", must_fail=case.red_on_pinned)


@dataclass
class Check:
    """One row of the summary: what ran on which tree, what it must show, and whether it did."""

    name: str
    label: str  # the tree asked for; `tree` stays None when it could not be made
    expected: str
    tree: Tree | None = None
    verdict: Verdict = NOT_APPLICABLE
    reason: str = ""
    tests: list[TestOutcome] = field(default_factory=list)
    seconds: float = 0.0

    def row(self) -> list[object]:
        counts = Counter(t.outcome for t in self.tests)
        return [
            self.name,
            self.label,
            counts[PASSED],
            counts[FAILED] + counts[ERROR],
            counts[SKIPPED],
            self.expected,
            self.verdict,
            _shorten(self.reason, 110),
        ]

    def record(self) -> CheckRecord:
        tree = self.tree
        return CheckRecord(
            check=self.name,
            label=self.label,
            tree=TreeRef(tree.version, tree.commit, tree.origin) if tree else None,
            expected=self.expected,
            verdict=self.verdict,
            reason=self.reason,
            counts={o.value: n for o, n in Counter(t.outcome for t in self.tests).items()},
            tests=tuple(self.tests),
            seconds=round(self.seconds, 1),
        )


@contextmanager
def measured(check: Check) -> Iterator[Check]:
    """Times the check; an error that stops it becomes its WRONG verdict, not the session's end,
    except a missing harness, which no other check could get past either."""
    started = time.monotonic()
    try:
        yield check
    except MissingHarness:
        raise
    except WorkspaceError as error:
        check.verdict, check.reason = WRONG, str(error)
    finally:
        check.seconds = time.monotonic() - started


# --- reading and judging a pytest run ------------------------------------------------------------


def read_junit(path: Path) -> list[TestOutcome]:
    """Each test case of a pytest junit report, with its outcome."""
    found = []
    for case in ElementTree.parse(path).getroot().iter("testcase"):
        test = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}".lstrip(":")
        outcome, message = PASSED, ""
        for child in case:
            if child.tag in _JUNIT_OUTCOMES:
                outcome = _JUNIT_OUTCOMES[child.tag]
                message = _first_line(child.get("message") or child.text or "")
                break
        found.append(TestOutcome(test, outcome, message))
    return found


def verdict_of(
    expect: Expectation,
    tests: Sequence[TestOutcome],
    returncode: int,
) -> tuple[Verdict, str]:
    """The verdict on one pytest run, and why."""
    if not tests:
        # pytest's 5; upstream's conftest.py turns it into 0, so the report is what counts.
        return WRONG, f"nothing collected (pytest exit code {returncode}): no test ran"
    collected = {t.test for t in tests}
    problems = [f"{name} was not collected" for name in sorted(expect.must_fail - collected)]
    not_ours = sorted(
        t.test for t in tests if t.outcome in (FAILED, ERROR) and t.test in expect.fail_on_pinned
    )
    for test in tests:
        if test.test in not_ours:
            continue
        if test.test in expect.must_fail:
            if not (test.outcome == FAILED and test.message.startswith("AssertionError")):
                problems.append(f"{test.test} {_describe(test)}: it proves nothing")
        elif test.outcome == SKIPPED and not expect.may_skip:
            problems.append(f"{test.test} {_describe(test)}: a skipped test proves nothing")
        elif test.outcome in (FAILED, ERROR):
            problems.append(f"{test.test} {_describe(test)}")
    if problems:
        return WRONG, "; ".join(problems)
    ran = sum(t.outcome == PASSED for t in tests)
    if expect.must_fail:
        return OK, f"the bug's {len(expect.must_fail)} fail on assertions, the other {ran} pass"
    skipped = sorted({t.message for t in tests if t.outcome == SKIPPED})
    said = [f"{ran} ran and passed" if skipped or not_ours else f"all {ran} passed"]
    if not_ours:
        names = ", ".join(not_ours)
        said.append(f"{len(not_ours)} fail on the pinned release, not the series': {names}")
    if skipped:
        said.append(f"skipped: {'; '.join(skipped)}")
    return OK, "; ".join(said)


def _describe(test: TestOutcome) -> str:
    if test.outcome == PASSED:
        return "passed"
    if test.outcome == SKIPPED:
        return f"was skipped ({test.message})"
    if test.outcome == FAILED and not test.message.startswith("AssertionError"):
        return f"failed without an assertion ({test.message})"
    return f"{test.outcome}: {test.message}"


# --- running pytest and ruff in a tree -----------------------------------------------------------


def pytest_in_tree(
    tree: Tree, paths: Sequence[str], run: Run, timeout: float
) -> tuple[int, list[TestOutcome]]:
    """Run pytest on `paths` at the tree root: its exit code and the junit report's results."""
    report = run.run_dir / "junit.xml"
    command = [
        tree.python,
        "-m",
        "pytest",
        *paths,
        f"--junitxml={report}",
        "-p",
        "no:cacheprovider",
    ]
    env = dict(tree.project.test_env)
    returncode = run_group(run, command, timeout=timeout, cwd=tree.root, env=env)
    if not report.exists():
        raise WorkspaceError(
            f"pytest exited with status {returncode} and wrote no report in {tree.label}:"
            f" see {run.log_file}"
        )
    return returncode, read_junit(report)


def touched_files(patches: Sequence[Path]) -> list[str]:
    return sorted({path for patch in patches for path in patchqueue.touched_files(patch)})


# --- the checks ----------------------------------------------------------------------------------


def series_tests(layout: Layout) -> list[Path]:
    return [p for p in patchqueue.series(layout) if patchqueue.touches_only_tests(p)]


def series_test_files(test_patches: Sequence[Path]) -> list[str]:
    return [f for f in touched_files(test_patches) if Path(f).name.startswith("test_")]


def check_tests(
    case: cases.Case,
    workdir: Path,
    label: str,
    expect: Expectation,
    timeout: float,
    *,
    optional: bool = False,
    tests_from: UpstreamTests | None = None,
) -> Check:
    """The series' tests on tree `label`; a series that does not apply is n/a when `optional`.
    `tests_from`: upstream's tests/ copied into the tree first (`harness`)."""
    check = Check(SERIES, label, expect.label)
    layout = case.layout
    with measured(check):
        try:
            check.tree = prepare_tree(case, label, tests_from)
        except patchqueue.PatchDoesNotApply as error:
            if not optional:
                raise
            check.reason = f"does not apply: {error}"
            return check
        check.label = check.tree.label
        test_patches = series_tests(layout)
        if not test_patches:
            raise WorkspaceError("the series has no test patch: nothing to prove with")
        refuse_without_harness(case, check.tree)
        run = Run(workdir / _safe(check.label) / "series", check.tree, layout)
        paths = case.card.tests.select or series_test_files(test_patches)
        returncode, check.tests = pytest_in_tree(check.tree, paths, run, timeout)
        check.verdict, check.reason = verdict_of(expect, check.tests, returncode)
    return check


class MissingHarness(WorkspaceError):
    """The trees lack upstream's test harness: every check of the series would fail alike."""


def refuse_without_harness(case: cases.Case, tree: Tree) -> None:
    """The series' tests run on upstream's harness (the card's `[tests] harness`): a tree that
    lacks it, as one made from an sdist does, cannot run them as upstream does."""
    missing = [path for path in case.card.tests.harness if not (tree.root / path).exists()]
    if missing:
        raise MissingHarness(
            f"no upstream test harness in {tree.label} ({', '.join(missing)} missing):"
            f" pass a clone of {tree.project.repository} with --remote PATH"
        )


def check_neighbours(
    layout: Layout,
    case: cases.Case,
    workdir: Path,
    trees: Sequence[Tree],
    timeout: float,
) -> list[Check]:
    """Upstream's tests near the change on the pinned tree, then on the patched one: run,
    skipped (why) or absent. Those failing on both are shown, not held against the series."""
    pinned, patched = trees
    neighbours = case.card.tests.neighbours
    present = [p for p in neighbours if (patched.root / p.split("::")[0]).exists()]
    if not present:
        check = Check("upstream tests", patched.label, PASS_OR_SKIP.label, patched)
        check.reason = f"absent: this tree has no {', '.join(neighbours) or 'such tests'}"
        if neighbours and from_sdist(patched.origin):
            check.reason += f" (pass a clone of {patched.project.repository} with --remote PATH)"
        return [check]
    baseline = Check("upstream tests", pinned.label, "baseline", pinned)
    expect = PASS_OR_SKIP
    with measured(baseline):
        run = Run(workdir / _safe(pinned.label) / "neighbours", pinned, layout)
        returncode, baseline.tests = pytest_in_tree(pinned, present, run, timeout)
        failing = frozenset(t.test for t in baseline.tests if t.outcome in (FAILED, ERROR))
        # The release as it is: what fails here is judged on the patched tree as not the series'.
        expect = replace(PASS_OR_SKIP, fail_on_pinned=failing)
        baseline.verdict, baseline.reason = verdict_of(expect, baseline.tests, returncode)
    check = Check("upstream tests", patched.label, expect.label, patched)
    with measured(check):
        run = Run(workdir / _safe(patched.label) / "neighbours", patched, layout)
        returncode, check.tests = pytest_in_tree(patched, present, run, timeout)
        check.verdict, check.reason = verdict_of(expect, check.tests, returncode)
        absent = [p for p in neighbours if p not in present]
        if absent:
            check.reason += f"; absent here: {', '.join(absent)}"
    return [baseline, check]


def check_lint(case: cases.Case, workdir: Path, tree: Tree) -> Check:
    """The project's own linters, at the tree's pinned versions and with its config, on the
    Python files the series touches."""
    check = Check("lint", tree.label, "clean", tree)
    layout = case.layout
    with measured(check):
        files = [f for f in touched_files(patchqueue.series(layout)) if f.endswith(".py")]
        steps = linters.steps(layout, tree, case.card.lint, workdir / "lint")
        check.name = ", ".join(dict.fromkeys(step.tool for step in steps))
        failures = []
        for step in steps:
            run = Run(workdir / "lint" / step.slug, tree, layout)
            status = run_group(
                run, [*step.command, *files], timeout=300, cwd=tree.root, env=step.env
            )
            message = "" if status == 0 else last_line(run.log_file.read_text())
            check.tests.append(TestOutcome(step.name, PASSED if status == 0 else FAILED, message))
            if status != 0:
                failures.append(f"{step.name}: {message} (see {run.log_file})")
        check.verdict = WRONG if failures else OK
        check.reason = "; ".join(failures) or f"{counted(len(files), 'file')}: {', '.join(files)}"
    return check


def release_expectation(
    layout: Layout,
    case: cases.Case,
    version: str,
    timeout: float | None = None,
) -> tuple[Expectation | None, str]:
    """What the series' tests must show on another release, read from its source: red where it
    carries the case's sites, green where the code they lie in is there without them; and where
    a site lives when not where the card names it. None, and why, where the tests cannot judge
    the release: the code they import or exercise is not in it. With `timeout`, the sites its
    source carries are judged by running them (`hostsync.measure.judge`), as bisect --judge does:
    green where each line runs there without a device read."""
    release = release_for(case, version)
    sources = presence.sdist_sources(layout, release.sdist, case.project)
    where = f"{case.project.name} {version}"
    texts = [
        text
        for patch in series_tests(layout)
        for path, text in patchqueue.added_files(patch).items()
        if path.endswith(".py")
    ]
    lacking = [
        f"the series' tests import {name}, which {where} lacks"
        for name in presence.undefined_imports(texts, sources, case.project)
    ]
    own = [rule for rule in case.carries if presence.project_of(rule, case.project) == case.project]
    findings = [presence.locate(rule, sources, case.project) for rule in own]
    lacking += [
        f"{where} has no {presence.described(rule)}, nor the code it lies in"
        for rule, finding in zip(own, findings, strict=True)
        if finding.presence == Presence.MISSING
    ]
    elsewhere = [
        presence.located(at)
        for finding in findings
        if finding.presence == Presence.ELSEWHERE
        for at in finding.found
    ]
    moved = [f"in {where} the case's sites live in {', '.join(dict.fromkeys(elsewhere))}"]
    said = "; ".join(lacking + (moved if elsewhere else []))
    if lacking:
        return None, said
    carried = [finding for finding in findings if finding.presence.carried]
    if timeout is None or not carried:
        return (red(case) if carried else GREEN), said
    snippet = judge.snippet_of(layout, case)
    runs = [
        judge.release(layout, case.project, version, release.sdist, finding, snippet, timeout)
        for finding in carried
    ]
    judged = [f"judged by running {run.probe}: {run.verdict} ({run.reason})" for run in runs]
    said = "; ".join(part for part in (said, *judged) if part)
    no_read = all(run.verdict == ProbeVerdict.NO_READ for run in runs)
    return (GREEN if no_read else red(case)), said


def other_release_checks(
    layout: Layout, case: cases.Case, workdir: Path, version: str, timeout: float
) -> list[Check]:
    """Whether the series applies to another release, and how its tests go there; neither is
    run where its tests cannot judge that release (not comparable, which is no failure)."""
    expect, said = release_expectation(layout, case, version, timeout)
    if expect is None:
        return [
            Check(
                SERIES,
                f"{version}{extra}",
                "comparable",
                verdict=NOT_COMPARABLE,
                reason=said,
            )
            for extra in ("+series", "+tests")
        ]
    checks = [
        check_tests(case, workdir, f"{version}+series", GREEN, timeout, optional=True),
        check_tests(case, workdir, f"{version}+tests", expect, timeout, optional=True),
    ]
    for check in checks:
        check.reason = "; ".join(part for part in (check.reason, said) if part)
    return checks


def all_checks(
    case: cases.Case,
    versions: Sequence[str],
    timeout: float,
    workdir: Path,
    tests_from: UpstreamTests | None = None,
) -> list[Check]:
    """Every check, in the order of the summary table."""
    layout = case.layout
    checks = [
        check_tests(case, workdir, RED_TREE, red(case), timeout, tests_from=tests_from),
        check_tests(case, workdir, TreeRole.PATCHED.value, GREEN, timeout, tests_from=tests_from),
    ]
    if case.fixed:
        checks.append(check_tests(case, workdir, "fixed+tests", GREEN, timeout))
    pinned, patched = checks[0].tree, checks[1].tree
    if pinned is not None and patched is not None:
        checks += check_neighbours(layout, case, workdir, (pinned, patched), timeout)
    if patched is not None:
        checks.append(check_lint(case, workdir, patched))
    for version in versions:
        checks += other_release_checks(layout, case, workdir, version, timeout)
    return checks


def upstream_tests(case: cases.Case, remote: Path | None) -> UpstreamTests | None:
    """Where the trees' missing tests/ come from: `remote`, for a clone made from an sdist."""
    if remote is None:
        return None
    patchqueue.clone(case)
    origin = read_state(case.layout.clone).origin
    if not from_sdist(origin):
        log.info("the clone is %s, with upstream's own tests/: --remote is not needed", origin)
        return None
    return harness.source(remote, case.pin.tag, origin)


def prove_and_report(
    case: cases.Case,
    versions: Sequence[str],
    timeout: float,
    say: Callable[[str], None] = print,
    remote: Path | None = None,
) -> tuple[int, Path]:
    """Prove, print the summary, write the result file; exit status 1 when a verdict is WRONG."""
    layout = case.layout
    workdir = layout.new_run_dir(f"test-patch-{layout.case}")
    measured_against = provenance.inputs(layout)
    tests_from = upstream_tests(case, remote)
    if tests_from is not None:
        say(
            f"upstream's tests/ from {tests_from.repository} at {tests_from.ref}:"
            f" {tests_from.commit} ({tests_from.committed}); the trees are {tests_from.tree_origin}"
        )
    checks = all_checks(case, versions, timeout, workdir, tests_from)
    wrong = [c for c in checks if c.verdict == WRONG]
    say(table.text(HEADERS, [c.row() for c in checks]))
    say(cost.case_verdicts(layout))
    for check in checks:
        failed = [test for test in check.tests if test.outcome in (FAILED, ERROR)]
        for test in failed:
            say(f"{check.label}: {test.test}\n    {test.message}")
        if check.verdict == WRONG and not failed:
            say(f"{check.label}: {check.reason}")
    result = TestPatchResult(
        stamp=provenance.stamp(layout, measured_against),
        ok=not wrong,
        checks=tuple(c.record() for c in checks),
        upstream_tests=tests_from
        and replace(tests_from, repository=harness.shown(tests_from.repository)),
    )
    path = results.write(layout.profiles, result, keep_elsewhere=layout.unsaved)
    say(f"wrote {path.relative_to(layout.root)}")
    if wrong:
        say(f"{len(wrong)} wrong verdict(s); pytest and lint logs are kept in {workdir}")
    else:
        shutil.rmtree(workdir)
    return (1 if wrong else 0), path


def _safe(label: str) -> str:
    return label.replace("+", "-")


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
