"""The files a person edits, read by one strict loader: each committed one loads, and a bad one is
refused in one line naming the file and the field (a missing key, an unknown key, a wrong type, a
value outside its choices, a TOML syntax error, a file that is not there)."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from hostsync.census import setups
from hostsync.measure import survey
from hostsync.sites import known
from hostsync.workspace import cases, pin
from hostsync.workspace.config import load_toml
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import ROOT

# Each file, and how its readers read it from a workspace at `root`.
READERS: dict[str, Callable[[Path], object]] = {
    "cases/sp-loss.toml": lambda root: cases.load(root, "sp-loss"),
    "cases/trainer-nan-filter.toml": lambda root: cases.load(root, "trainer-nan-filter").carries,
    "pin.toml": lambda root: pin.load(root / "pin.toml"),
    "census.toml": setups.load,
    "surveys.toml": lambda root: survey.load_spec(root, "peft"),
    "known_sites.toml": lambda root: known.load_known_sites(root / "known_sites.toml"),
}


def refusal(root: Path, file: str, pattern: str, replacement: str) -> str:
    """The one-line error of the committed `file`, copied under `root` with its first match of
    `pattern` replaced."""
    (root / file).parent.mkdir(parents=True, exist_ok=True)
    text, edits = re.subn(pattern, replacement, (ROOT / file).read_text(), count=1)
    assert edits == 1, pattern
    (root / file).write_text(text)
    with pytest.raises(WorkspaceError) as refused:
        READERS[file](root)
    message = str(refused.value)
    assert "\n" not in message
    return message


@pytest.mark.parametrize(
    ("file", "pattern", "replacement", "complaint"),
    [
        ("cases/sp-loss.toml", r'title = ".*"\n', "", "cases/sp-loss.toml: title: is missing"),
        (
            "cases/sp-loss.toml",
            r"\ntitle =",
            "\ntitel =",
            "cases/sp-loss.toml: has unknown keys ['titel']: use [",
        ),
        (
            "cases/sp-loss.toml",
            r"issue = 47068",
            'issue = "47068"',
            "cases/sp-loss.toml: upstream.issue: expected an integer, got '47068'",
        ),
        (
            "cases/sp-loss.toml",
            r'kind = "issue"\nstate = "closed"',
            'kind = "issue"\nstate = "merged"',
            "cases/sp-loss.toml: upstream.threads[0].state: an issue is open or closed, never",
        ),
        (
            "cases/sp-loss.toml",
            r'opened = "2026-07-04"',
            "opened = 2026-07-04",
            "cases/sp-loss.toml: upstream.threads[0].opened: expected a string",
        ),
        (
            "cases/sp-loss.toml",
            r"number = 47073",
            "number = 47068",
            "cases/sp-loss.toml: upstream.threads: lists huggingface/transformers#47068 more than",
        ),
        ("pin.toml", r'default_case = ".*"\n', "", "pin.toml: default_case: is missing"),
        (
            "pin.toml",
            r', supported = ">=2.6,<2.15"',
            "",
            "pin.toml: dependencies.torch.supported: is missing",
        ),
        (
            "pin.toml",
            r"default_case =",
            "default =",
            "pin.toml: has unknown keys ['default']: use ['default_case', 'dependencies']",
        ),
        (
            "pin.toml",
            r'install = "2.13.0"',
            "install = 2.13",
            "pin.toml: dependencies.torch.install: expected a string, got 2.13",
        ),
        ("census.toml", r"\nsteps = 6", "", "census.toml: steps: is missing"),
        (
            "census.toml",
            r"\nranks = 2",
            "\nrank = 2",
            "census.toml: setups.trainer-ddp-fp16: has unknown keys ['rank']",
        ),
        (
            "census.toml",
            r"\nranks = 2",
            '\nranks = "2"',
            "census.toml: setups.trainer-ddp-fp16.ranks: expected an integer, got '2'",
        ),
        (
            "census.toml",
            r'precision = "fp16"',
            'precision = "fp8"',
            "census.toml: setups.trainer-ddp-fp16.precision: expected one of 'fp32'",
        ),
        ("census.toml", r"steps = 6", "steps = 2", "census.toml: steps: must be 3 or more"),
        ("surveys.toml", r'version = ".*"\n', "", "surveys.toml: peft.version: is missing"),
        (
            "surveys.toml",
            r"requires =",
            "require =",
            "surveys.toml: peft: has unknown keys ['require']",
        ),
        (
            "surveys.toml",
            r"size = 983614",
            'size = "983614"',
            "surveys.toml: peft.sdist.size: expected an integer",
        ),
        (
            "known_sites.toml",
            r'reason = "logging step only: the averaged.*"\n',
            "",
            "known_sites.toml: allow[0].reason: is missing",
        ),
        (
            "known_sites.toml",
            r'reason = "logging step only: the averaged.*"',
            'reason = " "',
            "known_sites.toml: allow[0].reason: an allowed sync needs a reason",
        ),
        (
            "known_sites.toml",
            r"function =",
            "func =",
            "known_sites.toml: allow[0]: has unknown keys ['func']: use [",
        ),
        (
            "known_sites.toml",
            r'function = "_maybe_log_save_evaluate"',
            "function = 3",
            "known_sites.toml: allow[0].function: expected a string, got 3",
        ),
        (
            "known_sites.toml",
            r'\[\[not_carried\]\]\nfile = ".*"',
            '[[not_carried]]\nfile = ""',
            "known_sites.toml: not_carried[0].file: is blank",
        ),
        (
            "known_sites.toml",
            r"(?m)^\[\[allow\]\]",
            "[[allowed]]",
            "known_sites.toml: has unknown keys ['allowed']: use ['allow', 'not_carried']",
        ),
    ],
)
def test_a_bad_file_is_refused_in_one_line_naming_the_file_and_the_field(
    tmp_path: Path, file: str, pattern: str, replacement: str, complaint: str
) -> None:
    message = refusal(tmp_path, file, pattern, replacement)

    assert message.startswith(complaint), message
    assert message.endswith("fix the card" if file.startswith("cases/") else "fix the file")


@pytest.mark.parametrize("file", READERS)
def test_a_file_that_is_no_toml_is_refused_naming_its_line(tmp_path: Path, file: str) -> None:
    message = refusal(tmp_path, file, r"\n\[", "\n[[oops]\n[")

    assert message.startswith(f"{file} is not valid TOML (")
    assert re.search(r"line \d+.*: fix that line$", message), message


@pytest.mark.parametrize("file", ["pin.toml", "census.toml", "surveys.toml", "known_sites.toml"])
def test_a_missing_file_is_refused_naming_it(tmp_path: Path, file: str) -> None:
    with pytest.raises(WorkspaceError, match=rf"^no {re.escape(file)} at .*: restore it from"):
        READERS[file](tmp_path)


def test_every_committed_file_a_person_edits_loads() -> None:
    everyone = cases.every(ROOT)
    pins = pin.load(ROOT / "pin.toml")
    matrix = setups.load(ROOT)
    surveys = load_toml(ROOT / survey.FILE, dict[str, survey.SurveySpec])
    rules = known.load_known_sites(ROOT / "known_sites.toml")

    assert pins.default_case in [case.name for case in everyone]
    assert {"torch", "transformers", "pytest"} <= pins.dependencies.keys()
    assert matrix.steps >= 3 and matrix.setups
    assert "peft" in surveys
    assert rules.allow and rules.not_carried


def test_a_carried_site_with_a_blank_file_is_refused_naming_the_card(tmp_path: Path) -> None:
    message = refusal(
        tmp_path,
        "cases/trainer-nan-filter.toml",
        r'(\[\[carries\]\]\nfile = )"[^"]*"',
        r'\1""',
    )
    assert message.startswith("cases/trainer-nan-filter.toml: carries[0].file: is blank")


def test_a_census_whose_every_setup_is_extra_asks_for_setups(tmp_path: Path) -> None:
    text = (ROOT / "census.toml").read_text().replace("extra = true\n", "")
    text = re.sub(r"(\[setups\.[^\]]+\]\n)", r"\1extra = true\n", text)
    (tmp_path / "census.toml").write_text(text)
    matrix = setups.load(tmp_path)
    with pytest.raises(WorkspaceError, match=r"every setup of census.toml is extra: name some"):
        matrix.chosen(None)
