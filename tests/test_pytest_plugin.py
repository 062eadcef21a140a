"""The pytest plugin as another project's suite meets it: a marker that gates a test, a fixture,
a survey of a whole run, and the entry point an installed package registers."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

# Loaded before any in-process run: pytester drops the modules a run imports first, and torch
# cannot be loaded twice in one process.
import hostsync.detector  # noqa: F401

pytest_plugins = ["pytester"]

PLUGIN = ("-p", "hostsync.pytest_plugin")
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
            "*2 unexpected host sync(s):",
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
            "test_survey.py::test_reads: 2 host sync(s)",
            "  test_survey.py:5: if t.sum() > 0:  (1x, scalar_read)",
            "  test_survey.py:6: t.tolist()  (1x, tolist)",
            "1 of 2 test(s) made no host sync",
        ]
    )


def run_python(code: str, path: str, cwd: Path) -> subprocess.CompletedProcess:
    environment = {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=environment, cwd=cwd,
        timeout=300, check=False,
    )  # fmt: skip


def test_loading_the_plugin_imports_no_torch(tmp_path):
    """pytest loads every installed plugin in every run, also where torch is missing."""
    run = run_python(
        "import sys, hostsync.pytest_plugin; print(sorted(m for m in sys.modules if 'torch' in m))",
        str(SOURCE),
        tmp_path,
    )

    assert run.stdout.strip() == "[]", run.stderr[-2000:]


def test_the_installed_package_registers_the_plugin_for_any_project(tmp_path):
    """Built offline from the checkout and installed into a folder: a project's pytest run picks
    the plugin up by its entry point, without -p."""
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in ("pyproject.toml", "README.md"):
        (checkout / name).write_bytes((SOURCE.parent / name).read_bytes())
    (checkout / "src" / "hostsync").mkdir(parents=True)
    for module in (SOURCE / "hostsync").glob("*.py"):
        (checkout / "src" / "hostsync" / module.name).write_bytes(module.read_bytes())
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "-w", tmp_path / "dist", checkout],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
    (wheel,) = (tmp_path / "dist").glob("hostsync-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        (entry_points,) = [name for name in archive.namelist() if name.endswith("entry_points.txt")]
        assert "[pytest11]\nhostsync.pytest_plugin = hostsync.pytest_plugin" in (
            archive.read(entry_points).decode()
        )
    site = tmp_path / "site"
    subprocess.run(
        [*pip, "install", "--no-deps", "--no-index", "--target", site, wheel],
        check=True, capture_output=True, timeout=300,
    )  # fmt: skip
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
        str(site),
        project,
    )

    line = "test_step.py:5: torch.ones(2, device=torch.get_default_device()).sum().item()"
    assert line in run.stdout, run.stdout + run.stderr
    assert "1 failed" in run.stdout
