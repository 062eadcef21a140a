"""Recording a case's profile: its profile script on each tree.

The card's `[profile]` names the script, how it is launched, its rank count and scenario. Each
tree's run warms the reproducer up, then records a few steps whose measured code runs inside
`protocol.MEASURED_RANGE`. Where `nsys` is on the PATH and the ranks have GPUs, Nsight Systems
records them (`--capture-range=cudaProfilerApi`) and `nsys stats` makes the figures; when it
cannot, the summary says why and the PyTorch profiler takes over, as it does everywhere else.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from hostsync import launchers
from hostsync.cases import Case
from hostsync.errors import WorkspaceError, last_line
from hostsync.launchers import ENGINE_SRC, Run, RunFailed, Start, World, world_dir
from hostsync.layout import Layout
from hostsync.profiling.traces import (
    NSYS_REPORTS,
    NsysFailed,
    analyse_trace,
    combine_ranks,
    load_trace,
    nsys_figures,
)
from hostsync.protocol import MEASURED_RANGE, RUN_DIR_ENV, TREE_PACKAGE_ENV, TREE_SRC_ENV
from hostsync.records import Capture, Device, Launcher, Tree

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

    @property
    def ranks(self) -> int:
        return self.case.profile.ranks


def nsys_command(report: Path) -> tuple[str, ...]:
    """Nsight Systems around the launcher, recording between cudaProfilerStart and Stop."""
    return (
        "nsys", "profile", "-t", "cuda,nvtx,osrt",
        "--capture-range=cudaProfilerApi", "--capture-range-end=stop",
        "-o", str(report),
    )  # fmt: skip


def nsys_stats_command(report: Path, prefix: Path) -> list[str]:
    reports = [arg for name in NSYS_REPORTS for arg in ("--report", name)]
    return [
        "nsys", "stats", *reports, "--format", "csv", "--output", str(prefix),
        f"--filter-nvtx={MEASURED_RANGE}", str(report),
    ]  # fmt: skip


def capture_name(tree: str, backend: str, world_size: int) -> str:
    return f"{tree.replace('+', '-')}-{backend}-ws{world_size}"


def shown(layout: Layout, command: Sequence[str], run: Run | None = None,
          env: dict[str, str] | None = None) -> str:  # fmt: skip
    """The command as a user reruns it by hand from the workspace root, with the variables the
    ranks read (no paths of this machine: it goes into result files)."""
    root = str(layout.root) + os.sep

    def relative(text: str) -> str:
        return text.replace(str(ENGINE_SRC), "src").replace(root, "")

    pythons = {sys.executable, run and run.tree.python}
    words = ["python" if word in pythons else relative(word) for word in command]
    if run is None:
        return shlex.join(words)
    env = env or {}
    variables = {name: run.environment(env)[name] for name in (*RERUN_ENV, *env)}
    # Paths once each (PYTHONPATH may name the engine's src/ twice).
    parts = {name: dict.fromkeys(relative(value).split(os.pathsep))
             for name, value in variables.items()}  # fmt: skip
    assignments = [f"{name}={os.pathsep.join(found)}" for name, found in parts.items()]
    mkdir = shlex.join(["mkdir", "-p", relative(str(run.run_dir))])
    return f"{mkdir} && {shlex.join(assignments + words)}"


def capture(layout: Layout, tree: Tree, run_dir: Path, artifacts: Path,
            settings: ProfileSettings, profiler: str) -> Capture:  # fmt: skip
    """One launch of the profile script on `tree`; its per-step figures and where its files
    went (moved into `artifacts`)."""
    spec = settings.case.profile
    args = (
        "--device", str(settings.device), "--profiler", profiler,
        "--scenario", settings.scenario, "--warmup", str(settings.warmup),
        "--steps", str(settings.steps),
    )  # fmt: skip
    nsys_report = run_dir / "capture"
    what = Start(
        layout.repro / spec.script, (World(settings.ranks, args),), Device(settings.device),
        settings.timeout, wrap=nsys_command(nsys_report) if profiler == NSYS else (),
    )  # fmt: skip
    run = Run(run_dir, tree, layout)
    by_hand = rerun_command(layout, run, what, spec.launcher)
    print(f"{tree.label}: {by_hand}")
    started = time.monotonic()
    (ranks,) = launchers.start(spec.launcher, run, what)
    seconds = round(time.monotonic() - started, 1)
    name = capture_name(tree.label, ranks[0]["backend"], ranks[0]["world_size"])
    made = Capture(
        tree=tree.label, version=tree.version, commit=tree.commit, backend=ranks[0]["backend"],
        world_size=ranks[0]["world_size"], device=ranks[0]["device"], profiler=profiler,
        command=by_hand, wall_s=seconds, artifacts=(),
    )  # fmt: skip
    if profiler == NSYS:
        return _nsys_capture(layout, made, ranks, nsys_report, run_dir, artifacts, settings, name)
    per_rank, kept = [], []
    folder = world_dir(run_dir, 0, what.worlds[0])
    for result in ranks:
        trace = folder / result["trace"]
        per_rank.append(analyse_trace(load_trace(trace)))
        target = f"{name}-rank{result['rank']}.trace.json.gz"
        shutil.move(trace, artifacts / target)
        kept.append(target)
    return replace(made, artifacts=tuple(kept), per_step=combine_ranks(per_rank))


def rerun_command(layout: Layout, run: Run, what: Start, launcher: Launcher) -> str:
    """How to rerun the capture's world by hand, where its launcher starts one command (the
    fork launcher has none: then the profile command itself)."""
    command = launchers.COMMANDS.get(launcher)
    if command is None:
        return f"python -m hostsync profile --case {layout.case} --trees {run.tree.label}"
    world = what.worlds[0]
    inner = replace(run, run_dir=world_dir(run.run_dir, 0, world))
    inner.run_dir.mkdir(parents=True, exist_ok=True)
    return shown(layout, [*what.wrap, *command(inner, world, what)], inner, what.environment())


def _nsys_capture(layout: Layout, made: Capture, ranks: list[dict], nsys_report: Path,
                  run_dir: Path, artifacts: Path, settings: ProfileSettings,
                  name: str) -> Capture:  # fmt: skip
    report = nsys_report.with_suffix(".nsys-rep")
    if not report.exists():
        raise NsysFailed("nsys recorded no .nsys-rep report (only a .qdstrm, or nothing)")
    stats = nsys_stats_command(report, run_dir / "stats")
    print(f"{made.tree}: {shown(layout, stats)}")
    done = subprocess.run(stats, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise NsysFailed(f"`nsys stats` failed on the report ({last_line(done.stderr)})")
    figures = nsys_figures(run_dir, "stats", settings.steps)
    shutil.move(report, artifacts / f"{name}.nsys-rep")
    range_s = [s for rank in ranks for s in rank["range_seconds"]]
    # The ranks' own clocks: nsys's range covers the capture, not one step.
    figures = replace(figures, range_ms=round(1000 * statistics.median(range_s), 3))
    return replace(made, artifacts=(f"{name}.nsys-rep",), nsys=figures)


def capture_with_fallback(layout: Layout, tree: Tree, staging: Path, settings: ProfileSettings,
                          notes: list[str]) -> Capture:  # fmt: skip
    """nsys when chosen; when it cannot make a report, say so and use the PyTorch profiler."""
    artifacts = staging / "artifacts"
    if settings.profiler == NSYS:
        try:
            return capture(layout, tree, staging / f"{tree.label}-nsys", artifacts, settings,
                           NSYS)  # fmt: skip
        except (NsysFailed, RunFailed) as error:
            notes.append(
                f"{tree.label}: nsys is on the PATH but {error}; the figures come from"
                " the PyTorch profiler instead"
            )
            log.warning("%s", notes[-1])
    return capture(layout, tree, staging / tree.label, artifacts, settings, TORCH)


def choose_profiler(requested: str, device: Device) -> str:
    found = shutil.which("nsys")
    if requested == "auto":
        return NSYS if found and device == Device.CUDA else TORCH
    if requested == NSYS and device != Device.CUDA:
        raise WorkspaceError("--profiler nsys records CUDA: use --device cuda, or --profiler torch")
    if requested == NSYS and not found:
        raise WorkspaceError(
            "--profiler nsys: no nsys on the PATH; install Nsight Systems or use --profiler torch"
        )
    return requested
