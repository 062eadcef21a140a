"""pytest plugin: a test gates the host syncs of what it runs, on CPU in CI.

- `@pytest.mark.no_host_sync(allow=[AllowRule(...)])`: the test fails listing each unexpected
  sync of its body (the call phase, not its fixtures) as `file:line` with its code;
- the `host_syncs` fixture: `with host_syncs(allow=[...]) as scope:` around the lines a test
  asserts on (`scope.events`, `scope.counts()`, `scope.assert_no_unexpected_syncs()`);
- `--host-sync-report`: the syncs of every test of the run, in the terminal summary, failing none
  (marked tests still gate).

Registered as a `pytest11` entry point when the package is installed, `-p hostsync.pytest_plugin`
otherwise. pytest loads every installed plugin in every run, also where torch is missing: torch
(with `hostsync.detector`) is imported only by a test that asks for the detector.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

import pytest

if TYPE_CHECKING:
    from hostsync.detector import AllowRule, SyncScope

MARKER = "no_host_sync"
REPORT_OPTION = "--host-sync-report"
_SITES = "host_sync_sites"  # the user property a report carries the sites of its call in


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.getgroup("hostsync").addoption(
        REPORT_OPTION,
        action="store_true",
        help="list the host syncs of every test in the terminal summary (fails no test)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(allow=[AllowRule(...)]): fail the test on each host sync its body makes that"
        " no rule accepts (hostsync.detector)",
    )


def _allowed(item: pytest.Item) -> list[AllowRule]:
    """The rules of every no_host_sync marker on the test, its class and its module."""
    from hostsync.detector import AllowRule

    rules: list[AllowRule] = []
    for marker in item.iter_markers(MARKER):
        if marker.args or set(marker.kwargs) - {"allow"}:
            pytest.fail(f"{MARKER} takes only allow=[AllowRule(...)]", pytrace=False)
        allow = list(marker.kwargs.get("allow", ()))
        if not all(isinstance(rule, AllowRule) for rule in allow):
            pytest.fail(
                f"{MARKER}(allow=...) takes hostsync.detector.AllowRule objects, each with the"
                " reason its sync is accepted",
                pytrace=False,
            )
        rules += allow
    return rules


def unexpected_syncs(scope: SyncScope) -> str:
    """Each unexpected sync of `scope` as `file:line` with its count and code, for a failure."""
    lines = [f"{len(scope.unexpected)} unexpected host sync(s):"]
    for site, count in scope.counts().items():
        lines.append(f"  {site.file}:{site.line}: {site.code}  ({count}x in {site.function})")
    lines.append(
        f"Remove each sync, or accept it with {MARKER}(allow=[AllowRule(file, reason=...)])."
    )
    return "\n".join(lines)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    gated = item.get_closest_marker(MARKER) is not None
    if not gated and not item.config.getoption(REPORT_OPTION):
        return (yield)
    from hostsync.detector import SyncScope

    with SyncScope(allow=_allowed(item) if gated else ()) as scope:
        try:
            result = yield
        finally:
            if item.config.getoption(REPORT_OPTION):
                item.user_properties.append((_SITES, scope.sync_sites()))
    if gated and scope.unexpected:
        pytest.fail(unexpected_syncs(scope), pytrace=False)
    return result


@pytest.fixture
def host_syncs() -> Callable[..., SyncScope]:
    """`SyncScope` itself: `with host_syncs(allow=[...]) as scope:` in the test body."""
    from hostsync.detector import SyncScope

    return SyncScope


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    if not config.getoption(REPORT_OPTION):
        return
    reports = [
        report
        for outcome in ("passed", "failed")
        for report in terminalreporter.stats.get(outcome, [])
        if report.when == "call"
    ]
    surveyed = [
        (report.nodeid, sites)
        for report in reports
        for name, sites in report.user_properties
        if name == _SITES
    ]
    terminalreporter.section("host syncs per test")
    for nodeid, sites in surveyed:
        if sites:
            total = sum(site["count"] for site in sites)
            terminalreporter.write_line(f"{nodeid}: {total} host sync(s)")
            for site in sites:
                terminalreporter.write_line(
                    f"  {site['file']}:{site['line']}: {site['code']}  ({site['count']}x,"
                    f" {', '.join(site['kinds'])})"
                )
    quiet = sum(1 for _, sites in surveyed if not sites)
    terminalreporter.write_line(f"{quiet} of {len(surveyed)} test(s) made no host sync")
