"""A scan's run, from the command's side: the script started as its users start it, the runner
(`runner.py`) in its place on every rank, then each rank's record read back (its last snapshot
where it never finished) and summed up into a `ScanResult`, partial with why when the run did
not end cleanly: a rank raised, died or hung, the script never stepped, or Ctrl-C."""

from __future__ import annotations

import ast
import dataclasses
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hostsync.detector.codec import RecordError, read_file
from hostsync.detector.sites import AllowRule
from hostsync.launch import devices, launchers, processes
from hostsync.launch.launchers import LaunchPlan, World, world_dir
from hostsync.launch.nodes import SINGLE, NodeLayout
from hostsync.launch.processes import RunFailed, RunHung
from hostsync.measure import provenance
from hostsync.measure.records import ScanEnd, ScanRank, ScanResult, ScanStep
from hostsync.rank.records import RankReport
from hostsync.sites.records import HuntRank, HuntRecording
from hostsync.sites.summary import steady_cost, summarize
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.files import sha256
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import Device, Launcher

RUNNER = Path(__file__).with_name("runner.py")
WARMUP = "give 1 or more: the first step runs unwatched, with the script's setup before it"
# What a step function calls, found on the script's syntax tree when no step ran.
STEP_CALLS = ("backward", "step")
MAIN = "__main__"
THREADS = "OMP_NUM_THREADS"
# The folder of profiles/ scans write into.
SCAN = "scan"


@dataclass(frozen=True)
class ScanPlan:
    """What to scan and how: the script and its arguments, the launcher and the user's options
    for it, ranks per node and the nodes, the steps (warm-up, how many to measure, or the
    function each call of which is one), the device, how long the run may take."""

    script: Path
    args: tuple[str, ...] = ()
    launcher: Launcher = Launcher.PYTHON
    launcher_args: tuple[str, ...] = ()
    ranks: int = 1
    nodes: NodeLayout = SINGLE
    warmup: int = 1
    steps: int | None = None
    step_fn: str | None = None
    device: Device = Device.CPU
    timeout: float = processes.DEFAULT_TIMEOUT_S
    # OMP_NUM_THREADS for every rank; None: as the user set it, or unset.
    threads: int | None = None
    # Off: the steps timed only (what the scan adds to them, `bench --scan`).
    detect: bool = True

    @property
    def world_size(self) -> int:
        return self.ranks * self.nodes.count

    def environment(self) -> dict[str, str]:
        """What the ranks are given besides the user's own variables: `--threads` only."""
        return {} if self.threads is None else {THREADS: str(self.threads)}

    @property
    def threads_given(self) -> str | None:
        """OMP_NUM_THREADS as the ranks get it: `--threads`, else the user's; None: unset."""
        return self.environment().get(THREADS, os.environ.get(THREADS))

    def runner_args(self) -> tuple[str, ...]:
        """The runner's options, then the script and its arguments."""
        return (
            "--warmup",
            str(self.warmup),
            *(("--steps", str(self.steps)) if self.steps else ()),
            *(("--step-fn", self.step_fn) if self.step_fn else ()),
            *(() if self.detect else ("--no-detector",)),
            str(self.script),
            *self.args,
        )


@dataclass(frozen=True)
class Scanned:
    """What a scan's run left: each rank's record (None for a rank that left none), why the run
    is partial (None: it ended cleanly), whether Ctrl-C stopped it, its folder and seconds."""

    ranks: tuple[ScanRank | None, ...]
    partial: str | None
    interrupted: bool
    run_dir: Path
    seconds: float


def check_plan(plan: ScanPlan) -> None:
    """Refuse, before anything starts, what cannot run: each in one line with the fix."""
    if not plan.script.is_file():
        raise WorkspaceError(
            f"no script at {plan.script}: give the path of a Python file, as to `python SCRIPT`"
        )
    try:
        ast.parse(plan.script.read_bytes(), str(plan.script))
    except SyntaxError as error:
        raise WorkspaceError(
            f"{plan.script}:{error.lineno}: {error.msg}: fix the script (nothing was started)"
        ) from None
    if launchers.LAUNCHERS[plan.launcher].one_process and plan.world_size > 1:
        raise WorkspaceError(
            f"the {plan.launcher} launcher runs one process, not {plan.world_size}: use"
            " --launcher torchrun (the default with --nproc-per-node or --nnodes)"
        )
    if plan.warmup < 1:
        raise WorkspaceError(f"--warmup {plan.warmup}: {WARMUP}")
    if plan.step_fn is not None and not _is_target(plan.step_fn):
        raise WorkspaceError(
            f"--step-fn {plan.step_fn}: give MODULE:FUNCTION (`__main__:train_step` for a"
            " function of the script itself, `Class.method` for a method)"
        )


def _is_target(text: str) -> bool:
    module, colon, qualname = text.partition(":")
    return bool(colon and module and all(part.isidentifier() for part in qualname.split(".")))


def run_scan(layout: Layout, plan: ScanPlan) -> Scanned:
    """Run the plan and read back what its ranks recorded; every process is gone on return."""
    run = processes.Run(layout.new_run_dir(SCAN), None, layout)
    world = World(plan.world_size, plan.runner_args())
    what = LaunchPlan(
        RUNNER,
        (world,),
        plan.device,
        plan.timeout,
        env=plan.environment(),
        nodes=plan.nodes,
        launcher_args=plan.launcher_args,
    )
    started = time.monotonic()
    partial, interrupted = None, False
    folder = world_dir(run.run_dir, 0, world)
    try:
        launchers.start_users(plan.launcher, run, what)
    except RunHung as error:
        partial = str(error)
    except RunFailed as error:
        partial = with_the_silent(error, dataclasses.replace(run, run_dir=folder), world.ranks)
    except KeyboardInterrupt:
        partial, interrupted = "interrupted by Ctrl-C", True
    ranks = tuple(read_rank(folder, rank) for rank in range(world.ranks))
    if partial is None and not any(rank and rank.steps for rank in ranks):
        partial = (
            f"{plan.script.name} ran to its end without a step (no optimizer step, no call of"
            f" --step-fn): name its step function with --step-fn MODULE:FUNCTION"
            f"{candidates_text(plan.script)}"
        )
    return Scanned(ranks, partial, interrupted, run.run_dir, round(time.monotonic() - started, 1))


def step_candidates(script: Path) -> list[str]:
    """The script's functions and methods that call `backward()` or `step()`, as `--step-fn`
    names them (`__main__:train_step`)."""
    found = []
    tree = ast.parse(script.read_bytes(), str(script))
    methods = [
        (f"{node.name}.", item)
        for node in tree.body
        if isinstance(node, ast.ClassDef)
        for item in node.body
    ]
    for prefix, node in [("", node) for node in tree.body] + methods:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and any(
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr in STEP_CALLS
            for call in ast.walk(node)
        ):
            found.append(f"{MAIN}:{prefix}{node.name}")
    return found


def candidates_text(script: Path) -> str:
    """The candidates for `--step-fn`, or that the script defines none."""
    found = step_candidates(script)
    if not found:
        return f" (no function of {script.name} calls backward() or step())"
    return f"; candidates, which call backward() or step(): {', '.join(found)}"


def with_the_silent(error: RunFailed, run: processes.Run, ranks: int) -> str:
    """The failure, the first rank to stop first: a rank that stopped without a result, an
    error or a stop note; then the ranks stopped by a signal because of it; then `error`."""
    unfinished = processes.unfinished(run.run_dir, ranks)
    notes = {rank: run.run_dir / f"rank-{rank}.stopped" for rank in unfinished}
    stopped = [rank for rank in unfinished if notes[rank].exists()]
    silent = [rank for rank in unfinished if rank not in stopped]
    said = []
    if silent:
        said.append(
            f"rank {', '.join(map(str, silent))} of {ranks} stopped mid-run without an error"
            f" (killed, or it exited: see {run.log_file})"
        )
    for rank in stopped:
        signal = notes[rank].read_text().strip()
        said.append(f"rank {rank} of {ranks} was stopped by {signal}")
    return "; then ".join([*said, str(error)])


def read_rank(folder: Path, rank: int) -> ScanRank | None:
    """A rank's whole record, else the steps its snapshot holds, else None; in the world's
    folder, or (a run across nodes that failed before they pooled their ranks) its node's."""
    where = [folder, *sorted(folder.glob("node-*"))]

    def first(name: str) -> Path | None:
        return next((f / name for f in where if (f / name).exists()), None)

    whole = first(f"rank-{rank}.json")
    if whole is not None:
        try:
            return read_file(RankReport, whole).read(ScanRank)
        except RecordError:
            pass  # cut short as it was written: its snapshot holds the steps
    snapshot = first(f"rank-{rank}.partial.jsonl")
    if snapshot is None:
        return None
    header, *lines = snapshot.read_text().splitlines()
    steps = []
    for line in lines:
        try:
            steps.append(ScanStep.from_json(json.loads(line)))
        except (ValueError, RecordError):
            break  # the line being written when the rank was stopped
    found = json.loads(header)
    return ScanRank(found["rank"], found["world_size"], ScanEnd.RUNNING, 0.0, tuple(steps))


def hunt_ranks(ranks: Sequence[ScanRank]) -> list[HuntRank]:
    """The ranks as the hunt's summing up reads them: their steps (nothing else is read)."""
    return [
        HuntRank(
            rank.rank, Device.CPU, "", "", HuntRecording(tuple(s.hunt for s in rank.steps), ())
        )
        for rank in ranks
    ]


def scan_result(
    layout: Layout,
    plan: ScanPlan,
    scanned: Scanned,
    accepted: tuple[AllowRule, ...],
    carried: tuple[AllowRule, ...],
) -> ScanResult:
    """The run summed up: sites over the ranks (each with its disposition), the steady cost."""
    ranks = [rank for rank in scanned.ranks if rank is not None]
    hunted = hunt_ranks(ranks)
    measured = dataclasses.replace(
        provenance.workspace_inputs(layout), scripts={plan.script.name: sha256(plan.script)}
    )
    return ScanResult(
        stamp=provenance.stamp(layout, measured),
        environment=devices.describe(sys.executable),
        script=plan.script.as_posix(),
        args=plan.args,
        launcher=plan.launcher,
        launcher_args=plan.launcher_args,
        world_size=plan.world_size,
        warmup=plan.warmup,
        steps_asked=plan.steps,
        step_fn=plan.step_fn,
        allowlist=accepted,
        sites=tuple(summarize(hunted, accepted, carried)),
        cost=steady_cost(hunted),
        ranks=tuple(ranks),
        wall_s=scanned.seconds,
        partial=scanned.partial,
        threads=plan.threads_given,
    )
