"""The red/green proof of the series: its verdicts, another release judged from its source, then
the real thing on the real trees."""

from __future__ import annotations

import dataclasses
import json
import sys
import textwrap
from pathlib import Path

import pytest
from local_index import make_sdist, serving

from hostsync.commands import test_patch as proof_command
from hostsync.launch.processes import Run
from hostsync.measure import linters, provenance
from hostsync.measure import test_patch as patch_proof
from hostsync.measure.records import TestOutcome as Case
from hostsync.measure.records import Verdict
from hostsync.measure.test_patch import (
    FAILED,
    GREEN,
    NOT_APPLICABLE,
    OK,
    PASS_OR_SKIP,
    PASSED,
    SKIPPED,
    WRONG,
    verdict_of,
)
from hostsync.upstream import harness, sdists, trees
from hostsync.upstream.git import git, read_state, rev
from hostsync.upstream.trees import Tree
from hostsync.workspace import cases, projects
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import ROOT, Layout
from hostsync.workspace.records import TreeRole

import made
from conftest import make_workspace, own_downloads

CASE = cases.load(ROOT, "sp-loss")
PATCHED = TreeRole.PATCHED.value
SYNC_TEST = "TestDeepSpeedSPComputeLoss::test_no_host_sync_in_loss_aggregation"
ALL_MASKED_TEST = (
    "TestDeepSpeedSPComputeLoss::test_all_masked_batch_gives_zero_loss_that_backpropagates"
)
GUARD_TEST = "TestDeepSpeedSPComputeLoss::test_weighted_mean_matches_full_sequence_loss"
RED = patch_proof.Expectation(
    "2 fail, rest pass", must_fail=frozenset({SYNC_TEST, ALL_MASKED_TEST})
)


def junit(tmp_path: Path, cases: str) -> Path:
    path = tmp_path / "junit.xml"
    path.write_text(f'<testsuites><testsuite name="pytest">{cases}</testsuite></testsuites>')
    return path


def case(name: str, body: str = "") -> str:
    classname = "tests.deepspeed.test_deepspeed_sp_loss." + name.split("::")[0]
    return f'<testcase classname="{classname}" name="{name.split("::")[1]}">{body}</testcase>'


def fake_tree(root: Path, files: dict[str, str]) -> Tree:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(textwrap.dedent(text))
    transformers = projects.get("transformers")
    return Tree("fake", TreeRole.RELEASE, root, "0", "", "a test", transformers, sys.executable)


# --- verdicts ------------------------------------------------------------------------------------


def test_everything_passing_on_the_pinned_tree_proves_nothing(tmp_path: Path) -> None:
    report = junit(tmp_path, case(SYNC_TEST) + case(ALL_MASKED_TEST) + case(GUARD_TEST))

    verdict, reason = verdict_of(RED, patch_proof.read_junit(report), returncode=0)

    assert verdict == WRONG
    assert f"{SYNC_TEST} passed: it proves nothing" in reason
    assert f"{ALL_MASKED_TEST} passed: it proves nothing" in reason


def test_the_bug_failing_on_assertions_is_the_expected_red(tmp_path: Path) -> None:
    failure = '<failure message="AssertionError: 3 != 0 : uneven_tokens, rank 0">trace</failure>'
    report = junit(
        tmp_path, case(SYNC_TEST, failure) + case(ALL_MASKED_TEST, failure) + case(GUARD_TEST)
    )

    tests = patch_proof.read_junit(report)
    verdict, reason = verdict_of(RED, tests, returncode=1)

    assert verdict == OK, reason
    assert Case(SYNC_TEST, FAILED, "AssertionError: 3 != 0 : uneven_tokens, rank 0") in tests


@pytest.mark.parametrize(
    ("tests", "problem"),
    [
        (
            [Case(SYNC_TEST, FAILED, "RuntimeError: 'torchrun ...' failed with returncode 1")],
            f"{SYNC_TEST} failed without an assertion (RuntimeError",
        ),
        (
            [
                Case(SYNC_TEST, FAILED, "AssertionError: 3 != 0"),
                Case(GUARD_TEST, FAILED, "AssertionError: 4.1 != 4.2"),
            ],
            f"{GUARD_TEST} failed: AssertionError: 4.1 != 4.2",
        ),
        (
            [Case(SYNC_TEST, FAILED, "AssertionError: 3 != 0")],
            f"{ALL_MASKED_TEST} was not collected",
        ),
        (
            [Case(SYNC_TEST, SKIPPED, "test requires deepspeed")],
            "was skipped (test requires deepspeed)",
        ),
    ],
    ids=["crash-is-no-red", "guard-broken", "red-test-missing", "red-test-skipped"],
)
def test_a_red_that_is_not_the_bug_is_wrong(tests: list[Case], problem: str) -> None:
    verdict, reason = verdict_of(RED, tests, returncode=1)

    assert verdict == WRONG
    assert problem in reason


def test_a_skipped_test_is_no_green() -> None:
    tests = [Case(GUARD_TEST, PASSED), Case(SYNC_TEST, SKIPPED, "needs 2 accelerators")]

    verdict, reason = verdict_of(GREEN, tests, returncode=0)

    assert verdict == WRONG
    assert "skipped (needs 2 accelerators): a skipped test proves nothing" in reason


@pytest.mark.parametrize("returncode", [5, 0], ids=["pytest", "upstream-conftest"])
def test_nothing_collected_is_never_a_pass(returncode: int) -> None:
    for expect in (GREEN, PASS_OR_SKIP):
        verdict, reason = verdict_of(expect, [], returncode)

        assert verdict == WRONG
        assert reason.startswith(f"nothing collected (pytest exit code {returncode})")


def test_skipped_neighbours_are_reported_with_their_reason() -> None:
    tests = [Case("T::test_sp_equivalence", SKIPPED, "test is slow"), Case("T::b", PASSED)]

    assert verdict_of(PASS_OR_SKIP, tests, returncode=0) == (
        OK,
        "1 ran and passed; skipped: test is slow",
    )


# --- pytest and ruff in a tree, for real ---------------------------------------------------------


def test_pytest_outcomes_come_from_the_report(tmp_path: Path) -> None:
    tree = fake_tree(
        tmp_path / "tree",
        {
            "tests/test_fake.py": """
                import unittest

                class TestFake(unittest.TestCase):
                    def test_passes(self):
                        pass

                    def test_asserts(self):
                        self.assertEqual(3, 0, "rank 0 synced")

                    def test_crashes(self):
                        raise RuntimeError("torchrun failed")

                    @unittest.skip("test is slow")
                    def test_skipped(self):
                        pass
            """
        },
    )
    run = Run(tmp_path / "run", tree, Layout(tmp_path / "workspace"))

    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    returncode, tests = patch_proof.pytest_in_tree(tree, ["tests/test_fake.py"], run, timeout=120)

    assert returncode == 1
    assert sorted(tests, key=lambda test: test.test) == [
        Case("TestFake::test_asserts", FAILED, "AssertionError: 3 != 0 : rank 0 synced"),
        Case("TestFake::test_crashes", FAILED, "RuntimeError: torchrun failed"),
        Case("TestFake::test_passes", PASSED),
        Case("TestFake::test_skipped", SKIPPED, "test is slow"),
    ]


def test_nothing_collected_under_upstreams_conftest_exits_0_and_is_caught(tmp_path: Path) -> None:
    tree = fake_tree(
        tmp_path / "tree",
        {
            # As upstream's conftest.py does, so its CI stays green on an empty selection.
            "conftest.py": """
                def pytest_sessionfinish(session, exitstatus):
                    if exitstatus == 5:
                        session.exitstatus = 0
            """,
            "tests/test_empty.py": "",
        },
    )
    run = Run(tmp_path / "run", tree, Layout(tmp_path / "workspace"))

    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    returncode, tests = patch_proof.pytest_in_tree(tree, ["tests/test_empty.py"], run, timeout=120)

    assert (returncode, tests) == (0, [])
    assert verdict_of(PASS_OR_SKIP, tests, returncode)[0] == WRONG


def test_a_neighbour_named_by_node_id_runs_alone_and_a_failure_on_both_is_not_the_series(
    tmp_path: Path,
) -> None:
    """A test of upstream's beside the series' own in one file, named as a neighbour."""
    near = """
        def test_the_series():
            assert False, "not a neighbour"

        def test_downloads():
            raise OSError("the hub cannot be reached")
    """
    trees = [fake_tree(tmp_path / name, {"tests/test_near.py": near}) for name in ("a", "b")]
    case = cases.load(ROOT, "accelerate-grad-norm")
    tests = dataclasses.replace(case.card.tests, neighbours=("tests/test_near.py::test_downloads",))
    case = dataclasses.replace(case, card=dataclasses.replace(case.card, tests=tests))
    layout = Layout(tmp_path / "workspace", case.name)

    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    baseline, check = patch_proof.check_neighbours(layout, case, tmp_path / "work", trees, 120)

    assert [t.test for t in baseline.tests] == ["test_near::test_downloads"]
    assert (check.verdict, check.reason) == (
        OK,
        "0 ran and passed; 1 fail on the pinned release, not the series':"
        " test_near::test_downloads",
    )


def test_the_lint_uses_the_ruff_the_tree_pins(tmp_path: Path) -> None:
    versions = "src/transformers/dependency_versions_table.py"
    pinned = fake_tree(tmp_path / "a", {versions: 'deps = {\n    "ruff": "ruff==0.14.10",\n}\n'})
    unpinned = fake_tree(tmp_path / "b", {versions: "deps = {}\n"})

    lint = projects.get("transformers").lint
    assert linters.pinned(pinned, lint.file, lint.pattern) == "0.14.10"
    with pytest.raises(WorkspaceError, match="pins no linter version"):
        linters.pinned(unpinned, lint.file, lint.pattern)


def test_the_proof_runs_the_file_the_test_patch_adds() -> None:
    test_patches = patch_proof.series_tests(Layout(ROOT, "sp-loss"))

    files = patch_proof.series_test_files(test_patches)

    assert files == [
        "tests/deepspeed/test_deepspeed_sp_loss.py",
        "tests/trainer/test_trainer_sp_loss.py",
    ]


def test_a_release_number_is_required() -> None:
    with pytest.raises(WorkspaceError, match=r"'5\.12' is no release number"):
        proof_command.main(["--release", "5.12"])


# --- another release, judged from its source ----------------------------------------------------

SP_LOSS = """
    def deepspeed_sp_compute_loss(good_tokens_per_rank, losses_per_rank, sp_world_size):
        total_loss, total_good_tokens = 0, 0
        for rank in range(sp_world_size):
            if good_tokens_per_rank[rank] > 0:
                total_loss += losses_per_rank[rank] * good_tokens_per_rank[rank]
        total_good_tokens = sum(good_tokens_per_rank)
        loss = total_loss / max(total_good_tokens, 1)
        return loss
"""
IN_TRAINER = "class Trainer:\n" + textwrap.indent(
    textwrap.dedent(SP_LOSS)
    .replace("def deepspeed_sp", "def _deepspeed_sp")
    .replace("(good_tokens", "(self, good_tokens"),
    "    ",
)
WITHOUT_READS = SP_LOSS.replace("if good_tokens_per_rank[rank] > 0", "if True").replace(
    "max(total_good_tokens, 1)", "total_good_tokens.clamp(min=1)"
)


# What the series' tests import from transformers' test helpers, as every release has it.
TESTING_UTILS = (
    "".join(
        f"def {name}(*args):\n    pass\n\n\n"
        for name in (
            "require_torch",
            "require_accelerate",
            "require_deepspeed",
            "backend_device_count",
            "execute_subprocess_async",
            "get_torch_dist_unique_port",
        )
    )
    + "class TestCasePlus:\n    pass\n\n\ntorch_device = 'cpu'\n"
)


def transformers_files(version: str, deepspeed: str, trainer: str = "") -> dict[str, str]:
    return {
        "src/transformers/__init__.py": f'__version__ = "{version}"\n',
        "src/transformers/trainer.py": trainer or "class Trainer:\n    pass\n",
        "src/transformers/integrations/__init__.py": "",
        "src/transformers/integrations/deepspeed.py": "import torch\n" + textwrap.dedent(deepspeed),
        "src/transformers/testing_utils.py": TESTING_UTILS,
    }


@pytest.fixture
def sp_loss_releases(tmp_path: Path):
    """transformers 5.0.0 with the reads in the Trainer, 5.13.0 with them where the card says,
    5.15.0 without them; the sp-loss case in a workspace of its own downloads."""
    folder = tmp_path / "index" / "files" / "transformers"
    for version, deepspeed, trainer in (
        ("5.0.0", "class HfDeepSpeedConfig:\n    pass\n", IN_TRAINER),
        ("5.13.0", SP_LOSS, ""),
        ("5.15.0", WITHOUT_READS, ""),
    ):
        make_sdist(folder, "transformers", version, transformers_files(version, deepspeed, trainer))
    layout = own_downloads(make_workspace(tmp_path / "workspace"))
    with serving(tmp_path / "index") as url:
        yield layout, url


def test_a_release_lacking_the_code_under_test_is_not_comparable_and_says_where(
    sp_loss_releases, monkeypatch, tmp_path: Path
) -> None:
    layout, url = sp_loss_releases
    monkeypatch.setenv(sdists.INDEX_ENV, url)
    case = cases.load(layout.root, "sp-loss")

    checks = patch_proof.other_release_checks(layout, case, tmp_path / "run", "5.0.0", 60)

    assert [c.verdict for c in checks] == [Verdict.NOT_COMPARABLE] * 2
    assert [c.label for c in checks] == ["5.0.0+series", "5.0.0+tests"]
    assert all(c.tree is None and not c.tests for c in checks), "nothing was built or run"
    reason = checks[0].reason
    assert (
        "the series' tests import deepspeed_sp_compute_loss from"
        " transformers.integrations.deepspeed, which transformers 5.0.0 lacks"
    ) in reason
    assert (
        "in transformers 5.0.0 the case's sites live in src/transformers/trainer.py:6"
        " (Trainer._deepspeed_sp_compute_loss), src/transformers/trainer.py:9"
    ) in reason
    assert not layout.releases.exists()


def test_another_release_is_expected_red_where_it_carries_the_site_and_green_where_not(
    sp_loss_releases, monkeypatch
) -> None:
    layout, url = sp_loss_releases
    monkeypatch.setenv(sdists.INDEX_ENV, url)
    case = cases.load(layout.root, "sp-loss")

    assert patch_proof.release_expectation(layout, case, "5.13.0") == (patch_proof.red(case), "")
    assert patch_proof.release_expectation(layout, case, "5.15.0") == (patch_proof.GREEN, "")


# --- the proof itself ----------------------------------------------------------------------------


@pytest.mark.distributed
@pytest.mark.network
def test_red_on_the_pinned_release_green_on_the_patched_tree_and_on_the_fix(
    workspace: Layout,
) -> None:
    said: list[str] = []

    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    status, path = patch_proof.prove_and_report(
        made.case_of(workspace), [], timeout=900, say=said.append
    )

    result = json.loads(path.read_text())
    checks = {(c["check"], c["label"]): c for c in result["checks"]}
    assert status == 0, "\n".join(said)
    red = checks["series tests", "pinned+tests"]
    assert {t["test"] for t in red["tests"] if t["outcome"] == FAILED} == CASE.red_on_pinned
    everyone = len(red["tests"])
    assert (red["verdict"], red["counts"]) == (OK, {FAILED: 4, PASSED: everyone - 4})
    for label in (PATCHED, f"{CASE.fixed.version}+tests"):
        assert checks["series tests", label]["counts"] == {PASSED: everyone}
        assert checks["series tests", label]["verdict"] == OK
    neighbours = checks["upstream tests", PATCHED]  # the sdist has no tests/deepspeed/
    assert (neighbours["verdict"], neighbours["counts"]) == (NOT_APPLICABLE, {})
    (lint,) = [c for (name, _), c in checks.items() if name.startswith("ruff ")]
    assert (lint["label"], lint["verdict"]) == (PATCHED, OK)
    # The failing assertions are shown, down to the line that syncs.
    assert "'transformers/integrations/deepspeed.py:741'" in "\n".join(said)


@pytest.mark.distributed
@pytest.mark.network
def test_the_live_trainer_case_is_red_on_its_release_and_green_patched(tmp_path: Path) -> None:
    """transformers as the case pins it, in its own environment (it needs a newer tokenizers)."""
    layout = make_workspace(tmp_path / "workspace").for_case("trainer-nan-filter")
    case = cases.load(layout.root, layout.case)
    said: list[str] = []

    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    status, path = patch_proof.prove_and_report(
        made.case_of(layout), [], timeout=900, say=said.append
    )

    checks = {(c["check"], c["label"]): c for c in json.loads(path.read_text())["checks"]}
    assert status == 0, "\n".join(said)
    red = checks["series tests", "pinned+tests"]
    assert {t["test"] for t in red["tests"] if t["outcome"] == FAILED} == case.red_on_pinned
    assert all(t["message"].startswith("AssertionError") for t in red["tests"] if t["message"])
    assert red["tree"]["version"] == case.pin.version
    assert checks["series tests", PATCHED]["counts"] == {PASSED: len(red["tests"])}


@pytest.mark.distributed
@pytest.mark.network
def test_the_deepspeed_case_is_red_on_its_release_green_patched_and_formatted(
    tmp_path: Path,
) -> None:
    """DeepSpeed 0.19.8 from its sdist: the unit tests upstream keeps, run as its CPU CI does."""
    layout = make_workspace(tmp_path / "workspace").for_case("ds-clip-norm")
    said: list[str] = []

    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    status, path = patch_proof.prove_and_report(
        made.case_of(layout), [], timeout=900, say=said.append
    )

    checks = json.loads(path.read_text())["checks"]
    assert status == 0, "\n".join(said)
    (red,) = [check for check in checks if check["label"] == "pinned+tests"]
    assert red["tree"]["version"] == "0.19.8"
    failed = [t for t in red["tests"] if t["outcome"] == FAILED]
    assert {t["test"] for t in failed} == cases.load(layout.root, layout.case).red_on_pinned
    # The clip's tests catch the norm read; the mask's test the fill value copied to the device.
    caught = (
        "the norm was read on the host",
        "a tensor was made on the host and copied to the device",
    )
    assert all(t["message"].endswith(caught) for t in failed)
    (lint,) = [check for check in checks if check["expected"] == "clean"]
    assert lint["check"] == "yapf 0.43.0, flake8 5.0.4, codespell 2.1.0"
    assert (lint["verdict"], [t["outcome"] for t in lint["tests"]]) == (OK, [PASSED] * 3)


@pytest.mark.distributed  # a probe process per try
def test_another_release_is_judged_by_running_and_a_probe_that_cannot_run_changes_nothing(
    tmp_path: Path, monkeypatch
) -> None:
    """The sites' lines run under the detector, as bisect --judge runs them: here neither the
    generated call (its values are not what the function takes) nor the snippet (it needs the
    real transformers) runs on this planted release, which stays red on its text, saying so."""
    make_sdist(
        tmp_path / "index" / "files" / "transformers",
        "transformers",
        "5.13.0",
        transformers_files("5.13.0", SP_LOSS),
        requires=("torch",),
    )
    layout = own_downloads(make_workspace(tmp_path / "workspace"))
    case = cases.load(layout.root, "sp-loss")
    with serving(tmp_path / "index") as url:
        monkeypatch.setenv(sdists.INDEX_ENV, url)
        monkeypatch.setenv("HOSTSYNC_PREPARED", "1")  # the test's interpreter is the environment
        # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
        expect, said = patch_proof.release_expectation(layout, case, "5.13.0", timeout=120)

    assert expect == patch_proof.red(case)
    assert said.startswith(
        "judged by running a generated call of deepspeed_sp_compute_loss then"
        " the snippet issue_snippet.py: not run"
    )


# --- upstream's tests for a tree made from an sdist ----------------------------------------------

HARNESS = {
    "tests/conftest.py": "# upstream's conftest\n",
    "tests/unit/common.py": "class DistributedTest:\n    world_size = 2\n",
    "tests/unit/test_neighbour.py": "def test_neighbour():\n    assert True\n",
}
NEWER = {"tests/unit/test_neighbour.py": "def test_neighbour():\n    assert 1\n"}
SDIST_ORIGIN = "PyPI sdist project-1.0.tar.gz (sha256 0)"


def committed(repo: Path, files: dict[str, str], message: str, date: str) -> str:
    for name, text in files.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    git(repo, "add", "--all")
    stamp = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    git(repo, "commit", "--quiet", "--message", message, env=stamp)
    return rev(repo, "HEAD")


@pytest.fixture
def upstream(tmp_path: Path) -> tuple[Path, str, str]:
    """A bare repository of the project: tests/ at its tag v1.0, and a newer commit after it
    that changes a test; the tag's commit and the newest."""
    work = tmp_path / "upstream-work"
    work.mkdir()
    git(work, "init", "--quiet", "--initial-branch=master")
    tagged = committed(work, HARNESS, "release 1.0", "@1700000000 +0000")
    git(work, "tag", "v1.0")
    newest = committed(work, NEWER, "later work", "@1700086400 +0000")
    bare = tmp_path / "upstream.git"
    git(tmp_path, "clone", "--quiet", "--bare", str(work), str(bare))
    return bare, tagged, newest


def test_upstream_tests_come_from_the_tag_else_from_the_newest_commit(upstream) -> None:
    bare, tagged, newest = upstream

    at_tag = harness.source(bare, "v1.0", SDIST_ORIGIN)
    untagged = harness.source(bare, "v1.1", SDIST_ORIGIN)

    assert (at_tag.commit, at_tag.ref, at_tag.files) == (tagged, "tag v1.0", 3)
    assert at_tag.committed == "2023-11-14T22:13:20+00:00"
    assert (untagged.commit, untagged.committed) == (newest, "2023-11-15T22:13:20+00:00")
    assert untagged.ref == "its newest commit (it has no tag v1.1)"
    assert untagged.tree_origin == SDIST_ORIGIN


def test_a_repository_without_tests_is_refused_in_one_line(tmp_path: Path) -> None:
    repo = tmp_path / "other"
    repo.mkdir()
    git(repo, "init", "--quiet", "--initial-branch=master")
    committed(repo, {"README": "no tests here\n"}, "only a readme", "@1700000000 +0000")

    with pytest.raises(WorkspaceError, match=r"has no tests/ at its newest commit .*: give a"):
        harness.source(repo, "v1.0", SDIST_ORIGIN)


def test_test_patch_refuses_a_remote_that_is_no_repository(tmp_path: Path) -> None:
    with pytest.raises(WorkspaceError, match="is no git repository: give a local clone"):
        proof_command.main(["--case", "ds-ulysses-seqlen", "--remote", str(tmp_path)])


@pytest.fixture
def release_and_patch(tmp_path: Path) -> tuple[Path, Path]:
    """A release as its sdist has it (no tests/unit/), and a test patch of the series written on
    upstream's newest tests: it edits one of them."""
    release = tmp_path / "release"
    release.mkdir()
    git(release, "init", "--quiet", "--initial-branch=main")
    own = {"project/__init__.py": "", "tests/conftest.py": "# the sdist's own\n"}
    committed(release, own, "1.0 as released", "@1700000000 +0000")
    git(release, "tag", "v1.0")
    # The series was written on upstream's newest tests: its patch edits one of them.
    copy = {name: text for name, text in HARNESS.items() if name not in own} | NEWER
    committed(release, copy, "upstream's tests", "@1700000000 +0000")
    edit = {"tests/unit/test_neighbour.py": "def test_neighbour():\n    assert 2\n"}
    committed(release, edit, "a test patch", "@1700000000 +0000")
    patch_dir = tmp_path / "patches"
    git(release, "format-patch", "--quiet", "-o", str(patch_dir), "HEAD~1..HEAD")
    (patch,) = patch_dir.iterdir()
    git(release, "reset", "--quiet", "--hard", "v1.0")
    return release, patch


def test_upstream_tests_are_copied_before_the_series_and_the_release_keeps_its_own(
    upstream, release_and_patch, tmp_path: Path
) -> None:
    """A test patch that edits one of upstream's test files applies on top of the copy."""
    bare, _, newest = upstream
    release, patch = release_and_patch
    tests_from = harness.source(bare, "v1.1", SDIST_ORIGIN)
    layout = Layout(tmp_path / "workspace", "c")

    root = trees._worktree(
        layout, release, "v1.0", [patch], tmp_path / "tree", "project 1.0", tests_from
    )

    neighbour = root / "tests/unit/test_neighbour.py"
    assert neighbour.read_text().endswith("assert 2\n"), "the series applied on upstream's copy"
    assert (root / "tests/conftest.py").read_text() == "# the sdist's own\n"
    assert (root / "tests/unit/common.py").read_text() == HARNESS["tests/unit/common.py"]
    assert not (root / "tests/unit/common.py").is_symlink()
    log = git(root, "log", "--format=%s", "v1.0..HEAD").stdout.splitlines()
    assert log == [
        "a test patch",
        f"upstream's tests/ from a local clone at {newest}"
        f" ({tests_from.ref}, {tests_from.committed})",
    ]
    assert read_state(root).upstream_tests == newest


def test_a_tree_without_upstreams_tests_leaves_out_the_patch_editing_them(
    release_and_patch, tmp_path: Path
) -> None:
    release, patch = release_and_patch
    layout = Layout(tmp_path / "workspace", "c")

    root = trees._worktree(layout, release, "v1.0", [patch], tmp_path / "tree", "project 1.0")

    assert read_state(root).left_out == (patch.name,)
    assert not (root / "tests/unit/test_neighbour.py").exists()
    assert git(root, "rev-parse", "HEAD").stdout == git(release, "rev-parse", "v1.0").stdout


def test_a_tree_without_the_harness_says_what_is_missing_and_how_to_get_it(tmp_path: Path) -> None:
    case = cases.load(ROOT, "ds-ulysses-seqlen")
    deepspeed = projects.get("deepspeed")
    tree = Tree("pinned+tests", TreeRole.PINNED, tmp_path, "0.19.8", "", SDIST_ORIGIN, deepspeed)
    (tmp_path / "tests/unit").mkdir(parents=True)
    (tmp_path / "tests/unit/common.py").write_text("")

    with pytest.raises(WorkspaceError) as refused:
        patch_proof.refuse_without_harness(case, tree)

    assert str(refused.value) == (
        "no upstream test harness in pinned+tests (tests/conftest.py, tests/pytest.ini,"
        " tests/unit/util.py missing): pass a clone of"
        f" {deepspeed.repository} with --remote PATH"
    )


def test_a_neighbour_failing_on_the_pinned_release_too_is_not_the_series() -> None:
    fp16 = Case(
        "TestFP16::test_adam", FAILED, "ValueError: Type fp16 is not supported on your device"
    )
    regressed = Case("TestClip::test_clip", FAILED, "AssertionError: 2.0 != 1.0")
    expect = dataclasses.replace(PASS_OR_SKIP, fail_on_pinned=frozenset({fp16.test}))

    assert verdict_of(expect, [fp16, Case("T::b", PASSED)], returncode=1) == (
        OK,
        "1 ran and passed; 1 fail on the pinned release, not the series': TestFP16::test_adam",
    )
    verdict, reason = verdict_of(expect, [fp16, regressed], returncode=1)
    assert (verdict, reason) == (WRONG, "TestClip::test_clip failed: AssertionError: 2.0 != 1.0")


@pytest.mark.network
def test_without_upstreams_harness_the_proof_is_refused_in_one_line_saying_how_to_get_it(
    tmp_path: Path,
) -> None:
    """ds-ulysses-seqlen's test is a DistributedTest: its sdist tree cannot run it alone, and no
    other check would tell more (the linters would only miss the test file the series edits)."""
    layout = make_workspace(tmp_path / "workspace").for_case("ds-ulysses-seqlen")
    deepspeed = projects.get("deepspeed")

    with pytest.raises(patch_proof.MissingHarness) as refused:
        patch_proof.prove_and_report(made.case_of(layout), [], timeout=900, say=print)

    assert str(refused.value) == (
        "no upstream test harness in pinned+tests (tests/conftest.py, tests/pytest.ini,"
        " tests/unit/common.py, tests/unit/util.py missing): pass a clone of"
        f" {deepspeed.repository} with --remote PATH"
    )
    assert not list(layout.profiles.glob("test_patch-*.json")), (
        "no result of a run that did not run"
    )


def test_a_local_clone_is_named_as_one_in_what_results_record(tmp_path: Path) -> None:
    """Results are committed: where this machine keeps a clone stays out of them."""
    clone = str(tmp_path / "DeepSpeed")
    argv = ["test-patch", "--case", "ds-ulysses-seqlen", "--remote", clone]

    assert provenance._without_clones(argv)[-1] == "CLONE"
    assert provenance._without_clones([f"--remote={clone}"]) == ["--remote=CLONE"]
    url = "https://github.com/deepspeedai/DeepSpeed"
    assert provenance._without_clones(["--remote", url])[-1] == url
    assert (harness.shown(clone), harness.shown(url)) == ("a local clone", url)
