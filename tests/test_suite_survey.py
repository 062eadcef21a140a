"""The survey of a project's own suite: run without the plugin, in report mode and gated by the
baseline the report wrote; outcomes compared test by test, the cost as ratios, the top sites."""

from __future__ import annotations

import statistics
import sys
import textwrap

import pytest

from hostsync.commands.survey import parser
from hostsync.measure.records import SurveyMode
from hostsync.measure.survey import SurveySpec, survey
from hostsync.upstream.trees import Tree
from hostsync.workspace.cases import Sdist
from hostsync.workspace.projects import Project, RuffLint
from hostsync.workspace.records import TreeRole

from conftest import hostsync, one_line_error

# A project of its own kind: a package under src/, its tests at the root, one of them compiled.
PROJECT = Project(
    "stepper",
    "https://example.invalid/stepper",
    "src",
    "src/stepper/__init__.py",
    r'^__version__ = "([^"]+)"',
    lint=RuffLint("pyproject.toml", r"ruff==(\S+)"),
)

PACKAGE = """
    import torch

    __version__ = "1.0"

    def scale(t):
        return t / max(t.sum(), 1)
"""

SUITE = """
    import sys

    import torch
    from stepper import scale

    double = torch.compile(lambda t: t * 2, backend="eager")

    def test_scale():
        scale(torch.ones(3))

    def test_compiled():
        assert double(torch.ones(2)).sum() > 0

    def test_on_the_device():
        torch.ones(2).sum()

    def test_sees_the_plugin():
        assert "hostsync.detector.pytest_plugin" not in sys.modules
"""


@pytest.mark.long_run("seven pytest runs of a suite that compiles: a warm-up, then 2 rounds of 3")
def test_a_survey_compares_each_outcome_and_ranks_the_sites(workspace):
    root = workspace.work / "stepper-1.0"
    for path, text in (("src/stepper/__init__.py", PACKAGE), ("tests/test_steps.py", SUITE)):
        (root / path).parent.mkdir(parents=True, exist_ok=True)
        (root / path).write_text(textwrap.dedent(text))
    tree = Tree(
        "stepper-1.0", TreeRole.RELEASE, root, "1.0", "", "a folder", PROJECT, sys.executable
    )
    spec = SurveySpec(
        "1.0",
        Sdist("https://example.invalid/stepper-1.0.tar.gz", 1, "0" * 64),
        options=("-o", "addopts="),
        tests=("tests",),
    )

    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    result = survey(workspace.for_case("survey"), tree, spec, spec.tests, timeout=300, rounds=2)

    modes = [SurveyMode.OFF, SurveyMode.REPORT, SurveyMode.GATE]
    assert [(run.round, run.mode) for run in result.runs] == [
        (round, mode) for round in (1, 2) for mode in modes
    ]
    assert [run.outcomes for run in result.runs if run.mode is SurveyMode.OFF] == [
        {"passed": 4},
        {"passed": 4},
    ]
    assert result.differences == (
        "test_steps::test_sees_the_plugin: passed without the plugin, not in report mode"
        " (rounds 1, 2)",
        "test_steps::test_sees_the_plugin: failed in report mode, not without the plugin"
        " (rounds 1, 2)",
        "test_steps::test_sees_the_plugin: passed without the plugin, not in gate mode"
        " (rounds 1, 2)",
        "test_steps::test_sees_the_plugin: failed in gate mode, not without the plugin"
        " (rounds 1, 2)",
    )
    assert [(s.site.file, s.site.function, s.kinds, s.count) for s in result.sites] == [
        ("test_steps.py", "test_compiled", ("compiled", "scalar_read"), 2),
        ("stepper/__init__.py", "scale", ("scalar_read",), 1),
    ]
    assert (result.syncing_tests, result.surveyed_tests) == (2, 4)
    # Each run over the run without the plugin of its own round; the median over the rounds.
    off, report, gate = ([run for run in result.runs if run.mode is mode] for mode in modes)
    assert result.ratios(SurveyMode.GATE, cpu=True) == [
        run.cpu_s / base.cpu_s for run, base in zip(gate, off, strict=True)
    ]
    assert result.ratio(SurveyMode.REPORT) == statistics.median(
        run.wall_s / base.wall_s for run, base in zip(report, off, strict=True)
    )


def test_a_project_without_a_survey_is_refused_in_one_line(workspace):
    done = hostsync(workspace, "survey", "--project", "stepper")

    assert one_line_error(done) == (
        "error: surveys.toml has no [stepper]: survey one of peft, or add its table"
    )


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_rounds_that_are_no_positive_count_are_refused(value, capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--project", "peft", "--rounds", value])

    assert f"argument --rounds: {value!r} is no whole number of at least 1" in (
        capsys.readouterr().err
    )
