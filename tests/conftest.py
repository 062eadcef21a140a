"""Make an empty selection a loud failure rather than a silent green."""

from __future__ import annotations

import pytest


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.config.get_terminal_writer().line(
            "error: pytest collected no tests (exit code 5): check the paths and the -k/-m"
            " expression given after `--`",
            red=True,
        )
