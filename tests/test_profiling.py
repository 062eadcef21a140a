"""Profiles: a real 2-rank capture on the pinned tree and on the fixed release, then the trace
analysis, the combining of ranks and the summary on small hand-made traces (test inputs)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from hostsync import cases, results
from hostsync.errors import WorkspaceError
from hostsync.layout import ROOT, Layout
from hostsync.profiling import capture as capturing
from hostsync.profiling import report, traces
from hostsync.protocol import EXCLUDED_RANGE, MEASURED_RANGE, SYNC_OP
from hostsync.records import Capture, NsysFigures, ProfileResult
from hostsync.upstream.trees import prepare_tree

import made

SYNC = SYNC_OP

# --- the real capture ----------------------------------------------------------------------------


def capture(layout: Layout, tree_name: str, tmp_path: Path) -> dict:
    tree = prepare_tree(layout, tree_name)
    settings = capturing.ProfileSettings(
        case=cases.load(layout.root, layout.case), trees=(tree_name,), scenario="all_tokens",
        warmup=1, steps=2, device="cpu", profiler="torch", timeout=600.0,
    )  # fmt: skip
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
    assert before["artifacts"] == ["pinned-gloo-ws2-rank0.trace.json.gz",
                                   "pinned-gloo-ws2-rank1.trace.json.gz"]  # fmt: skip
    trace = traces.load_trace(tmp_path / "artifacts" / before["artifacts"][0])
    assert trace["distributedInfo"]["world_size"] == 2
    assert " repro/sp-loss/sp_profile.py " in before["command"]
    assert str(ROOT) not in before["command"]  # it goes into result files


# --- hand-made traces ----------------------------------------------------------------------------


def op(name: str, ts: float, dur: float = 1.0, cat: str = "cpu_op", **args: object) -> dict:
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur,
            "args": args}  # fmt: skip


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

    assert step["range_ms"] == 10.0
    assert step["ops"] == {SYNC: 4, "aten::item": 4, "aten::is_nonzero": 4}
    assert step["ops_in_forward"] == {SYNC: 1, "aten::item": 1, "aten::is_nonzero": 1}
    assert step["timeline"]["sync_ms"] == [0.101, 9.001, 9.051, 9.101]
    assert step["timeline"]["forward_ms"] == [[0.01, 8.01]]
    assert step["dtoh_copies"] is None and step["timeline"]["gpu_busy_ms"] is None


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

    assert step["cuda_calls"] == {"cudaStreamSynchronize": 1, "cudaMemcpyAsync": 1}
    assert (step["dtoh_copies"], step["dtoh_bytes"]) == (1, 8)
    # Busy: 1.0-6.0 ms, 9.4-9.402 ms, 9.9-10.0 ms of the 10 ms range.
    assert step["gpu_idle_ms"] == pytest.approx(10 - 5 - 0.002 - 0.1)
    assert step["timeline"]["gpu_busy_ms"] == [[1.0, 6.0], [9.4, 9.402], [9.9, 10.0]]
    assert step["timeline"]["dtoh_ms"] == [9.4]


def test_ranks_combine_to_the_slowest_rank_count_and_the_median_time() -> None:
    rank0 = traces.analyse_trace(cpu_trace(0, 3)) + traces.analyse_trace(cpu_trace(0, 3))
    rank1 = traces.analyse_trace(cpu_trace(0, 3)) + traces.analyse_trace(cpu_trace(0, 5))

    combined = traces.combine_ranks([rank0, rank1])

    assert combined.ops[SYNC] == 5  # rank 1: (4 + 6) / 2
    assert combined.ops_in_forward[SYNC] == 1
    assert combined.range_ms == 10.0
    assert combined.cuda_calls is None and combined.gpu_idle_ms is None
    assert combined.timeline.range_ms == 10.0


def test_nsys_stats_tables_become_per_step_figures(tmp_path: Path) -> None:
    (tmp_path / "stats_cuda_api_sum.csv").write_text(
        "Time (%),Total Time (ns),Num Calls,Avg (ns),Med (ns),Min (ns),Max (ns),StdDev (ns),Name\n"
        "60.0,6000,6,1000,1000,900,1100,10,cudaStreamSynchronize\n"
        "40.0,4000,6,666,666,600,700,5,cudaMemcpyAsync\n"
    )
    (tmp_path / "stats_cuda_gpu_mem_size_sum.csv").write_text(
        "Total (MB),Count,Avg (MB),Med (MB),Min (MB),Max (MB),StdDev (MB),Operation\n"
        "0.000048,6,0.000008,0.000008,0.000008,0.000008,0.0,[CUDA memcpy Device-to-Host]\n"
        "1.0,2,0.5,0.5,0.5,0.5,0.0,[CUDA memcpy Host-to-Device]\n"
    )

    figures = traces.nsys_figures(tmp_path, "stats", steps=2)

    assert figures.cuda_calls == {"cudaStreamSynchronize": 3, "cudaMemcpyAsync": 3}
    assert figures.dtoh_copies == 3
    assert figures.dtoh_mb_total == pytest.approx(0.000048)


def test_missing_nsys_tables_say_which() -> None:
    with pytest.raises(traces.NsysFailed, match=r"stats_cuda_api_sum\.csv"):
        traces.nsys_figures(Path("/nonexistent"), "stats", steps=1)


def test_nsys_is_refused_on_cpu_before_anything_runs() -> None:
    with pytest.raises(WorkspaceError, match="--profiler nsys records CUDA"):
        capturing.choose_profiler("nsys", "cpu")
    assert capturing.choose_profiler("auto", "cpu") == "torch"


# --- the summary ---------------------------------------------------------------------------------


def profile(layout: Layout, *trees: tuple[str, int]) -> ProfileResult:
    """A profile result (test input) with one CPU capture per (tree, aggregation reads)."""
    captures = []
    for tree, reads in trees:
        step = traces.combine_ranks([traces.analyse_trace(cpu_trace(0, reads))])
        captures.append(dataclasses.replace(made.capture(tree, 0), per_step=step,
                                            command=f"python sp_profile.py  # {tree}"))  # fmt: skip
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
        "pinned-gloo-ws2-rank0.trace.json.gz", "summary.md", "timeline-gloo-ws2.png",
    ]  # fmt: skip
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
    nsys = NsysFigures({"cudaStreamSynchronize": 3, "cudaMemcpyAsync": 3}, 3, 2.4e-05, 9.5)
    by_nsys = dataclasses.replace(on_gpu, tree="patched", profiler="nsys", nsys=nsys,
                                  per_step=None)  # fmt: skip
    gpu = made.profile(workspace, on_gpu, by_nsys)

    headers, rows = report.summary_table(gpu)

    assert all(len(row) == len(headers) for row in rows)
    assert dict(zip(headers, rows[0], strict=True))["DtoH bytes"] == 8
    assert dict(zip(headers, rows[1], strict=True))["range ms (median)"] == 9.5
    report.plot_timelines(gpu, tmp_path / "timeline.png")  # the GPU lane: drawn, not checked
    assert (tmp_path / "timeline.png").stat().st_size > 0
