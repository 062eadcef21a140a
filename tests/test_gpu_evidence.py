"""GPU evidence: the GPU script (a case's profiled step, each carried tree in a process of its
own), run dry on a CPU (what a lent GPU runs for real), and `review`'s optional source `gpu`:
cited when fresh, left out when stale, "not measured" when absent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from hostsync.drafting import drafts, review
from hostsync.measure import provenance
from hostsync.profiling.records import GpuResult, GpuTreeFigures
from hostsync.upstream.trees import prepare_tree
from hostsync.workspace import cases, results
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import ROOT, Layout

import made
from conftest import retitled

CASE_SCRIPT = ROOT / "gpu" / "case_on_gpu.py"
GPU_FIGURE = "{{gpu:figures[tree=pinned].dtoh_copies}}"


def gpu_result(layout: Layout, copies: int) -> GpuResult:
    """A GPU result (test input), as `measure` writes it on a GPU."""
    figures = GpuTreeFigures(
        "pinned",
        "5.13.1",
        host_reads=2,
        dtoh_copies=copies,
        dtoh_bytes=2,
        cuda_calls={"cudaStreamSynchronize": 2},
        sync_warnings=2,
    )
    return GpuResult(
        made.stamp(layout),
        device="a test GPU",
        torch="2.11.0",
        dry_run=False,
        warmup_steps=3,
        steps=10,
        trees={"pinned": made.info("5.13.1")},
        figures=(figures,),
    )


def documents(layout: Layout) -> dict:
    case = cases.load(layout.root, layout.case)
    sources = review.without_stale_made_elsewhere(layout, review.latest_sources(layout, case))
    return review.documents(layout, case, sources)


def with_required_results(layout: Layout) -> Layout:
    """The results review always needs (test inputs), so that only the GPU source varies."""
    results.write(layout.profiles, made.repro(layout, (made.row("pinned", 2, 3),)), layout.unsaved)
    results.write(layout.profiles, made.test_patch(layout), layout.unsaved)
    capture = made.capture("pinned", 3)
    results.write(layout.profiles, made.profile(layout, capture), layout.unsaved)
    return layout


def test_gpu_evidence_is_cited_when_fresh_and_not_measured_when_absent_or_stale(
    workspace: Layout,
) -> None:
    layout = with_required_results(workspace)
    assert review.fill(GPU_FIGURE, documents(layout)) == drafts.NOT_MEASURED

    results.write(layout.profiles, gpu_result(layout, copies=2), layout.unsaved)
    assert review.fill(GPU_FIGURE, documents(layout)) == "2"

    layout.case_file.write_text(retitled(layout.case_file))
    assert review.fill(GPU_FIGURE, documents(layout)) == drafts.NOT_MEASURED


def test_a_broken_gpu_result_names_the_script_that_remakes_it_not_a_session(
    workspace: Layout,
) -> None:
    path = results.write(workspace.profiles, gpu_result(workspace, copies=2), workspace.unsaved)
    document = json.loads(path.read_text())
    path.write_text(json.dumps(document | {"steps": "ten"}))

    complaint = r"steps: expected an integer.*rerun `measure` of the `gpu/` script"
    with pytest.raises(WorkspaceError, match=complaint) as error:
        results.read(path, GpuResult)
    assert "nox -s" not in str(error.value)


@pytest.mark.heavy
@pytest.mark.distributed
def test_the_loss_case_without_deepspeed_runs_dry_on_a_cpu_pinned_reading_twice_fixed_never(
    workspace: Layout, tmp_path: Path
) -> None:
    """`pack` then `measure --script mesh_profile.py --device cpu`: what a GPU machine without
    DeepSpeed runs, without the GPU's figures (None: a CPU has no copies to count)."""
    env = os.environ | {"HOSTSYNC_ROOT": str(workspace.root)}

    def script(*argv: str) -> str:
        # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
        done = subprocess.run(
            [sys.executable, str(CASE_SCRIPT), *argv, "--case", "sp-loss"],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    script("pack", "--trees", "pinned,fixed")
    assert sorted(p.name for p in (workspace.root / "gpu" / "carry" / "sp-loss").iterdir()) == [
        "5.14.0.tar.gz",
        "pinned.tar.gz",
        "trees.json",
    ]
    script(
        "measure",
        *("--script", "mesh_profile.py", "--device", "cpu", "--warmup", "1", "--steps", "2"),
        *("--out-dir", str(tmp_path)),
    )

    (path,) = tmp_path.glob("gpu-*.json")
    result = results.read(path, GpuResult)
    figures = {tree.tree: tree for tree in result.figures}
    assert (figures["pinned"].host_reads, figures["5.14.0"].host_reads) == (2, 0)
    assert figures["pinned"].dtoh_copies is None and figures["pinned"].sync_warnings is None
    assert result.dry_run and result.stamp.case == "sp-loss"
    assert provenance.stale_reasons(workspace, result) == []


@pytest.mark.heavy
@pytest.mark.distributed
@pytest.mark.network
def test_a_cases_profiled_step_runs_dry_on_a_cpu_each_tree_with_its_own_reads(
    workspace: Layout, tmp_path: Path
) -> None:
    """`case_on_gpu.py` on the Ulysses loader's card `[profile]`, one rank: the pinned refill
    reads the gathered length and each of its 3 tensors' length check, the patched one only the
    length; a dry run has no GPU figures. Heavy: each tree builds DeepSpeed's shared-memory
    communication op on first use."""
    layout = workspace.for_case("ds-ulysses-seqlen")
    env = os.environ | {"HOSTSYNC_ROOT": str(layout.root), "OMP_NUM_THREADS": "1"}

    def script(python: str, *argv: str) -> None:
        # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
        done = subprocess.run(
            [python, str(CASE_SCRIPT), *argv, "--case", layout.case],
            env=env,
            capture_output=True,
            text=True,
            timeout=900,
        )
        assert done.returncode == 0, done.stderr

    script(sys.executable, "pack")
    tree_python = prepare_tree(
        made.case_of(layout), "pinned"
    ).python  # deepspeed's own dependencies
    script(
        tree_python,
        "measure",
        "--device",
        "cpu",
        "--warmup",
        "1",
        "--steps",
        "2",
        "--out-dir",
        str(tmp_path),
    )

    (path,) = tmp_path.glob("gpu-*.json")
    result = results.read(path, GpuResult)
    figures = {tree.tree: tree for tree in result.figures}
    assert (figures["pinned"].host_reads, figures["patched"].host_reads) == (4, 1)
    pinned = figures["pinned"]
    assert (pinned.step_ms, pinned.gpu_idle_ms, pinned.dtoh_copies, pinned.sync_warnings) == (
        None,
        None,
        None,
        None,
    )
    assert result.dry_run and result.stamp.case == "ds-ulysses-seqlen"
    assert provenance.stale_reasons(layout, result) == []
