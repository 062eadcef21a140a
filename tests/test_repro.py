"""The reproducer for real: forked ranks, gloo, DeepSpeed Ulysses groups, the trees' own function.

One 2-rank run per tree of the loss case (pinned 5.13.1 and upstream's fixed 5.14.0) with every
scenario, shared by the tests below; then how the engine merges ranks, refuses bad input, and
what the launcher does when a rank raises or hangs.
"""

from __future__ import annotations

import concurrent.futures
import re
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hostsync.launch import devices, launchers, processes
from hostsync.launch.launchers import LaunchPlan, World
from hostsync.launch.processes import Run, RunFailed
from hostsync.measure import report as repro_report
from hostsync.measure import repro
from hostsync.measure.records import ReproResult
from hostsync.rank.records import RankReport
from hostsync.upstream.trees import Tree, prepare_tree, prepare_trees
from hostsync.workspace import cases, results
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import Device, Launcher

import made
from bug_sites import DEEPSPEED_PY, IF_PER_RANK, MAX_OF_TOTAL, source_line
from conftest import OwnEnvironment, make_workspace

SP_SIZE = 2
FIXED = "5.14.0"
# What later sessions read from each entry of a repro result's `runs`.
RUN_KEYS = {
    "tree",
    "launch",
    "ranks",
    "sp_size",
    "backend",
    "scenario",
    "host_syncs",
    "sync_sites",
    "forward_syncs",
    "loss",
    "reference_loss",
    "loss_abs_diff",
    "loss_ok",
    "loss_is_graph_tensor",
    "backward_error",
    "grads_ok",
    "grad_max_abs_diff",
    "problems",
}


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Layout:
    return make_workspace(tmp_path_factory.mktemp("repro") / "workspace")


@pytest.fixture(scope="module")
def case(layout: Layout) -> cases.Case:
    return cases.load(layout.root, layout.case)


@pytest.fixture(scope="module")
def trees(layout: Layout) -> dict[str, Tree]:
    return {name: prepare_tree(made.case_of(layout), name) for name in ("pinned", "fixed")}


# A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
def settings(
    trees: tuple[str, ...], scenarios: list[str] | None = None, ranks: str | None = None
) -> repro.ReproSettings:
    return repro.ReproSettings(
        trees=trees,
        scenarios=scenarios and ",".join(scenarios),
        ranks=ranks,
        device="cpu",
        timeout=900,
        trainer=False,
    )


@pytest.fixture(scope="module")
def result(layout: Layout, trees: dict[str, Tree]) -> ReproResult:
    return repro.repro_case(made.case_of(layout), settings(("pinned", "fixed"), ranks=str(SP_SIZE)))


@pytest.fixture(scope="module")
def measured(result: ReproResult) -> dict:
    """The result as its file holds it: what the drafts and later sessions read."""
    return result.document()


def runs_of(measured: dict, tree: str) -> dict[str, dict]:
    return {run["scenario"]: run for run in measured["runs"] if run["tree"] == tree}


@pytest.mark.distributed
def test_pinned_tree_syncs_at_the_if_per_rank_and_once_at_max(
    measured: dict, case: cases.Case, trees: dict[str, Tree]
) -> None:
    if_line = source_line(trees["pinned"], IF_PER_RANK)
    max_line = source_line(trees["pinned"], MAX_OF_TOTAL)
    runs = runs_of(measured, "pinned")

    assert set(runs) == set(case.scenarios)
    for run in runs.values():
        assert run["host_syncs"] == SP_SIZE + 1, run["scenario"]
        assert "host_syncs_per_rank" not in run, "every rank takes the same syncs"
        sites = [(site["file"], site["line"], site["count"]) for site in run["sync_sites"]]
        assert sites == [(DEEPSPEED_PY, if_line, SP_SIZE), (DEEPSPEED_PY, max_line, 1)]


@pytest.mark.distributed
def test_fixed_release_has_no_sync_in_the_aggregation(measured: dict) -> None:
    assert runs_of(measured, FIXED), "the fixed release was measured"
    for run in runs_of(measured, FIXED).values():
        assert run["host_syncs"] == 0, run["scenario"]
        assert run["sync_sites"] == []
        assert run["problems"] == []


@pytest.mark.distributed
def test_forward_syncs_are_reported_apart_on_both_trees(measured: dict) -> None:
    """The model forward has syncs of its own; they must not leak into the aggregation count."""
    assert measured["runs"]
    for run in measured["runs"]:
        assert run["forward_syncs"], run["scenario"]
        assert {site["reason"] for site in run["forward_syncs"]} == {"model forward"}
        assert all(site["file"] != DEEPSPEED_PY for site in run["forward_syncs"])


@pytest.mark.distributed
def test_losses_and_gradients_match_one_process_wherever_a_loss_is_defined(
    measured: dict, case: cases.Case
) -> None:
    defined = [run for run in measured["runs"] if run["reference_loss"] is not None]

    assert {run["scenario"] for run in defined} == set(case.scenarios) - {"all_masked"}
    for run in defined:
        where = (run["tree"], run["scenario"])
        assert run["loss_ok"], where
        assert run["loss_is_graph_tensor"], where
        assert run["grads_ok"], where
        assert run["problems"] == [], where


@pytest.mark.distributed
def test_all_masked_pinned_returns_a_float_that_backward_refuses(measured: dict) -> None:
    pinned = runs_of(measured, "pinned")["all_masked"]
    fixed = runs_of(measured, FIXED)["all_masked"]

    assert (pinned["loss"], pinned["loss_type"]) == (0.0, "float")
    assert not pinned["loss_is_graph_tensor"]
    assert pinned["backward_error"].startswith("AssertionError")
    assert pinned["problems"] == [f"backward failed ({pinned['backward_error']})"]
    assert (fixed["loss"], fixed["loss_type"]) == (0.0, "Tensor")
    assert fixed["loss_is_graph_tensor"]
    assert fixed["backward_error"] is None
    assert fixed["grads_ok"]


@pytest.mark.distributed
def test_result_file_holds_the_contract(result: ReproResult, layout: Layout) -> None:
    path = results.write(layout.profiles, result, layout.unsaved)
    document = results.read(path, ReproResult).document()
    assert document["runs"], "the run measured something"

    assert path.parent == layout.root / "profiles" / "sp-loss"
    assert document["case"] == "sp-loss"
    assert set(document["trees"]) == {"pinned", FIXED}
    assert document["trees"]["pinned"]["version"] == "5.13.1"
    for run in document["runs"]:
        assert set(run) >= RUN_KEYS
        assert (run["ranks"], run["sp_size"], run["backend"]) == (SP_SIZE, SP_SIZE, "gloo")
        for site in run["sync_sites"] + run["forward_syncs"]:
            assert {"file", "line", "function", "code", "count"} <= set(site)


# --- merging ranks -------------------------------------------------------------------------------


def test_ranks_that_agree_give_one_value_and_those_that_differ_say_so() -> None:
    site = {"file": "pkg/a.py", "line": 3, "function": "f", "code": "if t:", "count": 1}
    ranks = [
        {
            "runs": [
                {
                    "scenario": "s",
                    "syncs": 2,
                    "ok": True,
                    "tokens": 8,
                    "site_lists": {"sites": [site]},
                    "problems": [],
                }
            ]
        },
        {
            "runs": [
                {
                    "scenario": "s",
                    "syncs": 2,
                    "ok": False,
                    "tokens": 0,
                    "site_lists": {"sites": [site | {"count": 2}]},
                    "problems": ["loss is off"],
                }
            ]
        },
    ]

    reports = [RankReport(rank, document) for rank, document in enumerate(ranks)]
    (merged,) = repro.merge_ranks(reports, tree="pinned", launch="a.py", ranks=2)

    row = merged.to_json()
    assert row["syncs"] == 2 and "syncs_per_rank" not in row
    assert (row["ok"], row["ok_per_rank"]) == (False, [True, False])
    assert (row["tokens"], row["tokens_per_rank"]) == (8, [8, 0])
    assert [(s["count"], s["count_per_rank"]) for s in row["sites"]] == [(2, [1, 2])]
    assert row["problems"] == ["loss is off"]
    assert type(merged).from_json(row) == merged, "a row reads back as it was written"
    notes = repro_report.anomalies([merged], ["syncs", "ok"])
    assert notes == ["pinned x2 s: ranks differ in ok [True, False]", "pinned x2 s: loss is off"]


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("ranks", ["1", "3", "2,x", ""])
def test_rank_counts_the_card_does_not_declare_are_refused(ranks: str, case: cases.Case) -> None:
    with pytest.raises(WorkspaceError, match="--ranks"):
        repro.parse_ranks(case, ranks)


def test_unknown_scenario_is_refused_with_the_choices(case: cases.Case) -> None:
    with pytest.raises(WorkspaceError, match="all_tokens"):
        repro.parse_scenarios(case, "all_tokens,everything")


def test_nccl_without_a_gpu_per_rank_is_refused() -> None:
    python = sys.executable  # an environment with torch: the one running the tests
    if devices.describe(python).device_count >= 2:
        pytest.skip("this machine has a GPU per rank")
    with pytest.raises(WorkspaceError, match="one per rank"):
        devices.resolve_device("cuda", 2, python)


def test_patched_alone_with_an_empty_series_is_refused(workspace: Layout) -> None:
    (workspace.patches / "series").write_text("")

    with pytest.raises(WorkspaceError, match="the case's series is empty"):
        prepare_trees(made.case_of(workspace), ["patched"])


# --- the launchers: one import for every world, a rank that raises, a rank that hangs -----------

REPORTS_ITS_PROCESS = """
    import os

    import torch.distributed as dist

    from hostsync.rank.protocol import rank_entry

    IMPORTED_IN = os.getpid()


    @rank_entry
    def main():
        dist.init_process_group("gloo")
        return {
            "imported_in": IMPORTED_IN, "pid": os.getpid(), "rank": dist.get_rank(),
            "world_size": dist.get_world_size(), "argv": __import__("sys").argv[1:],
        }


    if __name__ == "__main__":
        main()
"""

RAISES_ON_RANK_1 = """
    import torch.distributed as dist

    from hostsync.rank.protocol import rank_entry


    @rank_entry
    def main():
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            raise ValueError("rank 1 gives up")
        dist.barrier()  # waits for rank 1, which never comes: the launcher must end it
        return {}


    if __name__ == "__main__":
        main()
"""

HANGS_ON_RANK_1 = """
    import os
    import time
    from pathlib import Path

    import torch.distributed as dist

    from hostsync.rank.protocol import rank_entry


    @rank_entry
    def main():
        dist.init_process_group("gloo")
        Path(os.environ["HOSTSYNC_RUN_DIR"], f"started-{dist.get_rank()}").touch()
        if dist.get_rank() == 1:
            time.sleep(3600)  # the hang under test: the launcher's timeout must end it
        dist.barrier()
        return {}


    if __name__ == "__main__":
        main()
"""
LAUNCHERS = [Launcher.TORCHRUN, Launcher.FORK]


def write_script(tmp_path: Path, source: str) -> Path:
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(source))
    return script


def run_script(tmp_path: Path, tree: Tree, source: str, timeout: float, launcher: Launcher) -> Path:
    """Launch a throwaway 2-rank script; return it so the test can look for survivors."""
    script = write_script(tmp_path, source)
    run = Run(tmp_path / "run", tree, Layout())
    launchers.run_worlds(launcher, run, LaunchPlan(script, (World(2, ()),), Device.CPU, timeout))
    return script


def survivors(script: Path) -> list[str]:
    """Live processes (zombies excluded: they hold no resources) still running `script`, or
    forked from an interpreter that imported it."""
    listing = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    rows = [line.strip().partition(" ") for line in listing.splitlines()]
    named = (str(script), str(script.parent / "run" / "plan.json"))
    return [args for stat, _, args in rows if any(n in args for n in named) and stat[0] != "Z"]


@pytest.mark.distributed
def test_forked_ranks_share_one_import_across_worlds(
    tmp_path: Path, trees: dict[str, Tree]
) -> None:
    script = write_script(tmp_path, REPORTS_ITS_PROCESS)
    run = Run(tmp_path / "run", trees["pinned"], Layout())
    worlds = (World(2, ("--two",)), World(3, ("--three",)))

    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    worlds = launchers.run_worlds(Launcher.FORK, run, LaunchPlan(script, worlds, Device.CPU, 300))

    reports = [report.payload for world in worlds for report in world]
    assert [(r["world_size"], r["rank"], r["argv"]) for r in reports] == [
        (2, 0, ["--two"]),
        (2, 1, ["--two"]),
        (3, 0, ["--three"]),
        (3, 1, ["--three"]),
        (3, 2, ["--three"]),
    ]
    assert len({r["imported_in"] for r in reports}) == 1
    assert len({r["pid"] for r in reports} | {reports[0]["imported_in"]}) == 6


SAYS_WHERE_IT_RUNS = """
    import os
    import sys

    import worker

    print(f"snippet in {os.getpid()}, forked from {os.getppid()}, {worker.IMPORTED_IN=}")
    sys.exit(int(os.environ["SNIPPET_EXIT"]))
"""


@pytest.mark.distributed
def test_the_snippet_runs_after_the_ranks_in_the_interpreter_they_were_forked_from(
    tmp_path: Path, trees: dict[str, Tree]
) -> None:
    script = write_script(tmp_path, REPORTS_ITS_PROCESS)
    (tmp_path / "snippet.py").write_text(textwrap.dedent(SAYS_WHERE_IT_RUNS))
    for status in (0, 3):
        run = Run(tmp_path / f"run-{status}", trees["pinned"], Layout())
        log = tmp_path / f"snippet-{status}.log"
        snippet = launchers.Snippet(tmp_path / "snippet.py", log, {"SNIPPET_EXIT": str(status)})
        # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
        what = LaunchPlan(script, (World(2, ()),), Device.CPU, 300, snippet=snippet)

        (ranks,) = launchers.run_worlds(Launcher.FORK, run, what)

        (interpreter,) = {rank.payload["imported_in"] for rank in ranks}
        said = f"forked from {interpreter}, worker.IMPORTED_IN={interpreter}"
        assert said in log.read_text()
        assert snippet.ended().exit_status == status  # its own, not the launch's


# A rank script whose leading imports (up to the project under test) name a module that says
# which process imported it: the interpreter the trees share, or each tree's own.
SAYS_WHO_IMPORTED_WHAT = """
    import os
    import time

    import torch.distributed as dist
    import where_imported

    import transformers

    from hostsync.rank.protocol import rank_entry

    IMPORTED_IN = os.getpid()
    IMPORTED_AT = time.monotonic()


    @rank_entry
    def main():
        started = time.monotonic()
        dist.init_process_group("gloo")
        dist.barrier()
        return {
            "shared_in": where_imported.PID, "imported_in": IMPORTED_IN,
            "transformers": transformers.__file__, "rank": dist.get_rank(),
            "imported_at": IMPORTED_AT, "started": started, "ended": time.monotonic(),
        }
"""


def tree_jobs(tmp_path: Path, script: Path, trees: list[Tree]) -> list[tuple[Run, LaunchPlan]]:
    """A 2-rank launch of `script` on each tree, the shared interpreter's folder under
    `tmp_path`."""
    layout = Layout(tmp_path, "sp-loss")
    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    start = LaunchPlan(script, (World(2, ()),), Device.CPU, 300)
    return [(Run(tmp_path / tree.label, tree, layout), start) for tree in trees]


@pytest.fixture(scope="module")
def shared_ranks(
    tmp_path_factory: pytest.TempPathFactory, trees: dict[str, Tree]
) -> dict[str, list[dict[str, object]]]:
    """What each rank of the pinned and the fixed tree said, launched from one interpreter."""
    tmp_path = tmp_path_factory.mktemp("shared")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "where_imported.py").write_text("import os\n\nPID = os.getpid()\n")
    script = write_script(tmp_path, SAYS_WHO_IMPORTED_WHAT)
    with pytest.MonkeyPatch.context() as monkeypatch:
        monkeypatch.setenv("PYTHONPATH", str(shared))
        found = launchers.fork_trees(tree_jobs(tmp_path, script, [trees["pinned"], trees["fixed"]]))
    (([pinned], _), ([fixed], _)) = found
    return {
        "pinned": [report.payload for report in pinned],
        "fixed": [report.payload for report in fixed],
    }


@pytest.mark.distributed
def test_trees_of_one_environment_share_the_imports_before_the_project_and_nothing_else(
    shared_ranks: dict[str, list[dict[str, object]]], trees: dict[str, Tree]
) -> None:
    pinned_ranks, fixed_ranks = shared_ranks["pinned"], shared_ranks["fixed"]
    ranks = pinned_ranks + fixed_ranks
    assert launchers.sharing_groups([trees["pinned"], trees["fixed"]], Layout()) == [
        [trees["pinned"], trees["fixed"]]
    ]
    assert len({rank["shared_in"] for rank in ranks}) == 1  # one import, in the shared interpreter
    assert len({rank["imported_in"] for rank in pinned_ranks}) == 1  # the tree's own fork
    assert {rank["imported_in"] for rank in pinned_ranks} != {r["imported_in"] for r in fixed_ranks}
    assert ranks[0]["shared_in"] not in {rank["imported_in"] for rank in ranks}
    for name, its_ranks in shared_ranks.items():
        assert {Path(str(rank["transformers"])).parent.parent for rank in its_ranks} == {
            trees[name].src
        }


@pytest.mark.distributed
def test_trees_import_side_by_side_and_run_one_after_another(
    shared_ranks: dict[str, list[dict[str, object]]],
) -> None:
    def times(key: str, name: str) -> list[float]:
        return [float(str(rank[key])) for rank in shared_ranks[name]]

    imported = times("imported_at", "pinned") + times("imported_at", "fixed")
    assert max(imported) < min(times("started", "pinned"))  # the fixed tree imported first
    assert max(times("ended", "pinned")) < min(times("started", "fixed"))


@pytest.mark.distributed
def test_a_tree_that_fails_in_a_shared_interpreter_is_named_and_the_next_does_not_run(
    tmp_path: Path, trees: dict[str, Tree]
) -> None:
    script = write_script(tmp_path, RAISES_ON_RANK_1)
    jobs = tree_jobs(tmp_path, script, [trees["pinned"], trees["fixed"]])

    with pytest.raises(RunFailed, match=r"rank 1 raised ValueError: rank 1 gives up"):
        launchers.fork_trees(jobs)

    assert not (tmp_path / FIXED / "world-0-ranks-2").exists()
    (plan,) = (tmp_path / "work" / "runs").glob("shared-worker-*/plan.json")
    listing = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    assert [row for row in listing.splitlines() if str(plan) in row and "Z" not in row[:2]] == []


@pytest.mark.distributed
def test_the_snippet_prints_the_line_an_issue_quotes_on_each_tree(result: ReproResult) -> None:
    assert result.snippet.output == {
        "pinned": "transformers 5.13.1: 2 host syncs in deepspeed_sp_compute_loss",
        FIXED: f"transformers {FIXED}: 0 host syncs in deepspeed_sp_compute_loss",
    }


@pytest.mark.distributed
def test_a_script_without_main_is_refused_by_the_fork_launcher_in_one_line(
    tmp_path: Path, trees: dict[str, Tree]
) -> None:
    script = write_script(tmp_path, "import os\n")
    run = Run(tmp_path / "run", trees["pinned"], Layout())

    with pytest.raises(RunFailed, match="launcher exited with status 1"):
        # A hang guard: the launcher refuses the script at once, long before it.
        launchers.run_worlds(
            Launcher.FORK, run, LaunchPlan(script, (World(2, ()),), Device.CPU, 60)
        )

    assert "worker.py has no main()" in run.log_file.read_text()


@pytest.mark.distributed
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_rank_that_raises_is_named_and_nothing_survives(
    tmp_path: Path, trees: dict[str, Tree], launcher: Launcher
) -> None:
    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    with pytest.raises(RunFailed, match=r"rank 1 raised ValueError: rank 1 gives up"):
        run_script(tmp_path, trees["pinned"], RAISES_ON_RANK_1, timeout=300, launcher=launcher)

    assert survivors(tmp_path / "worker.py") == []


# The timeout is what this tests, so it is time, and generous: torchrun and two ranks importing
# torch on a loaded 2-core machine can take longer than 30 s to meet, and a run that times out
# before its rank hangs tests nothing.
HUNG_AFTER_S = 120.0


Hung = concurrent.futures.Future[tuple[Path, BaseException | None]]


@pytest.fixture(scope="module")
def hung_runs(
    tmp_path_factory: pytest.TempPathFactory, trees: dict[str, Tree]
) -> Iterator[dict[Launcher, Hung]]:
    """A hung 2-rank run per launcher, all started at once: each waits out its whole timeout,
    idle, beside the tests that run before theirs. Per launcher: its folder, and what the launch
    raised."""

    def hang(launcher: Launcher) -> tuple[Path, BaseException | None]:
        folder = tmp_path_factory.mktemp(f"hung-{launcher.value}")
        try:
            run_script(folder, trees["pinned"], HANGS_ON_RANK_1, HUNG_AFTER_S, launcher=launcher)
        except BaseException as error:
            return folder, error
        return folder, None

    with concurrent.futures.ThreadPoolExecutor(len(LAUNCHERS)) as pool:
        yield {launcher: pool.submit(hang, launcher) for launcher in LAUNCHERS}


@pytest.fixture(scope="module", autouse=True)
def hung_runs_first(request: pytest.FixtureRequest) -> None:
    """The hung runs start with the module's first test, where a test of theirs is selected."""
    items = request.session.items
    mine = [item for item in items if getattr(item, "module", None) is request.module]
    if any("hung_runs" in getattr(item, "fixturenames", ()) for item in mine):
        request.getfixturevalue("hung_runs")


@pytest.mark.distributed
@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_hung_rank_is_killed_at_the_timeout_and_nothing_survives(
    hung_runs: dict[Launcher, Hung], launcher: Launcher
) -> None:
    folder, error = hung_runs[launcher].result()
    assert isinstance(error, RunFailed), error
    assert re.search(rf"run hung: no exit after {HUNG_AFTER_S:.0f} s", str(error)), error

    started = sorted(marker.name for marker in (folder / "run").rglob("started-*"))
    assert started == ["started-0", "started-1"], "the run timed out before both ranks ran"
    assert survivors(folder / "worker.py") == []


def test_runs_side_by_side_stop_together_when_one_fails(tmp_path: Path) -> None:
    """A run that fails stops the ones beside it at once, not at their timeout, and leaves none
    of their processes behind."""
    hangs = OwnEnvironment(tmp_path / "hangs", tree=None)  # type: ignore[arg-type]
    started = tmp_path / "hangs" / "started"
    script = f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(3600)"

    def fails_once_the_other_runs() -> None:
        while not started.exists():
            # Polls for an event (the other run started), not a wait of fixed length.
            time.sleep(0.05)
        raise RunFailed("rank 0 raised ValueError")

    # The hanging run's timeout is never reached: the failure beside it stops it (what is tested).
    with pytest.raises(RunFailed, match="rank 0 raised ValueError"):
        processes.side_by_side(
            [
                lambda: processes.run_group(hangs, [sys.executable, "-c", script], timeout=3600),
                fails_once_the_other_runs,
            ],
            at_once=2,
        )

    assert started.exists()
    listing = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    assert [row for row in listing.splitlines() if str(started) in row and "Z" not in row[:2]] == []


# --- the live cases, pinned against patched ------------------------------------------------------


def measure_live_case(
    tmp_path: Path, name: str, scenarios: list[str], ranks: str | None = None
) -> dict:
    """A case's reproducer on its pinned and patched trees, in a workspace of its own."""
    layout = make_workspace(tmp_path / "workspace").for_case(name)
    result = repro.repro_case(
        made.case_of(layout), settings(("pinned", "patched"), scenarios, ranks)
    )
    return result.document()


@pytest.mark.heavy
@pytest.mark.distributed
@pytest.mark.network
def test_the_trainer_filter_reads_twice_per_finite_micro_batch_and_the_fix_never(
    tmp_path: Path,
) -> None:
    """The live case on its pinned transformers: the real Trainer, a real nan loss."""
    measured = measure_live_case(tmp_path, "trainer-nan-filter", ["finite", "nan"], ranks="1")

    runs = {(run["tree"], run["scenario"]): run for run in measured["runs"]}
    assert runs["pinned", "finite"]["syncs_per_micro_batch"] == [2, 2, 2, 2]
    # isnan is True on the nan micro-batch, so `or` never asks isinf there.
    assert runs["pinned", "nan"]["syncs_per_micro_batch"] == [2, 2, 1, 2]
    assert {site["function"] for site in runs["pinned", "nan"]["site_lines"]} == {"_run_epoch"}
    for scenario in ("finite", "nan"):
        assert runs["patched", scenario]["syncs_per_micro_batch"] == [0, 0, 0, 0]
    assert [c["verdict"] for c in measured["comparisons"]] == ["identical", "identical"]


@pytest.mark.heavy
@pytest.mark.distributed
@pytest.mark.network
def test_zero_clipping_reads_the_norm_once_per_group_and_the_fix_never(tmp_path: Path) -> None:
    """The DeepSpeed case, bf16 ZeRO 1 on real ranks: same training, two reads fewer a step, one
    of them after a group's update."""
    measured = measure_live_case(tmp_path, "ds-clip-norm", ["bf16-zero1"])

    runs = {run["tree"]: run for run in measured["runs"]}
    groups = runs["pinned"]["param_groups"]
    overflow = runs["pinned"]["overflow_step"] - 1
    pinned = runs["pinned"]["clip_reads_per_step"]
    assert pinned == [0 if step == overflow else groups for step in range(len(pinned))]
    # step() reads the norm before its per-group loop: only the later groups' reads wait for an
    # update queued before them
    after_an_update = runs["pinned"]["clip_reads_after_an_update_per_step"]
    assert after_an_update == [0 if step == overflow else groups - 1 for step in range(len(pinned))]
    assert set(runs["patched"]["clip_reads_per_step"]) == {0}
    assert runs["pinned"]["skipped_steps"] == runs["patched"]["skipped_steps"] == 1
    assert [c["verdict"] for c in measured["comparisons"]] == ["identical"]


@pytest.mark.heavy
@pytest.mark.distributed
@pytest.mark.network
def test_the_deepspeed_grad_norm_is_read_every_step_and_with_the_fix_only_when_logged(
    tmp_path: Path,
) -> None:
    """The Trainer under DeepSpeed ZeRO 1 + Ulysses SP, logging once in 4 steps."""
    measured = measure_live_case(tmp_path, "trainer-grad-norm", ["every_4_steps"])

    runs = {run["tree"]: run for run in measured["runs"]}
    assert runs["pinned"]["grad_norm_reads_per_step"] == [1, 1, 1, 1]
    assert {site["function"] for site in runs["pinned"]["grad_norm_sites"]} == {
        "get_global_grad_norm"
    }
    assert runs["patched"]["grad_norm_reads_per_step"] == [0, 0, 0, 0]
    assert runs["patched"]["logged_reads_per_step"] == [0, 0, 0, 1]
    assert [c["verdict"] for c in measured["comparisons"]] == ["identical"]


@pytest.mark.heavy
@pytest.mark.distributed
@pytest.mark.network
def test_the_input_token_count_is_read_every_micro_batch_and_with_the_fix_once_per_step(
    tmp_path: Path,
) -> None:
    """The Trainer on 2 real ranks, 4 micro-batches per step: the same count everywhere users see
    it, and fewer reads that wait."""
    measured = measure_live_case(tmp_path, "trainer-input-tokens", ["accum4"])

    runs = {run["tree"]: run for run in measured["runs"]}
    assert runs["pinned"]["token_reads_per_step"] == [4, 4, 4, 4]
    assert runs["patched"]["token_reads_per_step"] == [1, 1, 1, 1]
    assert [c["verdict"] for c in measured["comparisons"]] == ["identical"]
    # Stalls removed: whether the idle windows shrink beyond their spread is the run's to say.
    (verdict,) = [v["judgement"]["verdict"] for v in measured["verdicts"]]
    assert verdict in ("saves idle time", "moves the wait")


@pytest.mark.heavy
@pytest.mark.distributed
@pytest.mark.network
def test_sft_metrics_are_read_every_micro_batch_and_with_the_fix_once_per_log(
    tmp_path: Path,
) -> None:
    """TRL's SFTTrainer in one process, logging every 2 steps: the same logged metrics."""
    measured = measure_live_case(tmp_path, "trl-sft-metrics", ["padded"], ranks="1")

    runs = {run["tree"]: run for run in measured["runs"]}
    assert runs["pinned"]["reads_per_micro_batch"] == [5, 5, 5, 5]
    assert runs["patched"]["reads_per_micro_batch"] == [0, 0, 0, 0]
    # one read per metric (entropy, accuracy, token count) when it is logged; none at the summary
    assert runs["patched"]["reads_per_log"] == [3, 3, 0]
    assert [c["verdict"] for c in measured["comparisons"]] == ["identical"]


@pytest.mark.heavy
@pytest.mark.distributed
@pytest.mark.network
def test_the_ulysses_length_check_reads_once_per_tensor_and_the_fix_never(tmp_path: Path) -> None:
    """DeepSpeed's Ulysses SP data loader on 2 real SP ranks: the same micro-batches."""
    measured = measure_live_case(tmp_path, "ds-ulysses-seqlen", ["refill"])

    runs = {run["tree"]: run for run in measured["runs"]}
    tensors = runs["pinned"]["tensors"]
    assert set(runs["pinned"]["length_check_reads_per_refill"]) == {tensors}
    assert set(runs["patched"]["length_check_reads_per_refill"]) == {0}
    assert [c["verdict"] for c in measured["comparisons"]] == ["identical"]
