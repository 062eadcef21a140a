"""The suite never touches the user's work: each test that needs a workspace gets a temporary
one, sharing only the download cache and the environments. An empty selection fails loudly."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from hostsync.layout import ROOT, Layout

CASE = "sp-loss"
COMMITTED = ("cases", "patches", "repro", "pin.toml", "hunt_allowlist.toml", "census.toml")
SHARED = ("cache", "envs")


def make_workspace(root: Path) -> Layout:
    """A copy of the committed inputs at `root`; downloads and environments shared with ROOT."""
    root.mkdir(parents=True)
    for name in COMMITTED:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, root / name)
        else:
            shutil.copy(source, root / name)
    (root / "work").mkdir()
    for name in SHARED:
        (ROOT / "work" / name).mkdir(parents=True, exist_ok=True)
        (root / "work" / name).symlink_to(ROOT / "work" / name)
    return Layout(root, CASE)


@pytest.fixture
def workspace(tmp_path: Path) -> Layout:
    return make_workspace(tmp_path / "workspace")


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.config.get_terminal_writer().line(
            "error: pytest collected no tests (exit code 5): check the paths and the -k/-m"
            " expression given after `--`",
            red=True,
        )
