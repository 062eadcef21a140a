"""The pytest plugin as another project's suite meets it: a marker that gates a test, a fixture,
a survey of a whole run, and the entry point an installed package registers."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

# Loaded before any in-process run: pytester drops the modules a run imports first, and torch
# cannot be loaded twice in one process.
import hostsync.detector.scope  # noqa: F401

pytest_plugins = ["pytester"]

PLUGIN = ("-p", "hostsync.detector.pytest_plugin")
SOURCE = Path(__file__).parents[1] / "src"

GATED = """
    import pytest
    import torch
    from hostsync.detector import AllowRule

    def loss_step(t):
        total = t.sum()
        return total / max(total, 1)

    @pytest.mark.no_host_sync
    def test_the_step_stays_on_the_device():
        t = torch.ones(4, device=torch.get_default_device())
        loss_step(t)
        t.tolist()

    @pytest.mark.no_host_sync(allow=[AllowRule("test_gate.py", reason="max() decides the scale",
                                               function="loss_step")])
    def test_an_accepted_sync_passes():
        loss_step(torch.ones(4, device=torch.get_default_device()))

    @pytest.mark.no_host_sync
    def test_sync_free_code_passes():
        t = torch.ones(4, device=torch.get_default_device())
        torch.where(t > 0, t, 0.0).sum()
"""


def test_a_marked_test_fails_naming_each_unexpected_sync_with_its_line_and_code(pytester):
    pytester.makepyfile(test_gate=GATED)

    result = pytester.runpytest(*PLUGIN, "--strict-markers")

    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*2 unexpected host syncs:",
            "*test_gate.py:7: return total / max(total, 1)  (1x in loss_step)",
            "*test_gate.py:13: t.tolist()  (1x in test_the_step_stays_on_the_device)",
        ]
    )


def test_marks_of_the_module_and_the_test_allow_together(pytester):
    pytester.makepyfile(
        test_layers="""
        import pytest
        import torch
        from hostsync.detector import AllowRule

        pytestmark = pytest.mark.no_host_sync(allow=[AllowRule("test_layers.py", reason="logs",
                                                               function="log")])

        def log(t):
            return t.item()

        @pytest.mark.no_host_sync(allow=[AllowRule("test_layers.py", reason="lists",
                                                   code="tolist")])
        def test_both_rules_apply():
            t = torch.ones(1, device=torch.get_default_device())
            log(t)
            t.tolist()
        """
    )

    pytester.runpytest(*PLUGIN).assert_outcomes(passed=1)


def test_allow_takes_rules_with_a_reason_only(pytester):
    pytester.makepyfile(
        test_strings="""
        import pytest

        @pytest.mark.no_host_sync(allow=["trainer.py"])
        def test_a_file_without_a_reason():
            pass
        """
    )

    result = pytester.runpytest(*PLUGIN)

    result.assert_outcomes(failed=1)
    result.stdout.fnmatch_lines(["no_host_sync(allow=...) takes hostsync.detector.AllowRule*"])


def test_the_fixture_is_a_scope_for_finer_assertions(pytester):
    pytester.makepyfile(
        test_fixture="""
        import torch

        def test_one_read_per_step(host_syncs):
            t = torch.ones(3, device=torch.get_default_device())
            with host_syncs() as scope:
                for _ in range(2):
                    t.sum().item()
            assert [site.line for site in scope.counts()] == [7]
            assert list(scope.counts().values()) == [2]
        """
    )

    pytester.runpytest(*PLUGIN).assert_outcomes(passed=1)


def test_the_report_surveys_every_test_and_fails_none(pytester):
    pytester.makepyfile(
        test_survey="""
        import torch

        def test_reads():
            t = torch.ones(3, device=torch.get_default_device())
            if t.sum() > 0:
                t.tolist()

        def test_stays_on_the_device():
            torch.ones(3, device=torch.get_default_device()).sum()
        """
    )

    result = pytester.runpytest(*PLUGIN, "--host-sync-report")

    result.assert_outcomes(passed=2)
    result.stdout.fnmatch_lines(
        [
            "*host syncs per test*",
            "test_survey.py::test_reads: 2 host syncs",
            "  test_survey.py:5: if t.sum() > 0:  (1x, scalar_read)",
            "  test_survey.py:6: t.tolist()  (1x, tolist)",
            "1 of 2 tests made no host sync",
        ]
    )


def run_python(code: str, path: str, cwd: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env=environment,
        cwd=cwd,
        timeout=300,
        check=False,
    )


def test_loading_the_plugin_imports_no_torch(tmp_path):
    """pytest loads every installed plugin in every run, also where torch is missing."""
    run = run_python(
        "import sys, hostsync.detector.pytest_plugin;"
        " print(sorted(m for m in sys.modules if 'torch' in m))",
        str(SOURCE),
        tmp_path,
    )

    assert run.stdout.strip() == "[]", run.stderr[-2000:]


def test_the_plugin_and_its_detector_load_nothing_else_of_the_package(tmp_path):
    """What another project installs is the detector: its plugin and scope stand alone."""
    run = run_python(
        "import sys, hostsync.detector.pytest_plugin, hostsync.detector.scope;"
        " print(sorted(m for m in sys.modules if m.startswith('hostsync')"
        " and not m.startswith('hostsync.detector')))",
        str(SOURCE),
        tmp_path,
    )

    assert run.stdout.strip() == "['hostsync']", run.stderr[-2000:]


@pytest.mark.long_run("pip builds the wheel and installs it, then a project's pytest runs")
def test_the_installed_package_registers_the_plugin_for_any_project(tmp_path):
    """Built offline from the checkout and installed into a folder: a project's pytest run picks
    the plugin up by its entry point, without -p."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (checkout / name).write_bytes((SOURCE.parent / name).read_bytes())
    shutil.copytree(
        SOURCE / "hostsync",
        checkout / "src" / "hostsync",
        ignore=shutil.ignore_patterns("__pycache__"),
    )
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", checkout],
        check=True,
        capture_output=True,
        timeout=300,
    )
    (wheel,) = (tmp_path / "dist").glob("hostsync-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (entry_points,) = [name for name in archive.namelist() if name.endswith("entry_points.txt")]
        assert "[pytest11]\nhostsync.detector.pytest_plugin = hostsync.detector.pytest_plugin" in (
            archive.read(entry_points).decode()
        )
    site = tmp_path / "site"
    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", site, wheel],
        check=True,
        capture_output=True,
        timeout=300,
    )
    assert_the_plugin_gates_a_project_without_p(tmp_path, str(site))


def assert_the_plugin_gates_a_project_without_p(tmp_path: Path, python_path: str) -> None:
    """A project's own pytest run, with no -p and no conftest: the marker gates its test."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "test_step.py").write_text(
        "import pytest, torch\n\n"
        "@pytest.mark.no_host_sync\n"
        "def test_step():\n"
        "    torch.ones(2, device=torch.get_default_device()).sum().item()\n"
    )

    run = run_python(
        "import pytest; raise SystemExit(pytest.main(['-q', '--strict-markers', '-p',"
        " 'no:cacheprovider']))",
        python_path,
        project,
    )

    line = "test_step.py:5: torch.ones(2, device=torch.get_default_device()).sum().item()"
    assert line in run.stdout, run.stdout + run.stderr
    assert "1 failed" in run.stdout


def installed() -> bool:
    """hostsync is imported from an installed package, not from this checkout (`nox -s wheel`)."""
    import hostsync

    return Path(hostsync.__file__).parent != SOURCE / "hostsync"


@pytest.mark.skipif(not installed(), reason="needs the installed wheel: nox -s wheel")
def test_the_installed_wheel_gates_a_project_through_its_entry_point(tmp_path):
    (entry,) = metadata.entry_points(group="pytest11", name="hostsync.detector.pytest_plugin")
    assert entry.value == "hostsync.detector.pytest_plugin"
    assert_the_plugin_gates_a_project_without_p(tmp_path, "")


COMPILED = """
    import pytest
    import torch

    double = torch.compile(lambda t: (t * 2).sum(), backend="eager")

    def test_calls_compiled_code():
        total = double(torch.ones(3))
        assert total.item() == 6.0

    @pytest.mark.no_host_sync
    def test_marked_refuses_compiled_code():
        double(torch.ones(3))
"""


def test_the_report_records_a_compiled_call_and_changes_no_outcome(pytester):
    pytester.makepyfile(test_compiled=COMPILED)

    result = pytester.runpytest(*PLUGIN, "--host-sync-report")

    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*CompiledInScope: a torch.compile'd function was called inside a SyncScope*",
            "test_compiled.py::test_calls_compiled_code: 2 host syncs",
            "  test_compiled.py:7: total = double(torch.ones(3))  (1x, compiled, not judged)",
            "  test_compiled.py:8: assert total.item() == 6.0  (1x, scalar_read)",
        ]
    )
    assert "test_calls_compiled_code FAILED" not in result.stdout.str()


BEFORE = """
    import torch

    def scale(t):
        return t / max(t.sum(), 1)

    def test_step():
        t = torch.ones(4, device=torch.get_default_device())
        scale(t)
        t.tolist()

    def test_quiet():
        torch.ones(2).sum()
"""

# `scale` moved down two lines, the `tolist` gone, one new read.
AFTER = """
    import torch


    def scale(t):
        return t / max(t.sum(), 1)

    def test_step():
        t = torch.ones(4, device=torch.get_default_device())
        scale(t)
        if t.sum() > 0:
            pass

    def test_quiet():
        torch.ones(2).sum()
"""


def test_a_baseline_gates_new_syncs_only_and_lists_those_gone(pytester):
    pytester.makepyfile(test_adopt=BEFORE)
    options = (*PLUGIN, "--host-sync-baseline", "syncs.json", "--host-sync-gate", "all")

    # Each run in a process of its own, as each CI run: Python caches the lines of a source file.
    first = pytester.runpytest_subprocess(*options)

    first.assert_outcomes(passed=2)
    first.stdout.fnmatch_lines(["wrote the host syncs of 1 test to syncs.json: review*"])
    written = json.loads((pytester.path / "syncs.json").read_text())
    assert [
        (entry["function"], entry["code"], entry["kinds"], entry["count"])
        for entry in written["tests"]["test_adopt.py::test_step"]
    ] == [
        ("scale", "return t / max(t.sum(), 1)", ["scalar_read"], 1),
        ("test_step", "t.tolist()", ["tolist"], 1),
    ]

    pytester.makepyfile(test_adopt=AFTER)
    second = pytester.runpytest_subprocess(*options)

    second.assert_outcomes(passed=1, failed=1)
    second.stdout.fnmatch_lines(
        [
            "*1 unexpected host sync:",
            "*test_adopt.py:10: if t.sum() > 0:  (1x in test_step)",
            "*1 baseline entries of syncs.json no longer occur*",
            "  test_adopt.py::test_step: test_adopt.py:9: t.tolist()  (in test_step)",
        ]
    )
    assert "max(t.sum(), 1)  (1x" not in second.stdout.str()
    assert json.loads((pytester.path / "syncs.json").read_text()) == written


def test_without_gate_all_a_baseline_gates_the_marked_tests_only(pytester):
    pytester.makepyfile(test_adopt=BEFORE)
    written = pytester.runpytest_subprocess(*PLUGIN, "--host-sync-baseline", "syncs.json")
    written.assert_outcomes(passed=2)
    marked = AFTER.replace("    import torch\n", "    import pytest\n    import torch\n").replace(
        "    def test_step", "    @pytest.mark.no_host_sync\n    def test_step"
    )
    pytester.makepyfile(
        test_adopt=marked,
        test_other="""
        import torch

        def test_unmarked_reads():
            torch.ones(2).sum().item()
        """,
    )

    result = pytester.runpytest_subprocess(*PLUGIN, "--host-sync-baseline", "syncs.json")

    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(["FAILED test_adopt.py::test_step*"])


def test_a_file_that_is_no_baseline_is_refused_in_one_line(pytester):
    pytester.makepyfile(test_any="def test_nothing():\n    pass\n")
    (pytester.path / "syncs.json").write_text('{"schema": 1, "tests": {"t": [{"file": 3}]}}')

    result = pytester.runpytest(*PLUGIN, "--host-sync-baseline", "syncs.json")

    assert result.ret == pytest.ExitCode.USAGE_ERROR
    assert (
        "ERROR: syncs.json is not a host-sync baseline (tests.t[0].file: expected a string, got"
        " 3): fix it, or delete it and rerun to write it afresh"
    ) in result.stderr.str()
    assert (pytester.path / "syncs.json").read_text().startswith('{"schema": 1')


def test_a_scope_sees_its_own_context_only_in_a_thread_pool():
    """torch's sync-debug mode is process-wide; a scope is per context: each task of a pool sees
    its own reads while the others read at the same time, and the pool's reads are not the
    opening thread's."""
    from concurrent.futures import ThreadPoolExecutor

    import torch

    from hostsync.detector import SyncScope

    tasks = 4
    all_open, all_read = threading.Barrier(tasks + 1), threading.Barrier(tasks + 1)

    def reads(times: int) -> int:
        with SyncScope() as scope:
            all_open.wait()
            for _ in range(times):
                torch.ones(2).sum().item()
            all_read.wait()
        return len(scope.events)

    with ThreadPoolExecutor(tasks) as pool, SyncScope() as caller:
        counts = [pool.submit(reads, times) for times in range(1, tasks + 1)]
        all_open.wait()
        all_read.wait()

    assert [count.result() for count in counts] == [1, 2, 3, 4]
    assert caller.events == []


OTHER_THREADS = """
    import threading

    import pytest
    import torch
    from hostsync.detector import AllowRule
    from torch.utils.data import DataLoader, Dataset

    # Each epoch draws the loader's base seed with .item() of a tensor made without a device.
    SEED = AllowRule("test_threads.py", code="DataLoader(", reason="the base seed, in host memory")

    class Reads(Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, index):
            return torch.ones(2).sum().item() + index

    @pytest.fixture(scope="module")
    def server():
        '''A thread the test did not open, reading while the test runs.'''
        go, read = threading.Event(), threading.Event()

        def serve():
            go.wait()
            torch.ones(2).sum().item()
            read.set()

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        yield go, read
        thread.join()

    @pytest.mark.no_host_sync
    def test_a_server_thread_is_not_the_test(server):
        go, read = server
        go.set()
        # Waits on the server thread's event; the limit only keeps a broken plugin from hanging.
        assert read.wait(timeout=60)

    @pytest.mark.no_host_sync(allow=[SEED])
    def test_dataloader_workers_are_not_the_test():
        assert sorted(DataLoader(Reads(), num_workers=2, batch_size=None)) == [2, 3, 4, 5]

    @pytest.mark.no_host_sync(allow=[SEED])
    def test_a_dataloader_without_workers_reads_in_the_test():
        list(DataLoader(Reads(), num_workers=0, batch_size=None))
"""


def test_threads_the_test_did_not_open_and_dataloader_workers_are_not_counted(pytester):
    pytester.makepyfile(test_threads=OTHER_THREADS)

    # DataLoader imports dynamo, which cannot be imported again in one process.
    result = pytester.runpytest_subprocess(*PLUGIN)

    result.assert_outcomes(passed=2, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*_ test_a_dataloader_without_workers_reads_in_the_test _*",
            "4 unexpected host syncs:",
            "*test_threads.py:16: return torch.ones(2).sum().item() + index  (4x in __getitem__)",
        ]
    )
