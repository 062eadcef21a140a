"""Careless and hostile input, on real files and real processes: each is refused in one line that
names the cause and the fix, before long work where it can be known up front, and loses nothing.
(The patch queue's own cases are in test_upstream.py, result files in test_engine.py.)"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from local_index import make_sdist, serving

from hostsync.commands import options
from hostsync.commands import repro as repro_command
from hostsync.drafting import review
from hostsync.launch import launchers
from hostsync.launch.launchers import LaunchPlan, World
from hostsync.launch.processes import Run, RunFailed, run_group
from hostsync.measure import repro
from hostsync.measure.records import Verdict
from hostsync.upstream import envs, sdists
from hostsync.upstream.records import EnvRecord
from hostsync.upstream.trees import Tree
from hostsync.workspace import cases, locks, results
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.files import sha256
from hostsync.workspace.layout import ROOT, Layout
from hostsync.workspace.projects import get
from hostsync.workspace.records import Device, Launcher, TreeRole

import made
from conftest import hostsync, make_workspace, one_line_error, processes_running, wait_until

# --- the case option and the card ----------------------------------------------------------------


def test_every_case_of_all_is_tried_and_each_refused_one_named(capsys) -> None:
    chosen = [cases.load(ROOT, name) for name in ("sp-loss", "trainer-nan-filter", "ds-clip-norm")]
    tried = []

    def one(case: cases.Case) -> int:
        tried.append(case.name)
        if case.name == "trainer-nan-filter":
            raise WorkspaceError("no test_patch result in profiles/trainer-nan-filter/")
        return 0

    assert options.each_case(chosen, one) == 2
    assert tried == ["sp-loss", "trainer-nan-filter", "ds-clip-norm"]
    assert capsys.readouterr().err.splitlines() == [
        "error: case trainer-nan-filter: no test_patch result in profiles/trainer-nan-filter/",
        "error: not done for trainer-nan-filter (each said why above)",
    ]
    with pytest.raises(WorkspaceError, match="no test_patch result"):
        options.each_case(chosen[1:2], one)


@pytest.mark.parametrize("name", ["../cases/sp-loss", "", "sp-loss/../sp-loss", "SP-LOSS"])
def test_a_case_is_named_not_given_as_a_path(workspace: Layout, name: str) -> None:
    with pytest.raises(WorkspaceError, match=r"is no case name: name one of .*sp-loss"):
        options.chosen_cases(name, workspace)
    assert not (workspace.work / "cases").exists()


@pytest.mark.parametrize(
    ("pattern", "replacement", "complaint"),
    [
        (r"ranks = \[2, 4\]", 'ranks = "2,4"', r"repro\.launch\[0\]\.ranks: expected a list"),
        (
            r"red_on_pinned = \[.*?\]",
            'red_on_pinned = "x"',
            r"tests\.red_on_pinned: expected a list",
        ),
        (r"size = 9196891", 'size = "9196891"', r"pin\.sdist\.size: expected an integer"),
        (r'state = "fixed"', 'state = "merged"', r"upstream\.state: expected one of"),
        (
            r'launcher = "fork"',
            'launcher = "python"',
            r"repro\.launch\[0\]\.ranks: a `python` launch is one process: use \[1\]",
        ),
    ],
)
def test_a_card_field_of_the_wrong_type_is_refused_before_anything_is_built(
    workspace: Layout, pattern: str, replacement: str, complaint: str
) -> None:
    card, edits = re.subn(
        pattern, replacement, workspace.case_file.read_text(), count=1, flags=re.DOTALL
    )
    assert edits == 1
    workspace.case_file.write_text(card)

    line = one_line_error(hostsync(workspace, "repro", "--case", "sp-loss"))

    assert "cases/sp-loss.toml: " in line and line.endswith("fix the card")
    assert re.search(complaint, line), line
    assert not workspace.clone.exists(), "nothing is built for a card that is refused"


# --- downloads: a card that disagrees with a verified file ---------------------------------------


def local_sdist(tmp_path: Path) -> cases.Sdist:
    archive = make_sdist(tmp_path / "files" / "transformers", "transformers", "5.13.1", {})
    return cases.Sdist(archive.as_uri(), archive.stat().st_size, sha256(archive))


def test_a_card_that_disagrees_with_a_verified_file_is_a_card_error(
    tmp_path: Path,
) -> None:
    layout = Layout(tmp_path / "ws", "sp-loss")
    good = local_sdist(tmp_path)
    cached = sdists.fetch_sdist(layout, good)  # downloaded and verified
    typo = cases.Sdist(good.url, good.size, "0" * 64)

    kept = r"the card pins .* fix the card's sdist \(the file is kept\)"
    with pytest.raises(WorkspaceError, match=kept):
        sdists.fetch_sdist(layout, typo)

    assert cached.exists() and sdists.fetch_sdist(layout, good) == cached


def test_a_verified_file_damaged_since_is_fetched_again(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "ws", "sp-loss")
    good = local_sdist(tmp_path)
    cached = sdists.fetch_sdist(layout, good)
    original = cached.read_bytes()
    cached.write_bytes(original[:-1] + b"\0")

    assert sdists.fetch_sdist(layout, good).read_bytes() == original


def test_a_fresh_download_that_fails_verification_is_discarded(tmp_path: Path) -> None:
    layout = Layout(tmp_path / "ws", "sp-loss")
    good = local_sdist(tmp_path)
    wrong = cases.Sdist(good.url, good.size + 1, good.sha256)

    with pytest.raises(WorkspaceError, match=r"the download of .* has .* it was discarded"):
        sdists.fetch_sdist(layout, wrong)

    assert not list((layout.cache / "sdists").glob("*.tar.gz"))


# --- environments --------------------------------------------------------------------------------


@pytest.mark.parametrize("python", ["/elsewhere/bin/python", "bin/python"])
def test_an_environment_record_naming_no_interpreter_of_its_own_is_refused(
    tmp_path: Path, python: str
) -> None:
    env = tmp_path / "envs" / "transformers-5.13.1"
    env.mkdir(parents=True)

    with pytest.raises(WorkspaceError, match=r"has no interpreter of its own .*remove .* rerun"):
        envs.usable_python(env, EnvRecord(python, (), {}))


def test_an_environment_record_names_its_interpreter_inside_its_folder(tmp_path: Path) -> None:
    env = tmp_path / "envs" / "x"
    (env / "bin").mkdir(parents=True)
    (env / "bin" / "python").symlink_to(sys.executable)  # as venv makes it

    assert envs.usable_python(env, EnvRecord("bin/python", (), {})) == str(env / "bin" / "python")


def test_a_release_without_requires_dist_is_read_from_its_egg_info(tmp_path: Path) -> None:
    requires = "numpy\ntokenizers==0.9.4\n\n[:python_version < '3.7']\ndataclasses\n\n[all]\njax\n"
    archive = make_sdist(
        tmp_path, "transformers", "4.0.0", {"src/transformers.egg-info/requires.txt": requires}
    )
    found = envs.legacy_requirements(sdists.egg_info_requires(archive))

    assert found == ["numpy", "tokenizers==0.9.4", "dataclasses; python_version < '3.7'"]


# --- commands ------------------------------------------------------------------------------------


@pytest.mark.parametrize("value", ["1e9", "inf", "nan", "-inf"])
def test_a_timeout_that_is_no_run_length_is_refused(value: str, capsys) -> None:
    with pytest.raises(SystemExit):
        repro_command.parser().parse_args(["--timeout", value])

    assert "--timeout" in capsys.readouterr().err


def test_a_release_the_index_does_not_have_is_refused_before_any_check(
    workspace: Layout, tmp_path: Path
) -> None:
    make_sdist(tmp_path / "index" / "files" / "transformers", "transformers", "5.12.0", {})
    with serving(tmp_path / "index") as url:
        done = hostsync(
            workspace,
            "test-patch",
            "--case",
            "sp-loss",
            "--release",
            "99.9.9",
            env_extra={sdists.INDEX_ENV: url},
        )

    assert "has no sdist transformers-99.9.9.tar.gz: check the version" in one_line_error(done)
    assert not workspace.clone.exists(), "no check ran"


def test_a_second_command_on_the_same_case_is_refused_naming_the_first(workspace: Layout) -> None:
    with locks.case(workspace):
        line = one_line_error(hostsync(workspace, "clone", "--case", "sp-loss"))

    assert f"case sp-loss is in use by pid {os.getpid()}" in line
    assert hostsync(workspace, "clone", "--case", "nothing-here").returncode == 2  # its own error


# --- results and drafts --------------------------------------------------------------------------


@pytest.fixture
def results_of_sp_loss(workspace: Layout) -> Layout:
    for result in (
        made.repro(workspace, (made.row("pinned", 2, 3),)),
        made.profile(workspace, made.capture("pinned", 3)),
    ):
        results.write(workspace.profiles, result, workspace.unsaved)
    return workspace


@pytest.mark.parametrize("reason", ["run hung: no exit after 5 s", ""])
def test_a_failed_proof_is_never_drafted(results_of_sp_loss: Layout, reason: str) -> None:
    layout = results_of_sp_loss
    red = made.check("pinned+tests", Verdict.OK, made.failed("AssertionError: 3 != 0"))
    hung = made.check("patched", Verdict.WRONG if reason else Verdict.OK)
    proof = made.test_patch(layout, red, hung)
    if not reason:  # a proof that says it failed without a WRONG row
        proof = type(proof)(proof.stamp, False, proof.checks)
    results.write(layout.profiles, proof, layout.unsaved)

    with pytest.raises(WorkspaceError, match=r"is no passing proof .*a draft never says"):
        review.review(made.case_of(layout))

    assert not layout.issue_drafts.exists()


def test_a_result_that_measured_nothing_is_never_drafted(workspace: Layout) -> None:
    results.write(workspace.profiles, made.repro(workspace, ()), workspace.unsaved)
    for result in (
        made.test_patch(workspace, made.check("patched", Verdict.OK)),
        made.profile(workspace, made.capture("pinned", 3)),
    ):
        results.write(workspace.profiles, result, workspace.unsaved)

    with pytest.raises(WorkspaceError, match=r"holds no runs: rerun `nox -s repro"):
        review.review(made.case_of(workspace))


def test_another_cases_result_is_refused_and_never_rerun(results_of_sp_loss: Layout) -> None:
    layout = results_of_sp_loss
    other = layout.for_case("ds-clip-norm")
    copied = results.write(layout.profiles, made.test_patch(other), layout.unsaved)
    before = sorted(layout.profiles.iterdir())

    with pytest.raises(WorkspaceError, match=f"{copied.name} is a result of case ds-clip-norm"):
        review.review(made.case_of(layout), rerun=True)

    assert sorted(layout.profiles.iterdir()) == before


# --- ranks ---------------------------------------------------------------------------------------

RETURNS_NO_RUNS = """
    import torch.distributed as dist

    from hostsync.rank.protocol import rank_entry


    @rank_entry
    def main():
        dist.init_process_group("gloo")
        return {"rows": []}
"""


@pytest.mark.distributed
def test_a_rank_that_breaks_the_contract_is_named_and_its_result_kept(tmp_path: Path) -> None:
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(RETURNS_NO_RUNS))
    root = tmp_path / "tree"  # the tree under test: a package the rank checks it imported
    (root / "src" / "transformers").mkdir(parents=True)
    (root / "src" / "transformers" / "__init__.py").write_text("")
    tree = Tree("t", TreeRole.RELEASE, root, "0", "", "", get("transformers"), sys.executable)
    run = Run(tmp_path / "run", tree, Layout(tmp_path))
    (ranks,) = launchers.run_worlds(
        Launcher.FORK, run, LaunchPlan(script, (World(2, ()),), Device.CPU, 120)
    )

    with pytest.raises(RunFailed, match=r"rank 0 returned no `runs` list, not one row for each"):
        repro.check_contract(ranks, ["a"], run.run_dir)

    assert (run.run_dir / "world-0-ranks-2" / "rank-0.json").exists()


# --- Ctrl-C --------------------------------------------------------------------------------------

DIES_MIDWAY_THROUGH_A_BUILD = """
    import os
    import subprocess
    import sys
    from pathlib import Path

    from torch.utils.file_baton import FileBaton

    build = Path(os.environ["TORCH_EXTENSIONS_DIR"], "op")
    build.mkdir(parents=True)
    assert FileBaton(str(build / "lock")).try_acquire()
    subprocess.Popen(["sleep", "3600"])  # the compiler it started, still running
    sys.exit(1)
"""

BUILDS_UNTIL_TOLD_TO_FINISH = """
    import os
    import sys
    import time
    from pathlib import Path

    from torch.utils.file_baton import FileBaton

    build = Path(os.environ["TORCH_EXTENSIONS_DIR"], "op")
    build.mkdir(parents=True)
    baton = FileBaton(str(build / "lock"))
    assert baton.try_acquire()
    Path(sys.argv[1], "building").touch()
    while not Path(sys.argv[1], "finish").exists():  # the test says when
        time.sleep(0.05)
    baton.release()  # FileNotFoundError if another run removed the lock under it
"""

STOPPED_ONCE_ANOTHER_BUILDS = """
    import subprocess
    import sys
    import time
    from pathlib import Path

    Path(sys.argv[1], "stopping").touch()
    while not Path(sys.argv[1], "building").exists():  # the other run's build has begun
        time.sleep(0.05)
    subprocess.Popen(["sleep", "3600"])  # left running: the group is stopped, not finished
    sys.exit(1)
"""


class ExtensionsHere(Run):
    """A run of a command that is no rank: this process's variables, one extensions folder."""

    def environment(self, extra=None) -> dict[str, str]:
        return os.environ | {"TORCH_EXTENSIONS_DIR": str(self.run_dir.parent / "extensions")}


def test_a_build_stopped_midway_leaves_no_lock_for_the_next_to_wait_on(tmp_path: Path) -> None:
    """torch frees an extension's build lock only when the build ends: one killed at a timeout
    or by Ctrl-C would make every later run of that environment hang."""
    run = ExtensionsHere(tmp_path / "run", tree=None)  # type: ignore[arg-type]
    ever_held = tmp_path / "extensions" / "op" / "lock"
    script = tmp_path / "build.py"
    script.write_text(textwrap.dedent(DIES_MIDWAY_THROUGH_A_BUILD))

    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    assert run_group(run, [sys.executable, str(script)], timeout=600) == 1

    assert ever_held.parent.is_dir() and not ever_held.exists()


def test_a_run_stopped_beside_a_live_build_leaves_that_builds_lock(tmp_path: Path) -> None:
    """Two runs share one extensions folder, and one is stopped while the other, started after
    it, builds: the lock is the live build's, which fails when it releases a removed lock (and a
    third build would write into its half-built op)."""
    runs = {
        name: ExtensionsHere(tmp_path / f"{name}-run", tree=None)  # type: ignore[arg-type]
        for name in ("build", "stop")
    }
    commands = {}
    for name, source in (
        ("build", BUILDS_UNTIL_TOLD_TO_FINISH),
        ("stop", STOPPED_ONCE_ANOTHER_BUILDS),
    ):
        (tmp_path / f"{name}.py").write_text(textwrap.dedent(source))
        commands[name] = [sys.executable, str(tmp_path / f"{name}.py"), str(tmp_path)]
    lock = tmp_path / "extensions" / "op" / "lock"

    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        stop = pool.submit(run_group, runs["stop"], commands["stop"], timeout=600)
        wait_until(lambda: (tmp_path / "stopping").exists() or stop.done())
        build = pool.submit(run_group, runs["build"], commands["build"], timeout=600)
        assert stop.result() == 1, runs["stop"].log_file.read_text()
        still_held = lock.exists()
        (tmp_path / "finish").touch()

        assert still_held, "the run stopped removed the lock of a build that was still running"
        assert build.result() == 0, runs["build"].log_file.read_text()
    assert not lock.exists()


IGNORES_SIGTERM = """
    import os
    import signal
    import time
    from pathlib import Path

    from hostsync.rank.protocol import rank_entry


    @rank_entry
    def main():
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        Path(os.environ["HOSTSYNC_RUN_DIR"], "started-" + os.environ["RANK"]).touch()
        time.sleep(3600)  # a rank that never ends: only the Ctrl-C under test stops it
"""

RETURNS_ROWS = """
    from hostsync.rank.protocol import rank_entry, repro_parser


    @rank_entry
    def main():
        args = repro_parser("rows").parse_args()
        return {"runs": [{"scenario": name, "host_syncs": 0} for name in args.scenarios]}
"""


def entry_point(layout: Layout, how: str) -> list[str]:
    """How a user starts `repro`: the command itself, or the nox session around it."""
    if how == "hostsync":
        return [sys.executable, "-m", "hostsync", "repro"]
    nox = shutil.which("nox")
    if nox is None:
        pytest.skip("nox is not on the PATH")
    shutil.copy(ROOT / "noxfile.py", layout.root / "noxfile.py")
    (layout.root / "src").symlink_to(ROOT / "src")
    return [nox, "-f", str(layout.root / "noxfile.py"), "-s", "repro", "--"]


# docs/sessions.md's promise: every process gone this long after Ctrl-C, on a loaded machine too.
STOPPED_WITHIN_S = 10.0


@pytest.mark.distributed
@pytest.mark.network
@pytest.mark.parametrize("how", ["hostsync", "nox"])
def test_ctrl_c_stops_every_rank_writes_nothing_and_the_next_run_works(
    tmp_path: Path, how: str
) -> None:
    layout = make_workspace(tmp_path / "workspace")
    script = layout.repro / "sp_loss.py"
    script.write_text(textwrap.dedent(IGNORES_SIGTERM))
    env = os.environ | {"PYTHONPATH": str(ROOT / "src"), "HOSTSYNC_ROOT": str(layout.root)}
    # Two trees (side by side where the cores hold both trees' ranks); the run's own timeout ends
    # it should its ranks never start.
    command = [
        *entry_point(layout, how),
        "--case",
        "sp-loss",
        "--trees",
        "pinned,patched",
        "--ranks",
        "2",
        "--scenarios",
        "all_tokens",
        "--timeout",
        "600",
    ]
    # Its own process group, as a terminal's foreground job: Ctrl-C goes to that whole group. It
    # starts with SIGINT ignored, as a job a script starts in the background (`sh -c 'nox &'`, CI
    # runners) does, and which Python keeps: the command must still stop on Ctrl-C.
    log = tmp_path / "output.txt"
    with log.open("w") as output:
        started = subprocess.Popen(
            command,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
        )
    wait_until(
        lambda: (
            len(list(layout.work.glob("runs/*/world-*/started-*"))) >= 2
            or started.poll() is not None
        )
    )
    assert started.poll() is None, log.read_text()

    interrupted = time.monotonic()
    os.killpg(started.pid, signal.SIGINT)
    try:
        started.wait(timeout=STOPPED_WITHIN_S)
    except subprocess.TimeoutExpired:
        left = processes_running(str(layout.root))
        for pid in left:
            os.kill(pid, signal.SIGKILL)
        started.wait()
        pytest.fail(f"still running {STOPPED_WITHIN_S:.0f} s after Ctrl-C: {list(left.values())}")
    stopped_in = time.monotonic() - interrupted
    output = log.read_text()

    assert started.returncode == 130, output
    assert "interrupted: every process it started was stopped" in output
    assert "Traceback" not in output
    assert processes_running(str(layout.root)) == {}, f"{stopped_in:.1f} s to stop"
    assert not list(layout.profiles.glob("repro-*.json"))

    script.write_text(textwrap.dedent(RETURNS_ROWS))
    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    (written,) = layout.profiles.glob("repro-*.json")
    assert [run["host_syncs"] for run in json.loads(written.read_text())["runs"]] == [0, 0]
