"""The suite never touches the user's work: each test that needs a workspace gets a temporary
one, sharing only the download cache and the environments. An empty selection fails loudly."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import pytest

from hostsync.launch.processes import Run
from hostsync.workspace.layout import ROOT, Layout

CASE = "sp-loss"
COMMITTED = (
    "cases",
    "patches",
    "repro",
    "pin.toml",
    "known_sites.toml",
    "remedies.toml",
    "census.toml",
    "surveys.toml",
)
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


def own_downloads(layout: Layout) -> Layout:
    """`layout` with a download cache of its own: the sdists a test builds carry the names of
    real releases, which the shared cache holds as published."""
    layout.cache.unlink()
    layout.cache.mkdir()
    return layout


def hostsync(
    layout: Layout, *args: str, env_extra: dict[str, str] | None = None, cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """`python -m hostsync ARGS` on the workspace `layout`, as a user runs it (from `cwd`)."""
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "HOSTSYNC_ROOT": str(layout.root)}
    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    return subprocess.run(
        [sys.executable, "-m", "hostsync", *args],
        capture_output=True,
        text=True,
        env=env | (env_extra or {}),
        cwd=cwd,
        timeout=600,
    )


def retitled(card: Path) -> str:
    """The card's text with a new title: an edit of what it tells a run, so its results go stale."""
    return card.read_text().replace('title = "', 'title = "New: ', 1)


def one_line_error(done: subprocess.CompletedProcess[str]) -> str:
    """The one `error:` line a refused command printed, with no traceback."""
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    (line,) = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    return line


def wait_until(happened: Callable[[], bool]) -> None:
    """Until `happened()`: an event another process makes, looked for often (no time limit of
    its own: the run it waits on has one)."""
    while not happened():
        time.sleep(0.05)


def processes_running(text: str) -> dict[int, str]:
    """Live processes (zombies aside) whose command line holds `text`: pid -> command line."""
    listing = subprocess.run(["ps", "-eo", "pid=,stat=,args="], capture_output=True, text=True)
    rows = [line.split(None, 2) for line in listing.stdout.splitlines()]
    return {int(pid): args for pid, stat, args in rows if text in args and stat[0] != "Z"}


class OwnEnvironment(Run):
    """A run of a command that is no rank: this process's variables, no tree."""

    def environment(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        return dict(os.environ)


@pytest.fixture
def workspace(tmp_path: Path) -> Layout:
    return make_workspace(tmp_path / "workspace")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--heavy", action="store_true", help="also run the tests marked heavy")
    parser.addoption(
        "--cpu-load",
        type=int,
        default=0,
        metavar="N",
        help="run the tests beside N CPU-bound processes (the loaded lane: a laptop doing other"
        " work)",
    )


# Busy on one core until the test session that started it is gone, however it ends.
CPU_BOUND = "import os, sys\nparent = int(sys.argv[1])\nwhile os.getppid() == parent:\n    pass\n"
CPU_LOAD = pytest.StashKey[list["subprocess.Popen[bytes]"]]()


def pytest_configure(config: pytest.Config) -> None:
    """Before the first test, in every process that runs tests: what a compiled call imports
    imported, and the suite's tools left out of the runs tests start (the workers' controller
    runs none: it keeps them to start its workers, and starts them without waiting on torch). In
    the session alone: an unknown `-m` marker refused in one line (each worker would otherwise
    fail on it alone), and the loaded lane's CPU-bound processes started."""
    worker = hasattr(config, "workerinput")
    if not worker:
        refuse_unknown_markers(config)
    if worker or not config.getoption("numprocesses", None):
        compile_once()
        leave_the_tools_out()
    config.stash[CPU_LOAD] = [
        subprocess.Popen([sys.executable, "-c", CPU_BOUND, str(os.getpid())])
        for _ in range(0 if worker else config.getoption("cpu_load"))
    ]


def compile_once() -> None:
    """A compiled call, outside any test: which test would compile first depends on its worker.
    Inside a scope, an import that fails halfway cannot be redone; inside pytester's in-process
    run, what it imports is dropped after, and inductor refuses a second import."""
    import torch

    torch.compile(torch.neg, backend="eager")(torch.ones(1))


def leave_the_tools_out() -> None:
    """The runs a test starts get the PYTHONPATH it had, less the suite's tools (pytest-xdist):
    their commands go into results, which name no path of this machine."""
    tools = str(Layout(ROOT).cache / "tools")
    paths = os.environ.get("PYTHONPATH", "").split(os.pathsep)
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in paths if not p.startswith(tools))


def refuse_unknown_markers(config: pytest.Config) -> None:
    named = set(re.findall(r"[A-Za-z_]\w*", config.getoption("markexpr") or ""))
    known = {line.split(":")[0].split("(")[0].strip() for line in config.getini("markers")}
    unknown = sorted(named - known - {"and", "or", "not"})
    if unknown:
        raise pytest.UsageError(
            f"-m names no marker of this suite: {', '.join(unknown)} (its markers:"
            f" {', '.join(sorted(known))})"
        )


def pytest_unconfigure(config: pytest.Config) -> None:
    for process in config.stash.get(CPU_LOAD, []):
        process.kill()
        process.wait()


def pytest_report_header(config: pytest.Config) -> str | None:
    load = config.stash.get(CPU_LOAD, [])
    return f"loaded lane: {len(load)} CPU-bound processes run beside the tests" if load else None


# Files whose tests share runs made once per module (trees, hung runs, a hunted tree, a scan, a
# tiny model): each goes whole to one of the suite's workers. Every other test is a unit of its own.
SHARED_RUNS = (
    "tests/test_hunt.py",
    "tests/test_repro.py",
    "tests/test_scan_upstream.py",
    "tests/test_words.py",
)


# Each test's seconds in the last session that ran it (setup, call and teardown), in pytest's cache.
SECONDS = "hostsync/seconds"


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """The suite's workers take a file of `SHARED_RUNS` whole, and any other test alone; the
    longest first, by the seconds they took last time, so that none starts at the end."""
    from xdist.scheduler import LoadScopeScheduling
    from xdist.workermanage import WorkerController

    cache = getattr(config, "cache", None)  # none where `-p no:cacheprovider`
    seconds: dict[str, float] = cache.get(SECONDS, {}) if cache else {}

    class SharedRunsTogether(LoadScopeScheduling):  # type: ignore[misc]  # xdist has no types
        def _split_scope(self, nodeid: str) -> str:
            file = nodeid.split("::", 1)[0]
            return file if file in SHARED_RUNS else nodeid

        def _assign_work_unit(self, node: WorkerController) -> None:
            def took(scope: str) -> float:
                return sum(seconds.get(nodeid, 0.0) for nodeid in self.workqueue[scope])

            self.workqueue.move_to_end(max(self.workqueue, key=took), last=False)
            super()._assign_work_unit(node)

    return SharedRunsTogether(config, log)


def remember_seconds(session: pytest.Session) -> None:
    """Each test's seconds in this session, kept in pytest's cache for the next one's order."""
    cache = getattr(session.config, "cache", None)
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if cache is None or reporter is None:
        return
    took: dict[str, float] = {}
    for reports in reporter.stats.values():
        for report in reports:
            if isinstance(report, pytest.TestReport):
                took[report.nodeid] = took.get(report.nodeid, 0.0) + report.duration
    cache.set(SECONDS, cache.get(SECONDS, {}) | took)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """A whole case's run repeats what `nox -s repro` does for that case; CI keeps to one case of
    each kind so that it stays under 20 minutes on 2 cores."""
    if config.getoption("heavy"):
        return
    skip = pytest.mark.skip(reason="heavy: a whole case's run, run with `nox -s tests -- --heavy`")
    for item in items:
        if "heavy" in item.keywords:
            item.add_marker(skip)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not hasattr(session.config, "workerinput"):
        remember_seconds(session)
    if exitstatus == pytest.ExitCode.NO_TESTS_COLLECTED:
        session.config.get_terminal_writer().line(
            "error: pytest collected no tests (exit code 5): check the paths and the -k/-m"
            " expression given after `--`",
            red=True,
        )
