"""Runs across nodes: the node layout from options or SLURM, the launch commands, the nodes'
pooled results, and the loss case on two nodes (both agents on this machine) against one."""

from __future__ import annotations

import dataclasses
import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from hostsync.launch import nodes
from hostsync.launch.launchers import LaunchPlan, World, torchrun_command
from hostsync.launch.nodes import NodeLayout, Pool
from hostsync.launch.processes import Run
from hostsync.measure import repro
from hostsync.rank.records import RankReport, RanOn
from hostsync.workspace import cases, locks
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import Device

import made
from conftest import make_workspace

SLURM = {
    "SLURM_NNODES": "2",
    "SLURM_NODEID": "1",
    "SLURM_JOB_NODELIST": "gpu[07-08]",
    "SLURM_JOB_ID": "4242",
    "SLURM_STEP_ID": "3",
}


def layout_of(nnodes=None, node_rank=None, endpoint=None, env=None) -> NodeLayout:
    return nodes.from_options(nnodes, node_rank, endpoint, None, Path("/shared/nodes"), env or {})


# --- the layout ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("nodelist", "hosts"),
    [
        ("gpu01", ["gpu01"]),
        ("gpu[01-03,07],login1", ["gpu01", "gpu02", "gpu03", "gpu07", "login1"]),
        ("rack[8-10]-ib", ["rack8-ib", "rack9-ib", "rack10-ib"]),
        ("a[1,3],b[009-010]", ["a1", "a3", "b009", "b010"]),
    ],
)
def test_slurm_node_lists_expand_like_scontrol(nodelist: str, hosts: list[str]) -> None:
    assert nodes.expand_nodelist(nodelist) == hosts


def test_slurm_gives_the_layout_and_node_0_its_first_host(monkeypatch) -> None:
    monkeypatch.setattr(nodes.shutil, "which", lambda name: None)  # no scontrol here

    found = layout_of(env=SLURM)

    assert (found.count, found.rank, found.endpoint) == (2, 1, "gpu07:29500")
    assert found.run_id == "slurm-4242-3" and found.shares == Path("/shared/nodes")
    assert not found.on_this_machine and not found.writes_results


def test_options_win_over_slurm_and_one_node_is_the_default() -> None:
    assert layout_of(env={}) == nodes.SINGLE
    assert layout_of(nnodes=1, env=SLURM) == nodes.SINGLE
    found = layout_of(node_rank=0, endpoint="head:1234", env=SLURM | {"MASTER_PORT": "9"})
    assert (found.count, found.rank, found.endpoint) == (2, 0, "head:1234")


def test_without_an_endpoint_node_0_starts_every_node_here() -> None:
    found = layout_of(nnodes=2)

    assert found.on_this_machine and found.writes_results and found.shares is None
    assert found.run_id.startswith("local-")


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"nnodes": 2, "node_rank": 1}, "without --rdzv-endpoint"),
        ({"nnodes": 2, "node_rank": 2, "endpoint": "h:1"}, "use 0 to 1"),
        ({"nnodes": 2, "endpoint": "nohost"}, "HOST:PORT"),
        ({"nnodes": 2, "endpoint": "h:port"}, "HOST:PORT"),
    ],
)
def test_a_layout_that_cannot_work_is_refused_in_one_line(options: dict, message: str) -> None:
    with pytest.raises(WorkspaceError, match=message):
        layout_of(**options)


def test_ranks_the_nodes_cannot_share_evenly_are_refused_before_anything_runs() -> None:
    case = cases.load(Layout().root, "trainer-nan-filter")
    settings = repro.ReproSettings(None, None, None, "cpu", 60, False, layout_of(nnodes=2))

    with pytest.raises(WorkspaceError, match=r"train\.py x1 runs 1 rank, which 2 nodes"):
        repro.check_nodes(case, settings, list(case.scenarios), [])
    repro.check_nodes(case, settings, ["sp"], [2])  # the 2-rank launch: one rank a node


# --- the launch commands -------------------------------------------------------------------------


def test_torchrun_joins_the_c10d_rendezvous_with_this_nodes_share() -> None:
    layout = NodeLayout(2, 1, "gpu07:29500", Path("/shared"), "slurm-4242-3")

    command = torchrun_command("python", Path("rank.py"), 4, ["--x"], layout)

    assert command[3:10] == [
        "--nnodes=2",
        "--node-rank=1",
        "--rdzv-backend=c10d",
        "--rdzv-endpoint=gpu07:29500",
        "--rdzv-id=slurm-4242-3",
        "--nproc-per-node=2",
        "--max-restarts=0",
    ]
    on_one_machine = NodeLayout(2, 1, "127.0.0.1:5", None, "local-1", on_this_machine=True)
    assert "--rdzv-conf=is_host=0" in torchrun_command("p", Path("r.py"), 2, [], on_one_machine)
    assert "--standalone" in torchrun_command("p", Path("r.py"), 2, [])


def test_a_wrapped_command_names_each_agents_own_folder(tmp_path: Path) -> None:
    what = LaunchPlan(
        Path("r.py"), (World(2, ()),), Device.CPU, 1, wrap=("nsys", "-o", "{run_dir}/c")
    )
    run = Run(tmp_path / "node-1", tree=None)  # type: ignore[arg-type]

    assert what.wrapped(run, ["torchrun"]) == ["nsys", "-o", f"{tmp_path}/node-1/c", "torchrun"]


# --- pooling the nodes' results ------------------------------------------------------------------


def node_folder(tmp_path: Path, node: int, ranks: list[int]) -> Path:
    folder = tmp_path / f"node-{node}"
    folder.mkdir()
    for rank in ranks:
        (folder / f"rank-{rank}.json").write_text(json.dumps({"rank": rank}))
    (folder / "launcher.log").write_text("not shared")
    return folder


def test_each_node_ends_a_world_holding_every_ranks_result(tmp_path: Path) -> None:
    # Every share is left before the gather: the pools' timeouts are never waited out.
    layout = NodeLayout(2, 0, "h:1", tmp_path / "shares", "job")
    pool = Pool(tmp_path / "shares" / "job" / "0000", "pinned x4", timeout=5)
    nodes.leave_share(pool, 1, node_folder(tmp_path, 1, [0, 3]))
    nodes.leave_share(pool, 0, node_folder(tmp_path, 0, [1, 2]))
    merged = tmp_path / "world"
    merged.mkdir()

    where = nodes.gather(pool, layout, merged)

    assert sorted(path.name for path in merged.iterdir()) == [f"rank-{r}.json" for r in range(4)]
    host = socket.gethostname()
    assert where == [RanOn(1, host), RanOn(0, host), RanOn(0, host), RanOn(1, host)]
    stamped = [RankReport(rank, {}, where[rank]) for rank in range(4)]
    shares = nodes.shares_of("pinned x4", stamped)
    assert [(s.node_rank, s.ranks) for s in shares] == [(0, (1, 2)), (1, (0, 3))]


def test_a_node_that_failed_ran_something_else_or_never_came_is_named(tmp_path: Path) -> None:
    # Every share is left before the gather: the pools' timeouts are never waited out.
    layout = NodeLayout(2, 0, "h:1", tmp_path, "job")
    failed = Pool(tmp_path / "a", "pinned x2", timeout=5)
    nodes.leave_share(failed, 0, node_folder(tmp_path, 0, [0]))
    nodes.leave_share(failed, 1, tmp_path, failure="rank 1 raised ValueError")
    with pytest.raises(WorkspaceError, match=r"node 1 \(.*\) failed: rank 1 raised ValueError"):
        nodes.gather(failed, layout, tmp_path)

    other = Pool(tmp_path / "b", "pinned x2", timeout=5)
    nodes.leave_share(other, 0, tmp_path)
    nodes.leave_share(Pool(other.folder, "patched x2", 5), 1, tmp_path)
    with pytest.raises(WorkspaceError, match="node 1 ran 'patched x2' where this node ran"):
        nodes.gather(other, layout, tmp_path)

    # The node that never comes is what is tested: a short wait for it is the point.
    alone = Pool(tmp_path / "c", "pinned x2", timeout=0.5)
    nodes.leave_share(alone, 0, tmp_path)
    with pytest.raises(WorkspaceError, match="node 1 of 2 left no results"):
        nodes.gather(alone, layout, tmp_path)


def test_a_node_note_of_another_shape_is_refused_naming_the_file_and_the_field(
    tmp_path: Path,
) -> None:
    layout = NodeLayout(1, 0, "h:1", tmp_path, "job")
    pool = Pool(tmp_path / "a", "pinned x2", timeout=5)
    nodes.leave_share(pool, 0, node_folder(tmp_path, 0, [0, 1]))
    note = pool.share(0) / nodes.SHARE_NOTE
    note.write_text(note.read_text().replace('"host": ', '"host": 7, "was": '))

    with pytest.raises(WorkspaceError) as refused:
        nodes.gather(pool, layout, tmp_path / "merged")

    said = str(refused.value)
    assert f"{note}: host: expected a string, got 7" in said and "\n" not in said
    assert "same version of the workspace on every node" in said


def test_node_0_prepares_first_and_the_others_wait_for_it(tmp_path: Path) -> None:
    """On a shared filesystem two nodes preparing the same trees at once would collide."""
    node_0 = NodeLayout(2, 0, "h:1", tmp_path, "job")
    node_1 = dataclasses.replace(node_0, rank=1, shares=tmp_path)
    with pytest.raises(WorkspaceError, match="node 0 did not finish trees within 0 s"):
        nodes.node_0_first(node_1, "trees", 0.3, lambda: "prepared")

    assert nodes.node_0_first(node_0, "trees", 1, lambda: "prepared by 0") == "prepared by 0"
    assert nodes.node_0_first(node_1, "trees", 1, lambda: "found by 1") == "found by 1"


LOCK = """
import sys
from pathlib import Path
from hostsync.workspace import locks
from hostsync.workspace.layout import Layout
with locks.case(Layout(Path(sys.argv[1]), "sp-loss"), node=int(sys.argv[2])):
    pass
"""


def test_each_nodes_command_holds_a_lock_of_its_own(workspace: Layout) -> None:
    """Node 1's command on a shared workspace beside node 0's; a second node 0 is refused."""

    def lock_elsewhere(node: int) -> subprocess.CompletedProcess[str]:
        # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
        return subprocess.run(
            [sys.executable, "-c", LOCK, str(workspace.root), str(node)],
            capture_output=True,
            text=True,
            timeout=60,
        )

    with locks.case(workspace):
        assert lock_elsewhere(1).returncode == 0
        assert "case sp-loss is in use by" in lock_elsewhere(0).stderr


# --- the loss case on two nodes ------------------------------------------------------------------

SAME_ROWS = ("host_syncs", "sync_sites", "forward_syncs", "loss", "loss_abs_diff", "grads_ok")


@pytest.mark.heavy
@pytest.mark.distributed
def test_two_nodes_give_the_loss_case_the_rows_of_one(tmp_path: Path) -> None:
    """One rank a node, both agents started here on the c10d rendezvous: the rows one node gives."""
    layout = make_workspace(tmp_path / "workspace")

    def measured(node_layout: NodeLayout) -> dict:
        settings = repro.ReproSettings(
            ("pinned",), "all_tokens", "2", "cpu", 900, False, node_layout
        )
        return repro.repro_case(made.case_of(layout), settings).document()

    one, two = measured(nodes.SINGLE), measured(layout_of(nnodes=2))

    (row_one,), (row_two,) = one["runs"], two["runs"]
    assert row_one["host_syncs"] == 3, "the pinned aggregation reads sp_size + 1 times"
    assert {key: row_two[key] for key in SAME_ROWS} == {key: row_one[key] for key in SAME_ROWS}
    assert "nodes" not in one
    assert [(n["node_rank"], n["ranks"]) for n in two["nodes"]] in (
        [(0, [0]), (1, [1])],
        [(0, [1]), (1, [0])],
    )
