"""Recording a case's profile: its profile script on each tree.

The card's `[profile]` names the script, how it is launched, its rank count and scenario. Each
tree's run warms the reproducer up, then records a few steps whose measured code runs inside
`protocol.MEASURED_RANGE`. Where `nsys` is on the PATH and the ranks have GPUs (or when asked
for on a CPU), Nsight Systems records them (`profiling.nsys`) and `nsys stats` makes the figures;
when it cannot, the summary says why and the PyTorch profiler takes over, as it does everywhere
else.
"""

from __future__ import annotations

import ctypes.util
import logging
import os
import shlex
import shutil
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from hostsync.launch import launchers, processes
from hostsync.launch.launchers import LaunchPlan, World, world_dir
from hostsync.launch.nodes import SINGLE, NodeLayout, shares_of
from hostsync.launch.processes import ENGINE_SRC, Run, RunFailed
from hostsync.profiling import nsys
from hostsync.profiling.nsys import NsysFailed
from hostsync.profiling.records import Capture
from hostsync.profiling.traces import analyse_trace, combine_ranks, load_trace
from hostsync.rank.protocol import RUN_DIR_ENV, TREE_PACKAGE_ENV, TREE_SRC_ENV
from hostsync.rank.records import ProfiledRank
from hostsync.upstream.trees import Tree
from hostsync.workspace.cases import Case, Profile
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.records import Device, Launcher

log = logging.getLogger(__name__)

# What a rank reads from its environment besides the usual: set them to rerun a capture by hand.
RERUN_ENV = ("PYTHONPATH", RUN_DIR_ENV, TREE_SRC_ENV, TREE_PACKAGE_ENV)
TORCH, NSYS = "torch", "nsys"


@dataclass(frozen=True)
class ProfileSettings:
    """What `profile` was asked for one case, read once from the command line and its card."""

    case: Case
    trees: tuple[str, ...]
    scenario: str
    warmup: int
    steps: int
    device: str  # `auto` until the trees' environment resolves it
    profiler: str
    timeout: float
    nodes: NodeLayout = SINGLE

    @property
    def profile(self) -> Profile:
        """The card's [profile]: settings are made for a case that has one."""
        if self.case.profile is None:
            raise WorkspaceError(f"case {self.case.name} has no [profile] in its card")
        return self.case.profile

    @property
    def ranks(self) -> int:
        return self.profile.ranks


def capture_name(tree: str, backend: str, world_size: int) -> str:
    return f"{tree.replace('+', '-')}-{backend}-ws{world_size}"


def shown(
    layout: Layout,
    command: Sequence[str],
    run: Run | None = None,
    env: dict[str, str] | None = None,
) -> str:
    """The command as a user reruns it by hand from the workspace root, with the variables the
    ranks read (no paths of this machine: it goes into result files)."""
    root = str(layout.root) + os.sep

    def relative(text: str) -> str:
        return text.replace(str(ENGINE_SRC), "src").replace(root, "")

    pythons = {sys.executable, run and run.python}
    words = ["python" if word in pythons else relative(word) for word in command]
    if run is None:
        return shlex.join(words)
    env = env or {}
    variables = {name: run.environment(env)[name] for name in (*RERUN_ENV, *env)}
    # Paths once each (PYTHONPATH may name the engine's src/ twice).
    parts = {
        name: dict.fromkeys(relative(value).split(os.pathsep)) for name, value in variables.items()
    }
    assignments = [f"{name}={os.pathsep.join(found)}" for name, found in parts.items()]
    mkdir = shlex.join(["mkdir", "-p", relative(str(run.run_dir))])
    return f"{mkdir} && {shlex.join(assignments + words)}"


def capture(
    layout: Layout,
    tree: Tree,
    run_dir: Path,
    artifacts: Path,
    settings: ProfileSettings,
    profiler: str,
) -> Capture:
    """One launch of the profile script on `tree`; its per-step figures and where its files
    went (moved into `artifacts`)."""
    spec = settings.profile
    args = (
        "--device",
        str(settings.device),
        "--profiler",
        profiler,
        "--scenario",
        settings.scenario,
        "--warmup",
        str(settings.warmup),
        "--steps",
        str(settings.steps),
        *settings.case.launch_of(settings.scenario).args,
    )
    session = nsys.new_session()
    what = LaunchPlan(
        layout.repro / spec.script,
        (World(settings.ranks, args),),
        Device(settings.device),
        settings.timeout,
        env=nsys.ENV if profiler == NSYS else {},
        wrap=nsys.profile_command(session) if profiler == NSYS else (),
        nodes=settings.nodes,
    )
    run = Run(run_dir, tree, layout)
    by_hand = rerun_command(layout, run, what, spec.launcher)
    print(f"{tree.label}: {by_hand}")
    started = time.monotonic()
    try:
        (reports,) = launchers.run_worlds(spec.launcher, run, what)
    finally:
        if profiler == NSYS:
            nsys.end_agents(session)
    seconds = round(time.monotonic() - started, 1)
    ranks = processes.read_ranks(reports, ProfiledRank)
    first = ranks[0]
    name = capture_name(tree.label, first.backend, first.world_size)
    made = Capture(
        tree=tree.label,
        version=tree.version,
        commit=tree.commit,
        backend=first.backend,
        world_size=first.world_size,
        device=first.device,
        profiler=profiler,
        command=by_hand,
        wall_s=seconds,
        artifacts=(),
        nodes=shares_of(f"{tree.label} {spec.script} x{settings.ranks}", reports),
    )
    folder = world_dir(run_dir, 0, what.worlds[0])
    if profiler == NSYS:
        return _nsys_capture(layout, made, folder, artifacts, name)
    per_rank, kept = [], []
    for result in ranks:
        if result.trace is None:
            raise WorkspaceError(f"rank {result.rank} wrote no trace: see {folder}")
        trace = folder / result.trace
        per_rank.append(analyse_trace(load_trace(trace)))
        target = f"{name}-rank{result.rank}.trace.json.gz"
        shutil.move(trace, artifacts / target)
        kept.append(target)
    return replace(made, artifacts=tuple(kept), per_step=combine_ranks(per_rank))


def rerun_command(layout: Layout, run: Run, what: LaunchPlan, launcher: Launcher) -> str:
    """How to rerun the capture's world by hand, where its launcher starts one command (the
    fork launcher has none, nor a world across nodes: then the profile command itself)."""
    command = launchers.LAUNCHERS[launcher].command
    if command is None or what.nodes.spans_nodes:
        return f"python -m hostsync profile --case {layout.case} --trees {run.label}"
    world = what.worlds[0]
    inner = replace(run, run_dir=world_dir(run.run_dir, 0, world))
    inner.run_dir.mkdir(parents=True, exist_ok=True)
    return shown(
        layout, what.wrapped(inner, command(inner, world, what)), inner, what.environment()
    )


def _nsys_capture(
    layout: Layout, made: Capture, folder: Path, artifacts: Path, name: str
) -> Capture:
    """Every node's report of the world through `nsys stats`, then its figures; the reports are
    the capture's attachments."""
    reports = nsys.reports_in(folder)
    if not reports:
        raise NsysFailed(
            "nsys recorded no .nsys-rep report (only a .qdstrm, or nothing: see docs/nsight.md on"
            " installing Nsight Systems)"
        )
    tables = nsys.tables()
    prefixes = []
    for report in reports:
        print(f"{made.tree}: {shown(layout, nsys.stats_command(report, tables))}")
        prefixes.append(nsys.run_stats(report, tables))
    figures = nsys.figures(prefixes, tables)
    kept = []
    for report in reports:
        kept.append(f"{name}-{report.stem.removeprefix(nsys.REPORT + '-')}.nsys-rep")
        shutil.move(report, artifacts / kept[-1])
    return replace(made, artifacts=tuple(kept), nsys=figures, nsys_version=nsys.version())


def capture_with_fallback(
    layout: Layout, tree: Tree, staging: Path, settings: ProfileSettings, notes: list[str]
) -> Capture:
    """nsys when chosen; when it cannot make a report, say so and use the PyTorch profiler."""
    artifacts = staging / "artifacts"
    if settings.profiler == NSYS:
        try:
            return capture(layout, tree, staging / f"{tree.label}-nsys", artifacts, settings, NSYS)
        except (NsysFailed, RunFailed) as error:
            notes.append(
                f"{tree.label}: nsys is on the PATH but {error}; the figures come from"
                " the PyTorch profiler instead"
            )
            log.warning("%s", notes[-1])
    return capture(layout, tree, staging / tree.label, artifacts, settings, TORCH)


def choose_profiler(requested: str, device: Device) -> str:
    """`auto`: nsys where it is installed and the ranks have GPUs. Asked for on a CPU, nsys
    records the NVTX ranges (no CUDA): the ranks push them through libnvToolsExt there."""
    found = shutil.which("nsys")
    if requested == "auto":
        return NSYS if found and device == Device.CUDA else TORCH
    if requested == NSYS and not found:
        raise WorkspaceError(
            "--profiler nsys: no nsys on the PATH; install Nsight Systems (see docs/nsight.md)"
            " or use --profiler torch"
        )
    if requested == NSYS and device != Device.CUDA and not ctypes.util.find_library("nvToolsExt"):
        raise WorkspaceError(
            "--profiler nsys on a CPU needs libnvToolsExt for the ranks' NVTX ranges: install"
            " libnvtoolsext1 (see docs/nsight.md), or use --profiler torch"
        )
    return requested
