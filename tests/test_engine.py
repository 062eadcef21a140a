"""The engine apart from any case: case cards, the case option, result schemas, environments,
the drafts' placeholders. Real files in temporary workspaces; no process is launched."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from hostsync.commands import options
from hostsync.commands import repro as repro_command
from hostsync.detector.codec import write_file
from hostsync.drafting import drafts, review
from hostsync.hunt.records import HuntResult, HuntSetup
from hostsync.measure import provenance
from hostsync.measure.records import ReproResult, TestPatchResult
from hostsync.upstream import envs
from hostsync.upstream.patchqueue import series
from hostsync.upstream.records import EnvRecord
from hostsync.workspace import cases, locks, projects, results
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import ROOT, Layout
from hostsync.workspace.pin import load as load_pin

import made
from conftest import make_workspace, retitled

# --- cases ---------------------------------------------------------------------------------------


def test_every_committed_case_loads_and_has_its_folders() -> None:
    names = cases.names(ROOT)

    assert "sp-loss" in names and "trainer-nan-filter" in names
    for name in names:
        case = cases.load(ROOT, name)
        layout = Layout(ROOT, name)
        assert series(layout), f"{name} has no patch series"
        for launch in case.launches:
            assert (layout.repro / launch.script).exists(), f"{name}: {launch.script}"
        assert set(case.red_on_pinned), f"{name} names no test that must fail on its pin"
        assert list((ROOT / "cases" / name).glob("*.md")), f"{name} has no draft template"


def test_fixed_stands_for_upstreams_release_and_is_refused_without_one() -> None:
    loss, live = cases.load(ROOT, "sp-loss"), cases.load(ROOT, "trainer-nan-filter")

    assert loss.tree_name("fixed+tests") == f"{loss.fixed.version}+tests"
    with pytest.raises(WorkspaceError, match="has no fixed upstream release"):
        live.tree_name("fixed")


def test_an_unknown_case_names_the_known_ones(workspace: Layout) -> None:
    with pytest.raises(WorkspaceError, match=r"no case 'nope' .*sp-loss"):
        options.chosen_cases("nope", workspace)


def test_a_malformed_card_is_refused_in_one_line(workspace: Layout) -> None:
    card = workspace.root / "cases" / "broken.toml"
    card.write_text('title = "x"\nproject = "transformers"\n')

    with pytest.raises(WorkspaceError, match=r"cases/broken\.toml: pin: is missing: fix the card"):
        cases.load(workspace.root, "broken")


def test_no_case_means_the_default_and_all_means_every_one(workspace: Layout) -> None:
    default = load_pin(workspace.pin_file).default_case

    assert [case.name for case in options.chosen_cases(None, workspace)] == [default]
    assert [case.name for case in options.chosen_cases("all", workspace)] == cases.names(
        workspace.root
    )


def test_a_case_is_added_by_adding_files(workspace: Layout) -> None:
    """No engine change: a card, a series and a script make a case the commands accept."""
    card = (workspace.root / "cases" / "sp-loss.toml").read_text()
    (workspace.root / "cases" / "copy.toml").write_text(card)

    (case,) = options.chosen_cases("copy", workspace)
    layout = case.layout

    assert case.project is projects.get("transformers")
    assert layout.patches == workspace.root / "patches" / "copy"
    assert layout.profiles == workspace.root / "profiles" / "copy"


@pytest.mark.parametrize("value", ["-1", "0", "soon"])
def test_a_timeout_that_is_no_positive_number_is_refused(value: str, capsys) -> None:
    with pytest.raises(SystemExit):
        repro_command.parser().parse_args(["--timeout", value])

    assert "is no positive number of seconds" in capsys.readouterr().err


# --- result files --------------------------------------------------------------------------------


def hunt_result(layout: Layout) -> HuntResult:
    setup = HuntSetup(world_size=2, sp_size=2, model="m", device="cpu", backend="gloo", versions={})
    stamp = provenance.stamp(layout, provenance.inputs(layout))
    return HuntResult(stamp=stamp, setup=setup, allowlist=(), trees=())


def test_a_result_is_never_overwritten_and_reads_back(workspace: Layout) -> None:
    result = hunt_result(workspace)

    first = results.write(workspace.profiles, result, workspace.unsaved)
    second = results.write(workspace.profiles, result, workspace.unsaved)

    assert first != second and first.parent == workspace.root / "profiles" / "sp-loss"
    assert results.read(first, HuntResult) == result
    assert not list(workspace.profiles.glob(".*")), "no partial file is left behind"


def test_a_partial_or_older_result_is_refused_naming_the_file(workspace: Layout) -> None:
    path = results.write(workspace.profiles, hunt_result(workspace), workspace.unsaved)
    document = json.loads(path.read_text())
    partial, older = dict(document), dict(document, schema=1)
    del partial["trees"]

    for broken, complaint in (
        (partial, r"is no valid hunt result \(trees: is missing\)"),
        (older, "has schema 1"),
    ):
        path.write_text(json.dumps(broken))
        with pytest.raises(WorkspaceError, match=f"{path.name} {complaint}.*rerun"):
            results.read(path, HuntResult)


@pytest.mark.parametrize(
    ("change", "field", "complaint"),
    [
        ({"provenance": {}}, r"provenance\.pin_sha256", "is missing"),
        ({"trees": [1, 2]}, r"trees\[0\]", "expected an object, got 1"),
        ({"setup": {"world_size": "two"}}, r"setup\.world_size", "expected an integer"),
    ],
)
def test_a_result_of_the_wrong_shape_names_the_file_and_the_field(
    workspace: Layout, change: dict, field: str, complaint: str
) -> None:
    path = results.write(workspace.profiles, hunt_result(workspace), workspace.unsaved)
    document = json.loads(path.read_text())
    if "setup" in change:
        change = {"setup": document["setup"] | change["setup"]}
    path.write_text(json.dumps(document | change))

    with pytest.raises(WorkspaceError, match=rf"{path.name} .*{field}: {complaint}"):
        results.read(path, HuntResult)


def test_a_repro_row_whose_host_syncs_is_no_count_is_refused_naming_the_field(
    workspace: Layout,
) -> None:
    """The count every case reports is typed: a draft never cites a word where a count was."""
    result = made.repro(workspace, (made.row("pinned", 2, 3),))
    path = results.write(workspace.profiles, result, workspace.unsaved)
    assert results.read(path, ReproResult) == result
    document = json.loads(path.read_text())
    document["runs"][0]["host_syncs"] = "three"
    path.write_text(json.dumps(document))

    with pytest.raises(WorkspaceError) as refused:
        results.read(path, ReproResult)

    said = str(refused.value)
    assert "runs[0].host_syncs: expected an integer" in said and "\n" not in said


def test_another_kind_of_result_is_refused_by_its_kind(workspace: Layout) -> None:
    path = results.write(workspace.profiles, hunt_result(workspace), workspace.unsaved)

    with pytest.raises(WorkspaceError, match="is a 'hunt' result, not a 'repro' one"):
        results.read(path, ReproResult)


def test_a_result_that_cannot_be_written_is_kept_elsewhere(workspace: Layout) -> None:
    workspace.profiles.parent.mkdir(parents=True, exist_ok=True)
    workspace.profiles.write_text("a file where the folder should be")

    with pytest.raises(WorkspaceError, match=r"it is kept at .*; make the folder") as error:
        results.write(workspace.profiles, hunt_result(workspace), workspace.unsaved)

    kept = Path(str(error.value).split("it is kept at ")[1].split("; make")[0])
    assert results.read(kept, HuntResult).stamp.case == "sp-loss"
    assert kept.is_relative_to(workspace.unsaved)


def test_a_result_goes_stale_when_its_card_or_series_changes(workspace: Layout) -> None:
    result = hunt_result(workspace)
    assert provenance.stale_reasons(workspace, result) == []

    workspace.case_file.write_text(retitled(workspace.case_file))
    (workspace.patches / "series").write_text("")

    reasons = provenance.stale_reasons(workspace, result)
    assert "cases/sp-loss.toml changed" in reasons
    assert any(reason.endswith("was removed") for reason in reasons)


def test_a_result_stays_fresh_when_only_what_upstream_knows_changes(workspace: Layout) -> None:
    result = hunt_result(workspace)
    card = workspace.case_file.read_text()
    refreshed = card.replace('seen = "', 'seen = "read again: ', 1) + "\n# a comment\n"
    workspace.case_file.write_text(refreshed)

    assert workspace.case_file.read_text() != card
    assert provenance.stale_reasons(workspace, result) == []


def test_a_comment_in_pin_toml_leaves_a_result_fresh_and_a_new_pin_makes_it_stale(
    workspace: Layout,
) -> None:
    result = hunt_result(workspace)
    pin = workspace.pin_file.read_text()
    workspace.pin_file.write_text("# why the pins are what they are\n" + pin)
    assert provenance.stale_reasons(workspace, result) == []

    workspace.pin_file.write_text(
        pin.replace('pytest = { install = "', 'pytest = { install = "1', 1)
    )
    assert provenance.stale_reasons(workspace, result) == ["pin.toml changed"]


def measured_by_another_detector(stamp):
    other = dataclasses.replace(stamp.provenance, detector_sha256="0" * 64)
    return dataclasses.replace(stamp, provenance=other)


def test_a_result_counted_by_another_detector_is_stale_one_that_ran_tests_is_not(
    workspace: Layout,
) -> None:
    counted = hunt_result(workspace)
    assert counted.stamp.provenance.detector_sha256 == provenance.detector_digest()
    counted = dataclasses.replace(counted, stamp=measured_by_another_detector(counted.stamp))
    proof = TestPatchResult(stamp=counted.stamp, ok=True, checks=())

    assert provenance.stale_reasons(workspace, counted) == [
        "it was measured by another detector (src/hostsync/detector/)"
    ]
    assert provenance.stale_reasons(workspace, proof) == []


def test_a_result_of_another_case_is_stale_for_that_reason_alone(workspace: Layout) -> None:
    result = hunt_result(workspace.for_case("ds-clip-norm"))

    assert provenance.stale_reasons(workspace, result) == [
        "it is a result of case ds-clip-norm, not of sp-loss"
    ]


# --- environments --------------------------------------------------------------------------------


PIN = load_pin(ROOT / "pin.toml")
TRANSFORMERS = projects.get("transformers")
PINNED = PIN.installs | {"tokenizers": "0.22.2"}


def test_an_environment_with_the_pins_fits_a_release_whose_ranges_it_meets() -> None:
    requires = ["tokenizers<=0.23.0,>=0.22.0", "torch>=2.0"]

    assert envs.problems(PINNED, PIN, TRANSFORMERS, requires, exact=True) == []


def test_a_release_that_needs_newer_dependencies_gets_another_environment() -> None:
    requires = ["tokenizers<0.24,>=0.23.1"]

    assert envs.problems(PINNED, PIN, TRANSFORMERS, requires, exact=True) == [
        "tokenizers 0.22.2 is outside <0.24,>=0.23.1"
    ]


def test_a_prepared_environment_needs_only_the_supported_ranges() -> None:
    gpu_box = PINNED | {"torch": "2.11.0", "transformers": "5.17.0"}

    assert envs.problems(gpu_box, PIN, TRANSFORMERS, [], exact=False) == []
    assert envs.problems(gpu_box, PIN, TRANSFORMERS, [], exact=True) == [
        "torch 2.11.0 is outside ==2.13.0"
    ]
    assert envs.problems({}, PIN, TRANSFORMERS, [], exact=False)[0] == "torch is not installed"


def test_a_build_that_waited_for_another_takes_the_environment_it_built(tmp_path: Path) -> None:
    """Commands side by side (or the suite's workers) need one environment: the second build
    waits for the first's lock, then takes what it built rather than building it again."""
    layout = Layout(tmp_path)
    specs = PIN.install_specs(replace={"transformers": "5.13.1"})
    target = envs.folder(layout, TRANSFORMERS, "5.13.1", specs)
    taken: list[str] = []
    with locks.building(target):
        waiting = threading.Thread(
            target=lambda: taken.append(envs.build(layout, PIN, TRANSFORMERS, "5.13.1", [], {}))
        )
        waiting.start()
        (target / "bin").mkdir(parents=True)
        (target / "bin" / "python").symlink_to(sys.executable)
        record = EnvRecord("bin/python", tuple(specs), PINNED | {"transformers": "5.13.1"})
        write_file(record, target / envs.RECORD)
    waiting.join()

    assert taken == [str(target / "bin" / "python")]


def test_a_release_declares_its_requirements_in_its_pkg_info(tmp_path: Path) -> None:
    (tmp_path / "PKG-INFO").write_text(
        "Metadata-Version: 2.1\nName: transformers\nRequires-Dist: tokenizers<=0.23.0,>=0.22.0\n"
        'Requires-Dist: pytest; extra == "testing"\n'
    )
    case = cases.load(ROOT, "sp-loss")

    found = envs.declared(Layout(tmp_path), TRANSFORMERS, case.pin, tmp_path)

    assert found == ["tokenizers<=0.23.0,>=0.22.0"]


@pytest.mark.network
def test_the_sessions_share_environments_by_dependency_set() -> None:
    """What `nox -s ...` runs in: the environment of the default case's pin, named by release."""
    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    done = subprocess.run(
        [sys.executable, "-m", "hostsync", "env"],
        capture_output=True,
        text=True,
        timeout=1800,
        env={"PYTHONPATH": str(ROOT / "src"), "PATH": str(Path(sys.executable).parent)},
    )

    assert done.returncode == 0, done.stderr
    python = Path(done.stdout.strip())
    assert python.parent.parent.parent == (ROOT / "work" / "envs").resolve()


# --- the drafts' placeholders --------------------------------------------------------------------

DOCUMENTS = {
    "repro": {
        "trees": {"pinned": {"version": "5.13.1"}, "5.14.0": {"version": "5.14.0"}},
        "runs": [
            {"tree": "pinned", "ranks": 2, "host_syncs": 3, "per_batch": [2, 2]},
            {"tree": "pinned", "ranks": 4, "host_syncs": 5, "per_batch": [2, 1]},
            {"tree": "patched", "ranks": 2, "host_syncs": 0, "per_batch": [0, 0]},
        ],
    },
    "case": {"upstream": {"reviewers": ["@a", "@b"]}},
}


@pytest.mark.parametrize(
    ("template", "filled"),
    [
        ("{{repro:runs[tree=pinned,ranks=2].host_syncs}}", "3"),
        ("{{repro:runs[tree=pinned].host_syncs|max}}", "5"),
        ("{{ repro:runs[tree=pinned,ranks=4].per_batch|join }}", "2, 1"),
        ("{{repro:runs[tree=patched].host_syncs|count}}", "1"),
        ("{{repro:trees.'5.14.0'.version}}", "5.14.0"),
        ("{{case:upstream.reviewers|join}}", "@a, @b"),
        ("{{repro:runs[tree=fixed].host_syncs|max}}", drafts.NOT_MEASURED),
        ("code {not a placeholder} stays", "code {not a placeholder} stays"),
    ],
)
def test_placeholders_are_queries_over_the_results(template: str, filled: str) -> None:
    assert review.fill(template, DOCUMENTS) == filled


def test_an_unknown_source_or_reducer_is_refused() -> None:
    for template in ("{{nope:runs.x}}", "{{repro:runs.host_syncs|median}}"):
        with pytest.raises(WorkspaceError, match="unknown placeholder"):
            review.fill(template, DOCUMENTS)


def test_review_without_results_says_which_session_to_run(tmp_path: Path) -> None:
    layout = make_workspace(tmp_path / "ws")

    with pytest.raises(WorkspaceError, match=r"no repro result in profiles/sp-loss/: run `nox"):
        review.review(made.case_of(layout))
