"""Every report and summary says its figures in the words of `hostsync.workspace.vocabulary`.

The reference set is rendered (the census, each case's repro and bisect), with a real scan of
the example loop and the hunt's report of that scan's sites. A table header outside the
vocabulary fails, and so does a count per step of a word it does not define. The glossary
gives each word the meaning the vocabulary gives it."""

from __future__ import annotations

import dataclasses
import itertools
import re
from pathlib import Path

import pytest

from hostsync.census import report as census_report
from hostsync.census.records import CensusResult
from hostsync.history import report as history_report
from hostsync.history.records import BisectResult
from hostsync.hunt import report as hunt_report
from hostsync.hunt.measure import hunt_plan
from hostsync.measure import report as repro_report
from hostsync.measure.records import ReproResult, ScanResult
from hostsync.scan import report as scan_report
from hostsync.sites.dispositions import known_now
from hostsync.sites.records import HuntTree
from hostsync.sites.remedies import load_remedies
from hostsync.sites.render import figure_text
from hostsync.workspace import cases, results, vocabulary
from hostsync.workspace.layout import ROOT, Layout

import made
from conftest import hostsync

MARKDOWN_RULE = re.compile(r"^\| ---( \| ---)* \|$")
TEXT_RULE = re.compile(r"^-+(  -+)*$")
# A count per step: the word before `/step` or `per step` (`per rank per step`, `per optimizer
# step`), a plural `(s)` read as the word.
COUNTED = re.compile(r"([\w()|-]+)(?:/step\b| per (?:rank (?:and |per )?)?(?:optimizer )?step\b)")
ROLES = {"per", "rank", "and", "one", "a", "each", "the", "summed", "mean", "median"}


def headers(text: str) -> list[str]:
    """Every header cell of the Markdown and the plain-text tables in `text`."""
    lines = text.splitlines()
    found = []
    for header, rule in itertools.pairwise(lines):
        if MARKDOWN_RULE.match(rule):
            cells = re.split(r"(?<!\\) \| ", header.strip()[2:-2])
            found += [cell.replace("\\|", "|") for cell in cells]
        elif TEXT_RULE.match(rule):
            spans = [m.span() for m in re.finditer(r"-+", rule)]
            found += [header[start:end].strip() for start, end in spans]
    return found


def _known(cell: str, names: set[str]) -> bool:
    labels = set(vocabulary.LABELS) | vocabulary.NAMES
    if not cell or cell in labels or cell in names or re.fullmatch(r"#\d+|rank \d+", cell):
        return True
    for label in sorted(labels, key=len, reverse=True):
        if cell.startswith(label + " "):
            rest = cell[len(label) :]
            for word in sorted((*vocabulary.QUALIFIERS, *names), key=len, reverse=True):
                rest = rest.replace(word, " ")
            return not rest.strip()
    return False


def outside(text: str, names: set[str] = frozenset()) -> list[str]:
    """Each header and each count per step in `text` that the vocabulary does not define."""
    found = [f"header {cell!r}" for cell in headers(text) if not _known(cell, set(names))]
    for match in COUNTED.finditer(text):
        word = match.group(1).replace("(s)", "").strip("()|")
        if word and word not in vocabulary.COUNTED | ROLES and not word.replace(".", "").isdigit():
            found.append(f"count {match.group(0)!r}")
    return found


def references(kind: type) -> list[tuple[cases.Case, Path]]:
    return [
        (case, found)
        for case in cases.every(ROOT)
        if (found := results.latest(ROOT / "profiles" / case.name / "reference", kind))
    ]


def test_the_reference_census_renders_in_the_vocabulary() -> None:
    path = results.latest(ROOT / "profiles" / "census" / "reference", CensusResult)
    result = results.read(path, CensusResult)
    text = census_report.render(result, path.name, None, known_now(Layout(ROOT, "census")))
    names = set(result.columns)
    assert outside(text, names) == []
    assert outside(census_report.console_summary(result), names) == []


def test_each_reference_repro_and_bisect_renders_in_the_vocabulary() -> None:
    repros, bisects = references(ReproResult), references(BisectResult)
    assert len(repros) >= 8 and len(bisects) >= 8
    for case, path in repros:
        result = results.read(path, ReproResult)
        names = {*case.columns, *(run.tree for run in result.runs)}
        assert outside(repro_report.report(case, result), names) == [], case.name
    for case, path in bisects:
        text = history_report.render(results.read(path, BisectResult), path.name)
        assert outside(text) == [], case.name


@pytest.fixture(scope="module")
def scanned(tmp_path_factory: pytest.TempPathFactory) -> tuple[Layout, ScanResult]:
    """A real scan of the example loop, in a workspace of its own."""
    from conftest import make_workspace

    layout = make_workspace(tmp_path_factory.mktemp("words") / "workspace")
    example = ROOT / "examples" / "tiny_training.py"
    done = hostsync(
        layout, "scan", str(example), "--iterations", "8", env_extra={"OMP_NUM_THREADS": "1"}
    )
    assert done.returncode == 0, done.stderr
    (path,) = (layout.root / "profiles" / "scan").glob("scan-*.json")
    return layout, results.read(path, ScanResult)


def test_a_scan_says_stalls_where_it_counts_them_in_the_vocabulary(
    scanned: tuple[Layout, ScanResult],
) -> None:
    layout, result = scanned
    rules, remedies = known_now(layout), load_remedies(layout)
    summary = scan_report.summary(result, rules, remedies)
    assert result.cost is not None
    stalls = figure_text(result.cost.stalls / result.cost.steps)
    assert f" {stalls} stalls," in summary
    assert outside(summary) == []
    text = scan_report.render(result, "scan.json", None, rules, remedies)
    assert outside(text, {f"rank {rank.rank}" for rank in result.ranks}) == []


def test_the_hunts_report_of_real_sites_renders_in_the_vocabulary(
    scanned: tuple[Layout, ScanResult],
) -> None:
    layout, result = scanned
    tree = HuntTree(
        label="pinned bf16-zero1",
        tree="pinned",
        setup="bf16-zero1",
        info=made.info("5.13.1"),
        stacked=(),
        seconds=1.0,
        plan=hunt_plan(7, 3),
        sites=result.sites,
        cost=result.cost,
    )
    fixed = dataclasses.replace(tree, label="patched bf16-zero1", tree="patched")
    hunted = made.hunt(layout, tree, fixed)
    names = {tree.label, fixed.label}
    assert outside(hunt_report.render(hunted, "hunt.json"), names) == []
    assert outside(hunt_report.console_summary(hunted.measured), names) == []


def test_the_check_sees_a_header_and_a_count_outside_the_vocabulary() -> None:
    """The measure itself: a site's column called a verdict's other name, and syncs counted."""
    path = results.latest(ROOT / "profiles" / "census" / "reference", CensusResult)
    result = results.read(path, CensusResult)
    text = census_report.render(result, path.name, None, known_now(Layout(ROOT, "census")))
    loose = text.replace("| disposition |", "| status |", 1).replace(
        "waits per step summed", "syncs per step summed", 1
    )

    assert outside(loose, set(result.columns)) == [
        "header 'status'",
        "count 'syncs per step'",
    ]


def test_the_glossary_gives_each_word_its_one_meaning() -> None:
    glossary = (ROOT / "docs" / "glossary.md").read_text()
    missing = [
        word
        for word, meaning in vocabulary.WORDS.items()
        if f"**{word}**: {meaning}" not in glossary
    ]
    assert missing == []
