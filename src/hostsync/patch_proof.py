"""`test-patch`: the red/green proof that the series fixes what its own tests check.

The tests the series adds run the way upstream's CI runs them (pytest at the tree root, the
tree's src/ first on the path) on three trees: the pinned release with only the test patches,
where the tests that catch the bug must fail on an assertion (one that passes there proves
nothing); the patched tree; and upstream's own fixed release with the test patches, where all
must pass. Beside them: upstream's tests near the change, when the tree has them (a git clone
does, the PyPI sdist does not), and transformers' own ruff, at the version the tree pins, on the
files the series touches.
"""

from __future__ import annotations

import argparse
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import xml.etree.ElementTree as ElementTree
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from hostsync import results, table, upstream
from hostsync.errors import WorkspaceError, last_line
from hostsync.launch import Run, run_group
from hostsync.layout import Layout
from hostsync.options import add_timeout
from hostsync.pin import load as load_pin

log = logging.getLogger(__name__)

# The series' tests that catch the bug, so must fail on a release that has it. The others check
# behaviour the fix keeps (the weighted mean, the excluded NaN rank) and pass there too.
RED_ON_BUGGY_RELEASE = frozenset(
    {
        "TestDeepSpeedSPComputeLoss::test_no_host_sync_in_loss_aggregation",
        "TestDeepSpeedSPComputeLoss::test_all_masked_batch_gives_zero_loss_that_backpropagates",
    }
)
# Upstream's tests of the code the series changes (only in a git clone, not in the sdist).
NEIGHBOUR_TESTS = ("tests/deepspeed/test_alst_ulysses_sp.py",)
DEFAULT_TIMEOUT_S = 900.0

PASSED, FAILED, ERROR, SKIPPED = "passed", "failed", "error", "skipped"
_JUNIT_OUTCOMES = {"failure": FAILED, "error": ERROR, "skipped": SKIPPED}
OK, WRONG, NOT_APPLICABLE = "ok", "WRONG", "n/a"
HEADERS = ("check", "tree", "passed", "failed", "skipped", "expected", "verdict", "reason")


@dataclass(frozen=True)
class Case:
    """One test case of a pytest run (or one ruff step)."""

    test: str  # Class::method, as in RED_ON_BUGGY_RELEASE
    outcome: str
    message: str = ""  # the failure's first line, or why it was skipped


@dataclass(frozen=True)
class Expectation:
    """What a run must show: the tests of `must_fail` fail on an assertion, all others pass."""

    label: str
    must_fail: frozenset[str] = frozenset()
    may_skip: bool = False


GREEN = Expectation("all pass")
RED = Expectation(f"{len(RED_ON_BUGGY_RELEASE)} fail, rest pass", must_fail=RED_ON_BUGGY_RELEASE)
PASS_OR_SKIP = Expectation("pass or skip", may_skip=True)


@dataclass
class Check:
    """One row of the summary: what ran on which tree, what it must show, and whether it did."""

    name: str
    label: str  # the tree asked for; `tree` stays None when it could not be made
    expected: str
    tree: upstream.Tree | None = None
    verdict: str = NOT_APPLICABLE
    reason: str = ""
    tests: list[Case] = field(default_factory=list)
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

    def record(self) -> dict:
        tree = self.tree
        return {
            "check": self.name,
            "label": self.label,
            "tree": tree and {k: getattr(tree, k) for k in ("version", "commit", "origin")},
            "expected": self.expected,
            "verdict": self.verdict,
            "reason": self.reason,
            "counts": dict(Counter(t.outcome for t in self.tests)),
            "tests": [vars(t) for t in self.tests],
            "seconds": round(self.seconds, 1),
        }


@contextmanager
def measured(check: Check) -> Iterator[Check]:
    """Times the check; an error that stops it becomes its WRONG verdict, not the session's end."""
    started = time.monotonic()
    try:
        yield check
    except WorkspaceError as error:
        check.verdict, check.reason = WRONG, str(error)
    finally:
        check.seconds = time.monotonic() - started


# --- reading and judging a pytest run ------------------------------------------------------------


def read_junit(path: Path) -> list[Case]:
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
        found.append(Case(test, outcome, message))
    return found


def judge(expect: Expectation, tests: Sequence[Case], returncode: int) -> tuple[str, str]:
    """The verdict on one pytest run, and why."""
    if not tests:
        # pytest's 5; upstream's conftest.py turns it into 0, so the report is what counts.
        return WRONG, f"nothing collected (pytest exit code {returncode}): no test ran"
    collected = {t.test for t in tests}
    problems = [f"{name} was not collected" for name in sorted(expect.must_fail - collected)]
    for test in tests:
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
    if skipped:
        return OK, f"{ran} ran and passed; skipped: {'; '.join(skipped)}"
    return OK, f"all {ran} passed"


def _describe(test: Case) -> str:
    if test.outcome == PASSED:
        return "passed"
    if test.outcome == SKIPPED:
        return f"was skipped ({test.message})"
    if test.outcome == FAILED and not test.message.startswith("AssertionError"):
        return f"failed without an assertion ({test.message})"
    return f"{test.outcome}: {test.message}"


# --- running pytest and ruff in a tree -----------------------------------------------------------


def pytest_in_tree(
    tree: upstream.Tree, paths: Sequence[str], run: Run, timeout: float
) -> tuple[int, list[Case]]:
    """Run pytest on `paths` at the tree root: its exit code and the junit report's results."""
    report = run.run_dir / "junit.xml"
    command = [
        sys.executable,
        "-m",
        "pytest",
        *paths,
        f"--junitxml={report}",
        "-p",
        "no:cacheprovider",
    ]
    # The tests start `torchrun`: this environment's, whether or not it is activated.
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    returncode = run_group(run, command, timeout=timeout, cwd=tree.root, env={"PATH": path})
    if not report.exists():
        raise WorkspaceError(
            f"pytest exited with status {returncode} and wrote no report in {tree.label}:"
            f" see {run.log_file}"
        )
    return returncode, read_junit(report)


def pinned_ruff(tree: upstream.Tree) -> str:
    """The ruff version the tree's own `make style` installs."""
    versions = tree.src / "transformers" / "dependency_versions_table.py"
    match = re.search(r'"ruff": "ruff==([^"]+)"', versions.read_text())
    if not match:
        raise WorkspaceError(f"{versions} pins no ruff: lint the tree by hand with `make style`")
    return match[1]


def ruff_executable(layout: Layout, version: str) -> Path:
    """That ruff, installed once into the workspace cache (one binary from PyPI)."""
    target = layout.cache / "tools" / f"ruff-{version}"
    if not target.exists():
        partial = target.with_name(target.name + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        log.info("installing ruff %s into %s", version, target)
        installed = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--target",
                str(partial),
                f"ruff=={version}",
            ],
            capture_output=True,
            text=True,
            timeout=600,
        )
        if installed.returncode != 0:
            shutil.rmtree(partial, ignore_errors=True)
            raise WorkspaceError(
                f"cannot install ruff=={version} ({last_line(installed.stderr)}):"
                " check the network to PyPI and that pip is in this environment"
            )
        partial.rename(target)
    return target / "bin" / "ruff"


def touched_files(patches: Sequence[Path]) -> list[str]:
    return sorted({path for patch in patches for path in upstream.touched_files(patch)})


# --- the checks ----------------------------------------------------------------------------------


def series_tests(layout: Layout) -> list[Path]:
    return [p for p in results.series(layout) if upstream.touches_only_tests(p)]


def series_test_files(test_patches: Sequence[Path]) -> list[str]:
    return [f for f in touched_files(test_patches) if Path(f).name.startswith("test_")]


def check_tests(
    layout: Layout,
    workdir: Path,
    label: str,
    expect: Expectation,
    timeout: float,
    *,
    optional: bool = False,
) -> Check:
    """The series' tests on tree `label`; a series that does not apply is n/a when `optional`."""
    check = Check("series tests", label, expect.label)
    with measured(check):
        try:
            check.tree = upstream.tree(layout, label)
        except upstream.PatchDoesNotApply as error:
            if not optional:
                raise
            check.reason = f"does not apply: {error}"
            return check
        test_patches = series_tests(layout)
        if not test_patches:
            raise WorkspaceError("the series has no test patch: nothing to prove with")
        run = Run(workdir / _safe(label) / "series", check.tree.src, layout)
        paths = series_test_files(test_patches)
        returncode, check.tests = pytest_in_tree(check.tree, paths, run, timeout)
        check.verdict, check.reason = judge(expect, check.tests, returncode)
    return check


def check_neighbours(layout: Layout, workdir: Path, tree: upstream.Tree, timeout: float) -> Check:
    """Upstream's tests near the change on the patched tree: run, skipped (why) or absent."""
    check = Check("upstream tests", tree.label, PASS_OR_SKIP.label, tree)
    with measured(check):
        present = [p for p in NEIGHBOUR_TESTS if (tree.root / p).exists()]
        if not present:
            check.reason = f"absent: this tree has no {', '.join(NEIGHBOUR_TESTS)}"
            return check
        run = Run(workdir / _safe(tree.label) / "neighbours", tree.src, layout)
        returncode, check.tests = pytest_in_tree(tree, present, run, timeout)
        check.verdict, check.reason = judge(PASS_OR_SKIP, check.tests, returncode)
    return check


def check_lint(layout: Layout, workdir: Path, tree: upstream.Tree) -> Check:
    """transformers' ruff, at the tree's pinned version and with its config, on what we touch."""
    check = Check("ruff", tree.label, "clean", tree)
    with measured(check):
        version = pinned_ruff(tree)
        check.name = f"ruff {version}"
        files = [f for f in touched_files(results.series(layout)) if f.endswith(".py")]
        ruff = str(ruff_executable(layout, version))
        failures = []
        for args in (["check"], ["format", "--check"]):
            step = f"ruff {' '.join(args)}"
            run = Run(workdir / "lint" / "-".join(args), tree.src, layout)
            status = run_group(run, [ruff, *args, "--no-cache", *files], timeout=300, cwd=tree.root)
            message = "" if status == 0 else last_line(run.log_file.read_text())
            check.tests.append(Case(step, PASSED if status == 0 else FAILED, message))
            if status != 0:
                failures.append(f"{step}: {message} (see {run.log_file})")
        check.verdict = WRONG if failures else OK
        check.reason = "; ".join(failures) or f"{len(files)} file(s): {', '.join(files)}"
    return check


def other_release_checks(
    layout: Layout, workdir: Path, version: str, reference: str, timeout: float
) -> list[Check]:
    """Whether the series applies to another release, and how its tests go there."""
    tests_expect = GREEN if Version(version) >= Version(reference) else RED
    return [
        check_tests(layout, workdir, f"{version}+series", GREEN, timeout, optional=True),
        check_tests(layout, workdir, f"{version}+tests", tests_expect, timeout, optional=True),
    ]


def all_checks(
    layout: Layout, versions: Sequence[str], timeout: float, workdir: Path
) -> list[Check]:
    """Every check, in the order of the summary table."""
    reference = load_pin(layout.pin_file).reference.version
    checks = [
        check_tests(layout, workdir, "pinned+tests", RED, timeout),
        check_tests(layout, workdir, upstream.PATCHED, GREEN, timeout),
        check_tests(layout, workdir, f"{reference}+tests", GREEN, timeout),
    ]
    patched = checks[1].tree
    if patched is not None:
        checks += [
            check_neighbours(layout, workdir, patched, timeout),
            check_lint(layout, workdir, patched),
        ]
    for version in versions:
        checks += other_release_checks(layout, workdir, version, reference, timeout)
    return checks


def prove_and_report(
    layout: Layout, versions: Sequence[str], timeout: float, say: Callable[[str], None] = print
) -> tuple[int, Path]:
    """Prove, print the summary, write the result file; exit status 1 when a verdict is WRONG."""
    workdir = layout.new_run_dir("test-patch")
    checks = all_checks(layout, versions, timeout, workdir)
    wrong = [c for c in checks if c.verdict == WRONG]
    say(table.text(HEADERS, [c.row() for c in checks]))
    for check in checks:
        for test in check.tests:
            if test.outcome in (FAILED, ERROR):
                say(f"{check.label}: {test.test}\n    {test.message}")
    payload = {
        "reference": load_pin(layout.pin_file).reference.version,
        "ok": not wrong,
        "checks": [c.record() for c in checks],
    }
    path = results.write(layout, "test_patch", payload)
    say(f"wrote {path.relative_to(layout.root)}")
    if wrong:
        say(f"{len(wrong)} wrong verdict(s); pytest and ruff logs are kept in {workdir}")
    else:
        shutil.rmtree(workdir)
    return (1 if wrong else 0), path


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync test-patch",
        description="The series' tests red on the pinned release, green on the patched tree and"
        " on upstream's fixed release; upstream's nearby tests; transformers' ruff.",
    )
    parser.add_argument(
        "--transformers",
        action="append",
        default=[],
        metavar="VERSION",
        help="also try the series on this release (repeatable): does it apply, how do the tests go",
    )
    add_timeout(parser, DEFAULT_TIMEOUT_S, "one pytest run")
    args = parser.parse_args(argv)
    for version in args.transformers:
        if not re.fullmatch(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?", version):
            raise WorkspaceError(
                f"--transformers {version!r} is no release number: use e.g. 5.12.0"
            )
    status, _ = prove_and_report(Layout(), args.transformers, args.timeout)
    return status


def _safe(label: str) -> str:
    return label.replace("+", "-")


def _first_line(text: str) -> str:
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    return lines[0] if lines else ""


def _shorten(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."
