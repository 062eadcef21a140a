"""The reproducer for real: torchrun, gloo, DeepSpeed Ulysses groups, the trees' own function.

One 2-rank run per tree (pinned 5.13.1 and upstream's fixed 5.14.0) with every scenario, shared
by the tests below; then what the launcher does when a rank raises or hangs.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import textwrap
from pathlib import Path

import pytest
import torch

from hostsync import environment, repro, results, upstream
from hostsync.errors import WorkspaceError
from hostsync.launch import Run, RunFailed, launch, torchrun_command
from hostsync.layout import ROOT, Layout

from bug_sites import DEEPSPEED_PY, IF_PER_RANK, MAX_OF_TOTAL, source_line

SP_SIZE = 2
FIXED = "5.14.0"
# What later sessions read from each entry of a repro result's `runs`.
RUN_KEYS = {
    "tree", "sp_size", "world_size", "backend", "scenario", "host_syncs", "host_syncs_per_rank",
    "sync_sites", "forward_syncs", "loss", "reference_loss", "loss_abs_diff",
    "loss_is_graph_tensor", "backward_error", "grads_ok", "grad_max_abs_diff",
}  # fmt: skip


@pytest.fixture(scope="module")
def trees() -> dict[str, upstream.Tree]:
    return {name: upstream.tree(Layout(), name) for name in ("pinned", FIXED)}


@pytest.fixture(scope="module")
def measured(trees: dict[str, upstream.Tree]) -> dict:
    return repro.measure(
        Layout(), list(trees.values()), [SP_SIZE], list(repro.SCENARIOS), device="cpu", timeout=600
    )


def runs_of(measured: dict, tree: str) -> dict[str, dict]:
    return {run["scenario"]: run for run in measured["runs"] if run["tree"] == tree}


@pytest.mark.distributed
def test_pinned_tree_syncs_at_the_if_per_rank_and_once_at_max(
    measured: dict, trees: dict[str, upstream.Tree]
) -> None:
    if_line = source_line(trees["pinned"], IF_PER_RANK)
    max_line = source_line(trees["pinned"], MAX_OF_TOTAL)
    runs = runs_of(measured, "pinned")

    assert set(runs) == set(repro.SCENARIOS)
    for run in runs.values():
        assert run["host_syncs_per_rank"] == [SP_SIZE + 1] * SP_SIZE, run["scenario"]
        sites = [(site["file"], site["line"], site["count"]) for site in run["sync_sites"]]
        assert sites == [(DEEPSPEED_PY, if_line, SP_SIZE), (DEEPSPEED_PY, max_line, 1)]


@pytest.mark.distributed
def test_fixed_release_has_no_sync_in_the_aggregation(measured: dict) -> None:
    for run in runs_of(measured, FIXED).values():
        assert run["host_syncs_per_rank"] == [0] * SP_SIZE, run["scenario"]
        assert run["sync_sites"] == []


@pytest.mark.distributed
def test_forward_syncs_are_reported_apart_on_both_trees(measured: dict) -> None:
    """The model forward has syncs of its own; they must not leak into the aggregation count."""
    for run in measured["runs"]:
        assert run["forward_syncs"], run["scenario"]
        assert {site["reason"] for site in run["forward_syncs"]} == {"model forward"}
        assert all(site["file"] != DEEPSPEED_PY for site in run["forward_syncs"])


@pytest.mark.distributed
def test_losses_and_gradients_match_one_process_wherever_a_loss_is_defined(
    measured: dict,
) -> None:
    defined = [run for run in measured["runs"] if run["reference_loss"] is not None]

    assert {run["scenario"] for run in defined} == set(repro.SCENARIOS) - {"all_masked"}
    for run in defined:
        where = (run["tree"], run["scenario"])
        assert run["loss_abs_diff"] <= repro.LOSS_TOLERANCE, where
        assert run["loss_is_graph_tensor"], where
        assert run["grads_ok"], where


@pytest.mark.distributed
def test_all_masked_pinned_returns_a_float_that_backward_refuses(measured: dict) -> None:
    pinned = runs_of(measured, "pinned")["all_masked"]
    fixed = runs_of(measured, FIXED)["all_masked"]

    assert (pinned["loss"], pinned["loss_type"]) == (0.0, "float")
    assert not pinned["loss_is_graph_tensor"]
    assert pinned["backward_error"].startswith("every rank: AssertionError")
    assert (fixed["loss"], fixed["loss_type"]) == (0.0, "Tensor")
    assert fixed["loss_is_graph_tensor"]
    assert fixed["backward_error"] is None
    assert fixed["grads_ok"]


@pytest.mark.distributed
def test_result_file_holds_the_contract(measured: dict, tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    shutil.copy(ROOT / "pin.toml", layout.pin_file)

    document = json.loads(results.write(layout, "repro", measured).read_text())

    assert document["kind"] == "repro"
    assert document["environment"]["world_sizes"] == [SP_SIZE]
    assert set(document["trees"]) == {"pinned", FIXED}
    assert document["trees"]["pinned"]["version"] == "5.13.1"
    for run in document["runs"]:
        assert set(run) >= RUN_KEYS
        assert (run["world_size"], run["backend"]) == (SP_SIZE, "gloo")
        for site in run["sync_sites"] + run["forward_syncs"]:
            assert {"file", "line", "function", "code", "count"} <= set(site)


# --- bad input -----------------------------------------------------------------------------------


@pytest.mark.parametrize("sizes", ["1", "3", "2,x", ""])
def test_sp_sizes_that_cannot_split_the_heads_are_refused(sizes: str) -> None:
    with pytest.raises(WorkspaceError, match="--sp"):
        repro.parse_sp_sizes(sizes)


def test_unknown_scenario_is_refused_with_the_choices() -> None:
    with pytest.raises(WorkspaceError, match="all_tokens"):
        repro.parse_scenarios("all_tokens,everything")


@pytest.mark.skipif(torch.cuda.device_count() >= 2, reason="this machine has a GPU per rank")
def test_nccl_without_a_gpu_per_rank_is_refused() -> None:
    with pytest.raises(WorkspaceError, match="one per rank"):
        environment.resolve_device("cuda", 2)


def test_patched_alone_with_an_empty_series_is_refused(tmp_path: Path) -> None:
    layout = Layout(tmp_path)
    layout.patches.mkdir()

    with pytest.raises(WorkspaceError, match="patches/series is empty"):
        upstream.trees(layout, [upstream.PATCHED])


# --- a rank that raises, a rank that hangs -------------------------------------------------------

RAISES_ON_RANK_1 = """
    import torch.distributed as dist

    from hostsync.launch import rank_entry


    @rank_entry
    def main():
        dist.init_process_group("gloo")
        if dist.get_rank() == 1:
            raise ValueError("rank 1 gives up")
        dist.barrier()  # waits for rank 1, which never comes: the launcher must end it
        return {}


    main()
"""

HANGS_ON_RANK_1 = """
    import os
    import time
    from pathlib import Path

    import torch.distributed as dist

    dist.init_process_group("gloo")
    Path(os.environ["HOSTSYNC_RUN_DIR"], f"started-{dist.get_rank()}").touch()
    if dist.get_rank() == 1:
        time.sleep(3600)
    dist.barrier()
"""


def run_script(tmp_path: Path, tree: upstream.Tree, source: str, timeout: float) -> Path:
    """Launch a throwaway 2-rank script; return it so the test can look for survivors."""
    script = tmp_path / "worker.py"
    script.write_text(textwrap.dedent(source))
    run = Run(tmp_path / "run", tree.src, Layout())
    launch(run, torchrun_command(script, 2, []), nprocs=2, timeout=timeout)
    return script


def survivors(script: Path) -> list[str]:
    """Live processes (zombies excluded: they hold no resources) still running `script`."""
    listing = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    rows = [line.strip().partition(" ") for line in listing.splitlines()]
    return [args for stat, _, args in rows if str(script) in args and not stat.startswith("Z")]


@pytest.mark.distributed
def test_rank_that_raises_is_named_and_nothing_survives(
    tmp_path: Path, trees: dict[str, upstream.Tree]
) -> None:
    with pytest.raises(RunFailed, match=r"rank 1 raised ValueError: rank 1 gives up"):
        run_script(tmp_path, trees["pinned"], RAISES_ON_RANK_1, timeout=300)

    assert survivors(tmp_path / "worker.py") == []


@pytest.mark.distributed
def test_hung_rank_is_killed_at_the_timeout_and_nothing_survives(
    tmp_path: Path, trees: dict[str, upstream.Tree]
) -> None:
    with pytest.raises(RunFailed, match=r"run hung: no exit after 30 s"):
        run_script(tmp_path, trees["pinned"], HANGS_ON_RANK_1, timeout=30)

    started = sorted(marker.name for marker in (tmp_path / "run").glob("started-*"))
    assert started == ["started-0", "started-1"], "the run timed out before both ranks ran"
    assert survivors(tmp_path / "worker.py") == []
