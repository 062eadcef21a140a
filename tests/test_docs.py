"""The lists the docs keep are the code's: every command and session in docs/sessions.md,
every launcher where the docs name them, every case in the README and docs/cases.md, and the
minimal card of docs/adding-a-case.md loads as a card. A list that drifts fails here."""

from __future__ import annotations

import ast
import re
import tomllib
from pathlib import Path

from hostsync.__main__ import COMMANDS
from hostsync.detector.codec import load
from hostsync.workspace import cases
from hostsync.workspace.cases import Card
from hostsync.workspace.layout import ROOT
from hostsync.workspace.records import Launcher

DOCS = ROOT / "docs"


def sessions() -> set[str]:
    """The nox sessions of noxfile.py: its functions decorated with `nox.session`."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    return {
        node.name
        for node in tree.body
        if isinstance(node, ast.FunctionDef)
        and any("session" in ast.unparse(decorator) for decorator in node.decorator_list)
    }


def table_rows(text: str) -> set[str]:
    """The first cell of each row of the Markdown tables in `text`, as written between backticks."""
    return set(re.findall(r"^\| (?:\(none\) )?`([^`]+)`", text, flags=re.MULTILINE))


def test_every_session_and_every_command_has_a_row_in_the_sessions_table() -> None:
    rows = table_rows((DOCS / "sessions.md").read_text())
    assert len(sessions()) >= 15
    assert sessions() - rows == set()
    assert {name.replace("-", "_") for name in COMMANDS} - rows == set()


def test_the_docs_name_every_launcher() -> None:
    entry = (DOCS / "glossary.md").read_text().split("**launcher**:")[1].split("\n\n")[0]
    section = (DOCS / "adding-a-case.md").read_text().split("## Launchers")[1].split("\n## ")[0]
    for text in (entry, section):
        assert [ln.value for ln in Launcher if f"`{ln.value}`" not in text] == []


def test_every_case_is_in_the_readme_table_and_in_the_cases_doc() -> None:
    names = cases.names(ROOT)
    readme = table_rows((ROOT / "README.md").read_text())
    headings = set(re.findall(r"^## ([\w-]+)", (DOCS / "cases.md").read_text(), re.MULTILINE))
    assert len(names) >= 8
    assert set(names) - readme == set()
    assert set(names) - headings == set()


def test_the_minimal_card_of_adding_a_case_loads() -> None:
    text = (DOCS / "adding-a-case.md").read_text()
    (block,) = re.findall(r"```toml\n(.*?)```", text, flags=re.DOTALL)
    card = load(Card, tomllib.loads(block), "")
    assert card.project in {case.project.name for case in cases.every(ROOT)}
    assert card.pin in {case.pin for case in cases.every(ROOT)}


def test_the_table_scan_sees_a_session_missing() -> None:
    """The measure itself: a row left out is seen."""
    text = "| session | what |\n| --- | --- |\n| `tests` | the tests |\n| (none) `env` | x |\n"
    assert table_rows(text) == {"tests", "env"}
    assert {"tests", "scan"} - table_rows(text) == {"scan"}


def test_the_docs_name_no_file_that_is_gone() -> None:
    """The known-sites file kept its old name nowhere."""
    texts = [path.read_text() for path in [ROOT / "README.md", *DOCS.glob("*.md")]]
    assert [t for t in texts if "hunt_allowlist" in t] == []
    assert Path(ROOT / "known_sites.toml").exists()
