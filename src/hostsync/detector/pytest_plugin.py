"""pytest plugin: a test gates the host syncs of what it runs, on CPU in CI.

- `@pytest.mark.no_host_sync(allow=[AllowRule(...)])`: the test fails listing each unexpected
  sync of its body (the call phase, not its fixtures) as `file:line` with its code;
- the `host_syncs` fixture: `with host_syncs(allow=[...]) as scope:` around the lines a test
  asserts on (`scope.events`, `scope.counts()`, `scope.assert_no_unexpected_syncs()`);
- `--host-sync-report`: the syncs of every test of the run, in the terminal summary, failing none
  (marked tests still gate); a compiled function called in a test is recorded at its call site
  ("compiled, not judged") and runs, where a marked test refuses it (`SyncScopeError`);
- `--host-sync-baseline PATH`: a run without the file writes every test's syncs there, to review
  and commit, and fails no test on a sync; with the file, gated tests fail only on syncs their
  entries lack, and the entries no longer made are listed (`hostsync.detector.baseline`);
- `--host-sync-gate all`: every test is gated, not only the marked ones (with a baseline: the
  adoption of a whole suite).

A scope observes its context: the test's thread, autograd's threads, and what the test carries
with `scope.carry`. Syncs in other threads (a pool the test did not start, a server) and in
DataLoader worker processes are not the test's and are not counted.

Registered as a `pytest11` entry point when the package is installed, `-p
hostsync.detector.pytest_plugin` otherwise. pytest loads every installed plugin in every run, also
where torch is missing: torch (with `hostsync.detector`) is imported only by a test that asks for
the detector."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from hostsync.detector.baseline import Baseline, BaselineError
from hostsync.detector.sites import COMPILED, SiteCount
from hostsync.detector.words import counted

if TYPE_CHECKING:
    from hostsync.detector import AllowRule, SyncScope

MARKER = "no_host_sync"
REPORT_OPTION = "--host-sync-report"
BASELINE_OPTION = "--host-sync-baseline"
GATE_OPTION = "--host-sync-gate"
# The user property a report carries the sites of its call in, as JSON: pytest-xdist sends reports
# from its workers as plain values.
_SITES = "host_sync_sites"
_KIND_SHOWN = {COMPILED: "compiled, not judged"}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("hostsync")
    group.addoption(
        REPORT_OPTION,
        action="store_true",
        help="list the host syncs of every test in the terminal summary (fails no test)",
    )
    group.addoption(
        BASELINE_OPTION,
        metavar="PATH",
        type=Path,
        help="without the file: write every test's host syncs there, to review and commit; with"
        " it: gated tests fail only on syncs it lacks",
    )
    group.addoption(
        GATE_OPTION,
        choices=("marked", "all"),
        default="marked",
        help=f"which tests fail on host syncs: those marked {MARKER} (default), or all",
    )


@dataclass
class _Session:
    """What the options ask of this run, and the syncs of each test surveyed so far."""

    report: bool
    gate_all: bool
    rootpath: Path
    baseline_path: Path | None
    baseline: Baseline | None
    surveyed: dict[str, list[SiteCount]] = field(default_factory=dict)

    @property
    def surveys(self) -> bool:
        return self.report or self.baseline_path is not None

    @property
    def writes_baseline(self) -> bool:
        return self.baseline_path is not None and self.baseline is None

    def unexpected(self, test: str, scope: SyncScope) -> list[SiteCount]:
        """The syncs a gated test fails on: none while the baseline is written, else those the
        baseline (if any) lacks."""
        if self.writes_baseline:
            return []
        sites = scope.sync_sites()
        return self.baseline.new(self.named(test), sites) if self.baseline else sites

    def named(self, nodeid: str) -> str:
        """A test as the baseline names it: its file relative to the baseline's folder, so that
        the name does not depend on the rootdir pytest chose (it weighs its path arguments)."""
        if self.baseline_path is None:
            return nodeid
        path, separator, rest = nodeid.partition("::")
        folder = self.baseline_path.absolute().parent
        return Path(os.path.relpath(self.rootpath / path, folder)).as_posix() + separator + rest

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        """Reports reach the controlling process also from pytest-xdist's workers."""
        if report.when == "call":
            for name, sites in report.user_properties:
                if name == _SITES and isinstance(sites, list):
                    self.surveyed[report.nodeid] = [SiteCount.from_json(site) for site in sites]

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        path = self.baseline_path
        if path and self.writes_baseline and not hasattr(session.config, "workerinput"):
            named = {self.named(test): sites for test, sites in self.surveyed.items()}
            Baseline.of(named).write(path)


_SESSION: pytest.StashKey[_Session] = pytest.StashKey()


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        f"{MARKER}(allow=[AllowRule(...)]): fail the test on each host sync its body makes that"
        " no rule accepts (hostsync.detector)",
    )
    path = config.getoption(BASELINE_OPTION)
    try:
        baseline = Baseline.read(path) if path is not None and path.exists() else None
    except BaselineError as error:
        raise pytest.UsageError(str(error)) from None
    gate_all = config.getoption(GATE_OPTION) == "all"
    run = _Session(config.getoption(REPORT_OPTION), gate_all, config.rootpath, path, baseline)
    config.stash[_SESSION] = run
    config.pluginmanager.register(run, "hostsync-run")


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


def unexpected_syncs(found: list[SiteCount], baseline: Path | None) -> str:
    """Each unexpected sync as `file:line` with its code and count, for a failure."""
    lines = [f"{counted(sum(synced.count for synced in found), 'unexpected host sync')}:"]
    for synced in found:
        site = synced.site
        lines.append(
            f"  {site.file}:{site.line}: {site.code}  ({synced.count}x in {site.function})"
        )
    accept = f"{MARKER}(allow=[AllowRule(file, reason=...)])"
    if baseline is not None:
        accept += f", or in {baseline} (delete it and rerun to write it afresh)"
    lines.append(f"Remove each sync, or accept it with {accept}.")
    return "\n".join(lines)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    run = item.config.stash[_SESSION]
    marked = item.get_closest_marker(MARKER) is not None
    gated = marked or run.gate_all
    if not gated and not run.surveys:
        return (yield)
    from hostsync.detector import SyncScope

    with SyncScope(allow=_allowed(item) if marked else (), refuse_compiled=marked) as scope:
        try:
            result = yield
        finally:
            if run.surveys:
                found = [synced.to_json() for synced in scope.sync_sites()]
                item.user_properties.append((_SITES, found))
    unexpected = run.unexpected(item.nodeid, scope) if gated else []
    if unexpected:
        pytest.fail(unexpected_syncs(unexpected, run.baseline_path), pytrace=False)
    return result


@pytest.fixture
def host_syncs() -> Callable[..., SyncScope]:
    """`SyncScope` itself: `with host_syncs(allow=[...]) as scope:` in the test body."""
    from hostsync.detector import SyncScope

    return SyncScope


def pytest_terminal_summary(
    terminalreporter: pytest.TerminalReporter, config: pytest.Config
) -> None:
    run = config.stash[_SESSION]
    if run.report:
        _write_survey(terminalreporter, run.surveyed)
    if run.writes_baseline:
        terminalreporter.section("host-sync baseline")
        terminalreporter.write_line(
            f"wrote the host syncs of"
            f" {counted(sum(1 for sites in run.surveyed.values() if sites), 'test')} to"
            f" {run.baseline_path}: review and commit it; later runs with it fail"
            " gated tests on new syncs only"
        )
    elif run.baseline is not None:
        gone = {
            test: run.baseline.gone(run.named(test), sites) for test, sites in run.surveyed.items()
        }
        gone = {test: entries for test, entries in gone.items() if entries}
        if gone:
            terminalreporter.section("host-sync baseline")
            terminalreporter.write_line(
                f"{sum(map(len, gone.values()))} baseline entries of {run.baseline_path} no longer"
                " occur: remove them (or delete the file and rerun to write it afresh)"
            )
            for test, entries in gone.items():
                for entry in entries:
                    terminalreporter.write_line(f"  {test}: {_shown(entry)}")


def _shown(entry: SiteCount) -> str:
    site = entry.site
    return f"{site.file}:{site.line}: {site.code}  (in {site.function})"


def _write_survey(
    terminalreporter: pytest.TerminalReporter, surveyed: dict[str, list[SiteCount]]
) -> None:
    terminalreporter.section("host syncs per test")
    for nodeid, found in surveyed.items():
        if found:
            total = sum(synced.count for synced in found)
            terminalreporter.write_line(f"{nodeid}: {counted(total, 'host sync')}")
            for synced in found:
                site = synced.site
                kinds = ", ".join(_KIND_SHOWN.get(kind, kind) for kind in synced.kinds)
                terminalreporter.write_line(
                    f"  {site.file}:{site.line}: {site.code}  ({synced.count}x, {kinds})"
                )
    quiet = sum(1 for sites in surveyed.values() if not sites)
    terminalreporter.write_line(f"{quiet} of {counted(len(surveyed), 'test')} made no host sync")
