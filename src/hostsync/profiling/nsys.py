"""Nsight Systems: recording the profiled steps, and its `nsys stats` tables as per-step figures.

`nsys profile` wraps each node's launcher and records the CUDA API, the GPU's copies and kernels,
NVTX and the OS runtime between the push and pop of `protocol.PROFILED_RANGE`
(`--capture-range=nvtx`: the profile scripts open it around the profiled steps; it works on a CPU,
where cudaProfilerStart never comes). `--cpuctxsw=none` and `--sample=none`: the default
context-switch tracing hangs nsys's agent on some machines, and neither shows a sync.

`nsys stats` then writes three trace tables: the CUDA API calls, the GPU's work and the NVTX
push/pop ranges, under the names the installed nsys knows them by (later versions renamed 2022's:
`cudaapitrace` became `cuda_api_trace`). Their rows become the events `traces` reads from a
PyTorch trace, so the same code counts, inside each `MEASURED_RANGE` on its own thread, the
synchronising CUDA calls and the device-to-host copies those calls launched. That works alike in
both generations, for every step of every rank, without `--filter-nvtx` (2022.4 refuses it).

On a CPU nsys records the ranges and no CUDA at all: its CUDA tables are empty files, and every
CUDA count is 0. nsys's agent runs in a session of its own, outliving a killed launcher: it is
ended by its session name (`end_agents`).
"""

from __future__ import annotations

import csv
import os
import re
import secrets
import shutil
import signal
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hostsync.launch.launchers import NODE_FIELD, RUN_DIR_FIELD
from hostsync.profiling.records import NsysFigures
from hostsync.profiling.traces import TraceEvent, analyse_events, combine_ranks
from hostsync.rank.protocol import MEASURED_RANGE, PROFILED_RANGE
from hostsync.workspace.errors import WorkspaceError, last_line

# Each node's report, in the folder its agent runs in.
REPORT = "capture"
# nsys only starts a capture range on a registered NVTX string unless told otherwise; torch and
# libnvToolsExt push plain ones.
ENV = {"NSYS_NVTX_PROFILER_REGISTER_ONLY": "0"}
_STATS_TIMEOUT_S = 600


class NsysFailed(WorkspaceError):
    """nsys ran but made no usable report (e.g. a copy that records .qdstrm but cannot export)."""


@dataclass(frozen=True)
class Tables:
    """The `nsys stats` trace reports read, by the names one nsys generation gives them."""

    cuda_api: str
    gpu: str
    nvtx: str

    @property
    def names(self) -> tuple[str, ...]:
        return (self.cuda_api, self.gpu, self.nvtx)


NAMES_2022 = Tables("cudaapitrace", "gputrace", "nvtxpptrace")
NAMES_NEWER = Tables("cuda_api_trace", "cuda_gpu_trace", "nvtx_pushpop_trace")


def version() -> str:
    """The installed nsys's version, e.g. 2022.4.2.1."""
    done = subprocess.run(["nsys", "--version"], capture_output=True, text=True, timeout=60)
    found = re.search(r"\d{4}\.\d+(?:\.\d+)*", done.stdout)
    if done.returncode != 0 or not found:
        raise NsysFailed(f"`nsys --version` says {last_line(done.stdout + done.stderr)!r}")
    return found[0]


def tables() -> Tables:
    """The report names this nsys knows: the newer generation's, or the older one's."""
    done = subprocess.run(
        ["nsys", "stats", "--help-reports"], capture_output=True, text=True, timeout=60
    )
    for generation in (NAMES_NEWER, NAMES_2022):
        if all(re.search(rf"^\s*{name}\b", done.stdout, re.MULTILINE) for name in generation.names):
            return generation
    raise NsysFailed(f"nsys {version()} knows neither {NAMES_NEWER.names} nor {NAMES_2022.names}")


def new_session() -> str:
    """A session name of this capture's own: what its agents are found by afterwards."""
    return f"hostsync-{secrets.token_hex(4)}"


def profile_command(session: str) -> tuple[str, ...]:
    """`nsys profile` around one node's launcher, its report in the node's own folder."""
    return (
        "nsys",
        "profile",
        "--trace=cuda,nvtx,osrt",
        "--sample=none",
        "--cpuctxsw=none",
        "--capture-range=nvtx",
        f"--nvtx-capture={PROFILED_RANGE}",
        "--capture-range-end=stop",
        f"--session-new={session}-node{NODE_FIELD}",
        "--force-overwrite=true",
        "-o",
        f"{RUN_DIR_FIELD}/{REPORT}-node{NODE_FIELD}",
    )


def end_agents(session: str) -> list[int]:
    """Kill what is left of the session's nsys agents (each in a session of its own, so killing
    the launcher's process group misses it); their process ids."""
    killed = []
    for entry in Path("/proc").iterdir():
        try:
            words = (entry / "cmdline").read_bytes().decode(errors="replace").split("\0")
        except OSError:
            continue
        if "--start-agent" in words and any(
            w.startswith(f"--session-name={session}-") for w in words
        ):
            try:
                os.kill(int(entry.name), signal.SIGKILL)
                killed.append(int(entry.name))
            except ProcessLookupError:
                pass
    return killed


def reports_in(folder: Path) -> list[Path]:
    """Every node's report of a world, once the nodes pooled their files."""
    return sorted(folder.glob(f"{REPORT}-node*.nsys-rep"))


def stats_prefix(report: Path) -> Path:
    """Where a report's tables go: `<prefix>_<table>.csv` beside it."""
    return report.with_name(f"stats-{report.stem}")


def stats_command(report: Path, names: Tables) -> list[str]:
    reports = [word for name in names.names for word in ("--report", name)]
    return [
        "nsys",
        "stats",
        *reports,
        "--format",
        "csv",
        "--force-export=true",
        "--output",
        str(stats_prefix(report)),
        str(report),
    ]


def run_stats(report: Path, names: Tables) -> Path:
    """`nsys stats` on one report; the prefix of its tables."""
    if shutil.which("nsys") is None:
        raise NsysFailed("no nsys on the PATH to read the report")
    done = subprocess.run(
        stats_command(report, names), capture_output=True, text=True, timeout=_STATS_TIMEOUT_S
    )
    if done.returncode != 0:
        raise NsysFailed(f"`nsys stats` failed on {report.name} ({last_line(done.stderr)})")
    return stats_prefix(report)


# --- the tables as events ------------------------------------------------------------------------


def table(prefix: Path, name: str) -> list[dict[str, str]]:
    """One table's rows; an empty file is a table nsys skipped for lack of data (no CUDA)."""
    path = prefix.with_name(f"{prefix.name}_{name}.csv")
    if not path.exists():
        raise NsysFailed(f"nsys stats wrote no {path.name}")
    with path.open(newline="") as rows:
        return list(csv.DictReader(rows))


def _int(row: dict[str, str], *names: str) -> int:
    """A number of the first column present: the generations spell some columns differently."""
    for name in names:
        if row.get(name) not in (None, ""):
            return int(float(row[name]))
    return 0


def _bytes(row: dict[str, str]) -> int:
    """A copy's size, whatever unit the column header gives (`Bytes (B)`, `Bytes (MB)`)."""
    units = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "KiB": 2**10, "MiB": 2**20}
    for column, value in row.items():
        found = re.fullmatch(r"Bytes \((\w+)\)", column or "")
        if found and value:
            return round(float(value) * units.get(found[1], 1))
    return 0


def gpu_category(name: str) -> tuple[str, str]:
    """A GPU row as the PyTorch trace names it: category, and `Memcpy DtoH` for every spelling of
    a device-to-host copy (`[CUDA memcpy DtoH]`, `[CUDA memcpy Device-to-Host]`)."""
    if "memcpy" in name:
        return "gpu_memcpy", "Memcpy DtoH" if re.search(r"DtoH|Device-to-Host", name) else name
    return ("gpu_memset", name) if "memset" in name else ("kernel", name)


def events(prefix: Path, names: Tables) -> list[TraceEvent]:
    """One report's NVTX ranges, CUDA calls and GPU work as PyTorch-trace events (microseconds);
    pid and tid are nsys's, the GPU's work carries the pid where the table gives one."""
    found = []
    for row in table(prefix, names.nvtx):
        start, end = _int(row, "Start (ns)"), _int(row, "End (ns)")
        found.append(
            TraceEvent(
                row["Name"],
                "user_annotation",
                _int(row, "PID", "Pid"),
                _int(row, "TID", "Tid"),
                start / 1000,
                (end - start) / 1000,
            )
        )
    for row in table(prefix, names.cuda_api):
        found.append(
            TraceEvent(
                row["Name"],
                "cuda_runtime",
                _int(row, "Pid", "PID"),
                _int(row, "Tid", "TID"),
                _int(row, "Start (ns)") / 1000,
                _int(row, "Duration (ns)") / 1000,
                _int(row, "CorrID", "CorrId"),
            )
        )
    for row in table(prefix, names.gpu):
        category, name = gpu_category(row["Name"])
        found.append(
            TraceEvent(
                name,
                category,
                _int(row, "Pid", "PID"),
                0,
                _int(row, "Start (ns)") / 1000,
                _int(row, "Duration (ns)") / 1000,
                _int(row, "CorrId", "CorrID"),
                _bytes(row),
            )
        )
    return found


def figures(prefixes: Sequence[Path], names: Tables) -> NsysFigures:
    """Per measured step: the synchronising CUDA calls and device-to-host copies, the largest
    over ranks of each rank's mean (every process of every node's report is a rank)."""
    per_rank = []
    for prefix in prefixes:
        found = events(prefix, names)
        ranges = [e for e in found if e.cat == "user_annotation"]
        for pid in sorted({e.pid for e in ranges if e.name == MEASURED_RANGE}):
            # A GPU table without pids (2022's): its copies are matched by correlation id.
            own = [
                e
                for e in found
                if e.pid == pid or (e.cat not in ("user_annotation", "cuda_runtime") and not e.pid)
            ]
            per_rank.append(analyse_events(own, cuda=True))
    if not per_rank:
        raise NsysFailed(f"the report holds no {MEASURED_RANGE!r} range: did the steps run?")
    step = combine_ranks(per_rank)
    return NsysFigures(
        cuda_calls=step.cuda_calls or {},
        dtoh_copies=step.dtoh_copies or 0,
        dtoh_bytes=step.dtoh_bytes or 0,
        range_ms=step.range_ms,
        ranges=sum(len(steps) for steps in per_rank),
        steps=max(len(steps) for steps in per_rank),
    )
