"""Profiles: a real 2-rank capture on the pinned tree and on the fixed release, then the trace
analysis, the combining of ranks and the summary on small hand-made traces (test inputs)."""

from __future__ import annotations

import ctypes.util
import dataclasses
import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hostsync.commands import profile as profile_command
from hostsync.launch.processes import RunHung, run_group
from hostsync.profiling import capture as capturing
from hostsync.profiling import nsys, report, traces
from hostsync.profiling.records import Capture, NsysFigures, ProfileResult
from hostsync.profiling.run import profile_case
from hostsync.rank.protocol import EXCLUDED_RANGE, MEASURED_RANGE, SYNC_OP
from hostsync.upstream.trees import prepare_tree
from hostsync.workspace import cases, results
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import ROOT, Layout
from hostsync.workspace.records import Device

import made
from conftest import OwnEnvironment

SYNC = SYNC_OP

# --- the real capture ----------------------------------------------------------------------------


def capture(layout: Layout, tree_name: str, tmp_path: Path) -> dict:
    tree = prepare_tree(made.case_of(layout), tree_name)
    # A hang guard, not a measurement: far above what this takes on a loaded 2-core machine.
    settings = capturing.ProfileSettings(
        case=cases.load(layout.root, layout.case),
        trees=(tree_name,),
        scenario="all_tokens",
        warmup=1,
        steps=2,
        device="cpu",
        profiler="torch",
        timeout=600.0,
    )
    artifacts = tmp_path / "artifacts"
    artifacts.mkdir(exist_ok=True)
    captured = capturing.capture(layout, tree, tmp_path / tree_name, artifacts, settings, "torch")
    return captured.to_json()


@pytest.mark.distributed
def test_the_pinned_aggregation_reads_sp_size_plus_one_times_per_step_and_the_fix_none(
    workspace: Layout, tmp_path: Path
) -> None:
    before = capture(workspace, "pinned", tmp_path)
    after = capture(workspace, "fixed", tmp_path)

    for record, aggregation in ((before, 3), (after, 0)):
        step = record["per_step"]
        in_forward = step["ops_in_forward"][SYNC]
        assert step["ops"][SYNC] - in_forward == aggregation, record["tree"]
        assert step["ops"]["aten::is_nonzero"] >= aggregation
        assert step["cuda_calls"] is None and step["gpu_idle_ms"] is None  # a CPU run
        assert len(step["timeline"]["sync_ms"]) == step["ops"][SYNC]
    assert before["artifacts"] == [
        "pinned-gloo-ws2-rank0.trace.json.gz",
        "pinned-gloo-ws2-rank1.trace.json.gz",
    ]
    trace = traces.load_trace(tmp_path / "artifacts" / before["artifacts"][0])
    assert trace["distributedInfo"]["world_size"] == 2
    assert " repro/sp-loss/sp_profile.py " in before["command"]
    assert str(ROOT) not in before["command"]  # it goes into result files


# --- hand-made traces ----------------------------------------------------------------------------


def op(name: str, ts: float, dur: float = 1.0, cat: str = "cpu_op", **args: object) -> dict:
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": 1,
        "tid": 1,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def annotation(name: str, ts: float, dur: float) -> dict:
    return op(name, ts, dur, cat="user_annotation")


def read(ts: float) -> list[dict]:
    """What `if t > 0` leaves in a trace: is_nonzero calling item calling _local_scalar_dense."""
    return [op("aten::is_nonzero", ts, 3), op("aten::item", ts + 0.5, 2), op(SYNC, ts + 1, 1)]


def cpu_trace(start: float, aggregation_reads: int) -> dict:
    """One step: a 10 ms range, a forward with one read, then the aggregation's reads."""
    events = [annotation(MEASURED_RANGE, start, 10_000)]
    events += [annotation(EXCLUDED_RANGE, start + 10, 8_000), *read(start + 100)]
    events += [e for i in range(aggregation_reads) for e in read(start + 9_000 + 50 * i)]
    events += read(start + 20_000)  # after the range (backward): not counted
    return {"deviceProperties": [], "traceEvents": events}


def test_reads_are_counted_inside_the_range_and_split_by_the_forward() -> None:
    (step,) = traces.analyse_trace(cpu_trace(0, aggregation_reads=3))

    assert step.range_ms == 10.0
    assert step.ops == {SYNC: 4, "aten::item": 4, "aten::is_nonzero": 4}
    assert step.ops_in_forward == {SYNC: 1, "aten::item": 1, "aten::is_nonzero": 1}
    assert step.timeline.sync_ms == (0.101, 9.001, 9.051, 9.101)
    assert step.timeline.forward_ms == ((0.01, 8.01),)
    assert step.dtoh_copies is None and step.timeline.gpu_busy_ms is None


def test_a_trace_without_the_range_is_refused() -> None:
    with pytest.raises(WorkspaceError, match=r"no 'hostsync\.measured' range"):
        traces.analyse_trace({"traceEvents": [op(SYNC, 0)]})


def test_on_cuda_only_copies_launched_in_the_range_count_and_idle_time_is_the_gap() -> None:
    trace = cpu_trace(0, aggregation_reads=0)
    trace["deviceProperties"] = [{"id": 0, "name": "a test GPU"}]
    trace["traceEvents"] += [
        op("cudaMemcpyAsync", 9_000, 5, cat="cuda_runtime", correlation=7),
        op("cudaStreamSynchronize", 9_010, 500, cat="cuda_runtime", correlation=8),
        op("Memcpy DtoH (Device -> Pinned)", 9_400, 2, cat="gpu_memcpy", correlation=7, bytes=8),
        op("Memcpy DtoH (Device -> Pinned)", 20_000, 2, cat="gpu_memcpy", correlation=99, bytes=8),
        op("gemm", 1_000, 4_000, cat="kernel", correlation=3),
        op("gemm", 4_500, 1_500, cat="kernel", correlation=4),  # overlaps the one before
        op("tail", 9_900, 500, cat="kernel", correlation=5),  # runs past the range's end
    ]
    (step,) = traces.analyse_trace(trace)

    assert step.cuda_calls == {
        "cudaStreamSynchronize": 1,
        "cudaDeviceSynchronize": 0,
        "cudaMemcpyAsync": 1,
        "cudaMemcpy": 0,
    }
    assert (step.dtoh_copies, step.dtoh_bytes) == (1, 8)
    # Busy: 1.0-6.0 ms, 9.4-9.402 ms, 9.9-10.0 ms of the 10 ms range.
    assert step.gpu_idle_ms == pytest.approx(10 - 5 - 0.002 - 0.1)
    assert step.timeline.gpu_busy_ms == ((1.0, 6.0), (9.4, 9.402), (9.9, 10.0))
    assert step.timeline.dtoh_ms == (9.4,)


def test_ranks_combine_to_the_slowest_rank_count_and_the_median_time() -> None:
    rank0 = traces.analyse_trace(cpu_trace(0, 3)) + traces.analyse_trace(cpu_trace(0, 3))
    rank1 = traces.analyse_trace(cpu_trace(0, 3)) + traces.analyse_trace(cpu_trace(0, 5))

    combined = traces.combine_ranks([rank0, rank1])

    assert combined.ops[SYNC] == 5  # rank 1: (4 + 6) / 2
    assert combined.ops_in_forward[SYNC] == 1
    assert combined.range_ms == 10.0
    assert combined.cuda_calls is None and combined.gpu_idle_ms is None
    assert combined.timeline.range_ms == 10.0


def write_tables(folder: Path, api: str, gpu: str, nvtx: str, names: nsys.Tables) -> Path:
    """`nsys stats` CSV tables (test inputs) under the names `names` gives them."""
    for name, text in zip(names.names, (api, gpu, nvtx), strict=True):
        (folder / f"stats-capture-node0_{name}.csv").write_text(text)
    return folder / "stats-capture-node0"


NVTX_2022 = (
    "Start (ns),End (ns),Duration (ns),DurChild (ns),DurNonChild (ns),Name,PID,TID,Lvl,NumChild,"
    "RangeId,ParentId,RangeStack,NameTree\n"
    f"0,10000000,10000000,0,0,{MEASURED_RANGE},7,7,0,0,1,,:1,x\n"
    f"20000000,30000000,10000000,0,0,{MEASURED_RANGE},7,7,0,0,2,,:2,x\n"
    f"21000000,22000000,1000000,0,0,{EXCLUDED_RANGE},7,7,1,0,3,2,:2:3,x\n"
)
API = (
    "Start (ns),Duration (ns),Name,Result,CorrID,Pid,Tid,T-Pri,Thread Name\n"
    "1000000,500,cudaStreamSynchronize,0,5,7,7,0,python\n"
    "2000000,500,cudaMemcpyAsync,0,6,7,7,0,python\n"
    "25000000,500,cudaStreamSynchronize,0,9,7,7,0,python\n"
    "40000000,500,cudaStreamSynchronize,0,11,7,7,0,python\n"  # after the ranges: not counted
    "25000000,500,cudaDeviceSynchronize,0,12,7,99,0,other\n"  # another thread: not counted
)


def test_nsys_tables_of_2022_become_per_step_counts_inside_the_measured_ranges(
    tmp_path: Path,
) -> None:
    gpu = (
        "Start (ns),Duration (ns),CorrId,GrdX,GrdY,GrdZ,BlkX,BlkY,BlkZ,Reg/Trd,StcSMem (MB),"
        "DymSMem (MB),Bytes (B),Throughput (MBps),SrcMemKd,DstMemKd,Device,Ctx,Strm,Name\n"
        "2001000,100,6,,,,,,,,,,8,,Device,Pageable,GPU (0),1,7,[CUDA memcpy DtoH]\n"
        "2002000,100,4,,,,,,,,,,64,,Pageable,Device,GPU (0),1,7,[CUDA memcpy HtoD]\n"
    )
    prefix = write_tables(tmp_path, API, gpu, NVTX_2022, nsys.NAMES_2022)

    figures = nsys.figures([prefix], nsys.NAMES_2022)

    assert figures.cuda_calls == {
        "cudaStreamSynchronize": 1,
        "cudaDeviceSynchronize": 0,
        "cudaMemcpyAsync": 0.5,
        "cudaMemcpy": 0,
    }
    assert (figures.dtoh_copies, figures.dtoh_bytes) == (0.5, 4)
    assert (figures.ranges, figures.steps, figures.range_ms) == (2, 2, 10.0)


def test_newer_nsys_tables_spell_copies_and_columns_their_way(tmp_path: Path) -> None:
    gpu = (
        "Start (ns),Duration (ns),CorrId,GrdX,GrdY,GrdZ,BlkX,BlkY,BlkZ,Reg/Trd,StcSMem (MB),"
        "DymSMem (MB),Bytes (MB),Throughput (MBps),SrcMemKd,DstMemKd,Device,Ctx,GreenCtx,Strm,"
        "Pid,Name\n"
        "2001000,100,6,,,,,,,,,,0.000008,,Device,Pinned,GPU (0),1,,7,7,"
        "[CUDA memcpy Device-to-Host]\n"
        "2001000,100,6,,,,,,,,,,0.000008,,Device,Pinned,GPU (0),1,,7,8,"
        "[CUDA memcpy Device-to-Host]\n"
    )
    prefix = write_tables(tmp_path, API, gpu, NVTX_2022, nsys.NAMES_NEWER)

    figures = nsys.figures([prefix], nsys.NAMES_NEWER)

    assert (figures.dtoh_copies, figures.dtoh_bytes) == (0.5, 4), "pid 8's copy is not rank 7's"


def test_a_cpu_report_has_the_ranges_and_zero_cuda(tmp_path: Path) -> None:
    """On a CPU nsys skips its CUDA tables: empty files, every CUDA count 0."""
    prefix = write_tables(tmp_path, "", "", NVTX_2022, nsys.NAMES_2022)

    figures = nsys.figures([prefix], nsys.NAMES_2022)

    assert set(figures.cuda_calls.values()) == {0} and figures.dtoh_copies == 0
    assert figures.ranges == 2


def test_a_report_without_its_tables_or_ranges_is_refused_naming_what_is_missing(
    tmp_path: Path,
) -> None:
    with pytest.raises(nsys.NsysFailed, match=r"stats-capture-node0_nvtxpptrace\.csv"):
        nsys.figures([tmp_path / "stats-capture-node0"], nsys.NAMES_2022)
    prefix = write_tables(tmp_path, "", "", "", nsys.NAMES_2022)
    with pytest.raises(nsys.NsysFailed, match=r"no 'hostsync\.measured' range"):
        nsys.figures([prefix], nsys.NAMES_2022)


def test_nsys_needs_libnvtoolsext_on_a_cpu_and_auto_keeps_to_gpus(monkeypatch) -> None:
    monkeypatch.setattr(capturing.shutil, "which", lambda name: "/usr/bin/nsys")
    monkeypatch.setattr(capturing.ctypes.util, "find_library", lambda name: None)
    with pytest.raises(WorkspaceError, match="--profiler nsys on a CPU needs libnvToolsExt"):
        capturing.choose_profiler("nsys", Device.CPU)
    assert capturing.choose_profiler("nsys", Device.CUDA) == "nsys"
    assert capturing.choose_profiler("auto", Device.CPU) == "torch"
    monkeypatch.setattr(capturing.shutil, "which", lambda name: None)
    with pytest.raises(WorkspaceError, match="no nsys on the PATH"):
        capturing.choose_profiler("nsys", Device.CUDA)


# --- Nsight Systems for real (where it is installed) ---------------------------------------------

needs_nsys = pytest.mark.skipif(
    shutil.which("nsys") is None or ctypes.util.find_library("nvToolsExt") is None,
    reason="needs Nsight Systems and libnvToolsExt (docs/nsight.md's optional install)",
)


def agents_of(session: str) -> list[str]:
    listing = subprocess.run(["ps", "-eo", "stat=,args="], capture_output=True, text=True).stdout
    rows = [line.strip().partition(" ") for line in listing.splitlines()]
    named = f"--session-name={session}"
    return [args for stat, _, args in rows if named in args and stat[0] != "Z"]


@needs_nsys
def test_no_nsys_agent_outlives_a_launch_killed_at_its_timeout(tmp_path: Path) -> None:
    """With context-switch tracing (nsys's default) the agent hangs on some machines, in a
    session of its own: killing the launcher's process group misses it, its session name not."""
    session = nsys.new_session()
    wrap = [
        word.replace("{run_dir}", str(tmp_path))
        .replace("{node}", "0")
        .replace("--cpuctxsw=none", "--cpuctxsw=process-tree")
        for word in nsys.profile_command(session)
    ]
    run = OwnEnvironment(tmp_path, tree=None)  # type: ignore[arg-type]

    with pytest.raises(RunHung):
        # The timeout is what ends this run (the hang is the point); 8 s leaves nsys time to start.
        run_group(run, [*wrap, "/bin/sleep", "60"], timeout=8)
    nsys.end_agents(session)

    assert agents_of(session) == []


@pytest.mark.heavy
@pytest.mark.distributed
@needs_nsys
def test_nsys_on_a_cpu_records_the_measured_ranges_and_zero_cuda(workspace: Layout) -> None:
    """`profile --case sp-loss --profiler nsys --device cpu` on the pinned tree."""
    args = profile_command.parser().parse_args(
        [
            "--case",
            "sp-loss",
            "--trees",
            "pinned",
            "--profiler",
            "nsys",
            "--device",
            "cpu",
            "--warmup",
            "1",
            "--steps",
            "2",
        ]
    )

    profile_case(profile_command.settings_for(made.case_of(workspace), args))

    path = results.latest(workspace.profiles, ProfileResult)
    (captured,) = results.read(path, ProfileResult).captures
    assert (captured.profiler, captured.per_step) == ("nsys", None)
    assert captured.nsys.steps == 2 and captured.nsys.ranges >= 3, "the ranks' measured ranges"
    assert set(captured.nsys.cuda_calls.values()) == {0} and captured.nsys.dtoh_copies == 0
    assert captured.artifacts == ("pinned-gloo-ws2-node0.nsys-rep",)
    assert (results.attachments(path) / captured.artifacts[0]).stat().st_size > 0
    assert "Nsight Systems on a CPU" in (results.attachments(path) / "summary.md").read_text()
    assert agents_of("hostsync-") == []


# --- the summary ---------------------------------------------------------------------------------


def profile(layout: Layout, *trees: tuple[str, int]) -> ProfileResult:
    """A profile result (test input) with one CPU capture per (tree, aggregation reads)."""
    captures = []
    for tree, reads in trees:
        step = traces.combine_ranks([traces.analyse_trace(cpu_trace(0, reads))])
        captures.append(
            dataclasses.replace(
                made.capture(tree, 0), per_step=step, command=f"python sp_profile.py  # {tree}"
            )
        )
    return made.profile(layout, *captures)


def test_publishing_writes_the_result_then_its_folder_summary_and_timeline(
    workspace: Layout, tmp_path: Path
) -> None:
    layout = workspace
    staging = tmp_path / "staging"
    (staging / "artifacts").mkdir(parents=True)
    (staging / "artifacts" / "pinned-gloo-ws2-rank0.trace.json.gz").write_bytes(b"trace")

    result = report.publish(layout, profile(layout, ("pinned", 3), ("patched", 0)), staging)

    folder = results.attachments(result)
    assert sorted(p.name for p in folder.iterdir()) == [
        "pinned-gloo-ws2-rank0.trace.json.gz",
        "summary.md",
        "timeline-gloo-ws2.png",
    ]
    summary = (folder / "summary.md").read_text()
    assert f"Source: `{result.name}`" in summary
    # On a CPU, counts only: no times.
    assert "| pinned | 5.13.1 | torch | 4 | 3 | 1 | 4 | 4 |" in summary
    assert "| patched | 5.13.1 | torch | 1 | 0 | 1 | 1 | 1 |" in summary
    assert "Measured on CPU" in summary and " ms" not in summary
    assert (folder / "timeline-gloo-ws2.png").read_bytes().startswith(b"\x89PNG")
    assert json.loads(result.read_text())["captures"][0]["tree"] == "pinned"


def test_a_cuda_capture_and_an_nsys_one_fill_every_column_and_the_timeline(
    workspace: Layout, tmp_path: Path
) -> None:
    trace = cpu_trace(0, aggregation_reads=3)
    trace["deviceProperties"] = [{"id": 0, "name": "a test GPU"}]
    trace["traceEvents"] += [
        op("cudaMemcpyAsync", 9_001, 5, cat="cuda_runtime", correlation=7),
        op("Memcpy DtoH (Device -> Pinned)", 9_400, 2, cat="gpu_memcpy", correlation=7, bytes=8),
        op("gemm", 1_000, 4_000, cat="kernel", correlation=3),
    ]
    step = traces.combine_ranks([traces.analyse_trace(trace)])
    on_gpu: Capture = dataclasses.replace(
        made.capture("pinned", 3), device="cuda:0", backend="nccl", per_step=step
    )
    calls = dict.fromkeys(traces.CUDA_CALLS, 0) | {"cudaStreamSynchronize": 3}
    figures = NsysFigures(calls, dtoh_copies=3, dtoh_bytes=24, range_ms=9.5, ranges=6, steps=3)
    by_nsys = dataclasses.replace(
        on_gpu, tree="patched", profiler="nsys", nsys=figures, per_step=None
    )
    gpu = made.profile(workspace, on_gpu, by_nsys)

    headers, rows = report.summary_table(gpu)

    assert all(len(row) == len(headers) for row in rows)
    assert dict(zip(headers, rows[0], strict=True))["DtoH bytes"] == 8
    assert dict(zip(headers, rows[1], strict=True))["range ms (median)"] == 9.5
    assert dict(zip(headers, rows[1], strict=True))["cudaStreamSynchronize"] == 3
    report.plot_timelines(gpu, tmp_path / "timeline.png")  # the GPU lane: drawn, not checked
    assert (tmp_path / "timeline.png").stat().st_size > 0
