"""A case's profiled step on one GPU, per step, each tree against the others (pinned, patched).

Any case with a `[profile]` runs here: its profile script (the card's scenario, with that
scenario's launch arguments) as one rank of world size 1, each tree in a process of its own, the
tree's package first on its path. Per step, inside the measured range, medians or means over the
profiled steps:

- the step's wall time on the device, from CUDA events recorded at the range's edges;
- the GPU's idle time between kernels, the device-to-host copies and the synchronising CUDA calls
  (the PyTorch profiler's CUDA activity, read by `hostsync.profiling.traces`);
- the host reads (`aten::_local_scalar_dense`);
- the warnings of `torch.cuda.set_sync_debug_mode("warn")`, a second opinion;
- Nsight Systems' count of the same ranges, where `nsys` is installed.

    python gpu/case_on_gpu.py pack --case ds-clip-norm                  # here: gpu/carry/<case>/
    python3 gpu/case_on_gpu.py measure --case ds-clip-norm --out-dir D  # there: D/gpu-<time>.json

`pack` writes each tree's import root (for DeepSpeed its packages and the C++ sources of the ops
it builds on first use) as an archive into gpu/carry/<case>/, what a GPU machine is given beside
the working tree, where each tree's built ops are kept too; the machine needs the project's own
dependencies installed. Copy the result into
profiles/<case>/, where `review` cites it as the source `gpu`. `--device cpu` is a dry run of the
same steps on a CPU: host reads only, every GPU figure None.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import runpy
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hostsync.detector.codec import read_file  # noqa: E402
from hostsync.launch.launchers import ENGINE_SRC, NODE_FIELD, RUN_DIR_FIELD  # noqa: E402
from hostsync.measure import provenance  # noqa: E402 (the workspace's engine, by path)
from hostsync.profiling import nsys  # noqa: E402
from hostsync.profiling.records import GpuResult, GpuTreeFigures  # noqa: E402
from hostsync.rank.protocol import (  # noqa: E402
    MEASURED_RANGE,
    RUN_DIR_ENV,
    SYNC_OP,
    TREE_PACKAGE_ENV,
    TREE_SRC_ENV,
    free_port,
)
from hostsync.rank.records import ProfiledRank, RankReport  # noqa: E402
from hostsync.workspace import cases, results  # noqa: E402
from hostsync.workspace.errors import WorkspaceError  # noqa: E402
from hostsync.workspace.layout import Layout  # noqa: E402
from hostsync.workspace.records import Stamp, TreeInfo  # noqa: E402

TREES_FILE = "trees.json"
FIGURES_FILE = "figures.json"
_TREE_TIMEOUT_S = 600


# --- here: the trees to carry --------------------------------------------------------------------


def pack(layout: Layout, names: list[str], carry: Path) -> list[Path]:
    """Each tree's import root as `<label>.tar.gz` in `carry`, and what they are in trees.json."""
    from hostsync.upstream.trees import prepare_tree  # needs the workspace's tools: here only

    case = cases.load(layout.root, layout.case)
    carry.mkdir(parents=True, exist_ok=True)
    infos, archives = {}, []
    for name in names:
        tree = prepare_tree(case, name)
        archives.append(carry / f"{tree.label}.tar.gz")
        with tarfile.open(archives[-1], "w:gz") as archive:
            for path in sorted(p for p in tree.src.iterdir() if p.name != ".git"):
                archive.add(path, path.name, filter=_without_bytecode)
        infos[tree.label] = tree.info(layout.root).to_json()
    (carry / TREES_FILE).write_text(json.dumps(infos, indent=2) + "\n")
    return archives


def _without_bytecode(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in member.name else member


# --- there: each tree measured in a process of its own -------------------------------------------


@dataclass(frozen=True)
class Steps:
    """What each tree runs: the case's profile script (`script`, or its card's), on `device`,
    `warmup` steps, then `steps` measured."""

    case: str
    script: str
    device: str
    warmup: int
    steps: int

    def argv(self) -> list[str]:
        return [
            "--case",
            self.case,
            *(["--script", self.script] if self.script else []),
            "--device",
            self.device,
            "--warmup",
            str(self.warmup),
            "--steps",
            str(self.steps),
        ]


def measure(layout: Layout, carry: Path, run: Steps, argv: list[str]) -> GpuResult:
    """Every carried tree's profiled steps; with nsys installed (and a GPU), Nsight Systems'."""
    import torch

    trees_file = carry / TREES_FILE
    if not trees_file.exists():
        raise WorkspaceError(
            f"no {trees_file}: run `python gpu/case_on_gpu.py pack --case {layout.case}` first"
        )
    infos = {
        label: TreeInfo.from_json(info)
        for label, info in json.loads(trees_file.read_text()).items()
    }
    cuda = run.device == "cuda"
    use_nsys = cuda and shutil.which("nsys") is not None
    found = []
    with tempfile.TemporaryDirectory(prefix="gpu-trees-") as scratch:
        for label in infos:
            src = Path(scratch) / label
            with tarfile.open(carry / f"{label}.tar.gz") as archive:
                archive.extractall(src, filter="data")
            built = carry / f"{label}-extensions"  # the ops a tree builds, kept between runs
            figures = run_tree(run, src, built, Path(scratch), label, "torch")
            if use_nsys:
                wrapped = nsys_steps(run, src, built, Path(scratch), label)
                figures = GpuTreeFigures.from_json(figures.to_json() | {"nsys": wrapped.to_json()})
            found.append(
                GpuTreeFigures.from_json(figures.to_json() | {"version": infos[label].version})
            )
    command = shlex.join(["python", "gpu/case_on_gpu.py", *argv])
    return GpuResult(
        stamp=Stamp.now(command, layout.case, provenance.inputs(layout)),
        device=torch.cuda.get_device_name(0) if cuda else "cpu",
        torch=torch.__version__,
        dry_run=not cuda,
        warmup_steps=run.warmup,
        steps=run.steps,
        trees=infos,
        figures=tuple(found),
    )


def run_tree(
    run: Steps,
    src: Path,
    built: Path,
    scratch: Path,
    label: str,
    profiler: str,
    wrap: tuple[str, ...] = (),
) -> GpuTreeFigures:
    """One tree's profiled steps in a process of its own, the tree first on its path and its
    built ops in `built`."""
    folder = scratch / f"{label}-{profiler}"
    folder.mkdir()
    env = (
        os.environ
        | nsys.ENV
        | {
            "PYTHONPATH": os.pathsep.join([str(src), str(ENGINE_SRC)]),
            "TORCH_EXTENSIONS_DIR": str(built),
        }
    )
    command = [
        *wrap,
        *(sys.executable, __file__, "rank", *run.argv()),
        *("--src", str(src), "--folder", str(folder), "--profiler", profiler),
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=_TREE_TIMEOUT_S)
    if done.returncode != 0:
        raise WorkspaceError(f"{label}: the steps failed ({done.stderr.strip()[-2000:]})")
    figures = GpuTreeFigures.from_json(json.loads((folder / FIGURES_FILE).read_text()))
    return GpuTreeFigures.from_json(figures.to_json() | {"tree": label})


def nsys_steps(run: Steps, src: Path, built: Path, scratch: Path, label: str):
    """The same steps under Nsight Systems, and its figures of the measured ranges."""
    session = nsys.new_session()
    folder = scratch / f"{label}-nsys"
    wrap = tuple(
        word.replace(RUN_DIR_FIELD, str(folder)).replace(NODE_FIELD, "0")
        for word in nsys.profile_command(session)
    )
    try:
        run_tree(run, src, built, scratch, label, "nsys", wrap)
    finally:
        nsys.end_agents(session)
    tables = nsys.tables()
    return nsys.figures(
        [nsys.run_stats(report, tables) for report in nsys.reports_in(folder)], tables
    )


# --- the steps, in the tree's own process --------------------------------------------------------


class StepClock:
    """The measured ranges' device wall time (CUDA events at their edges) and the warnings of
    `set_sync_debug_mode("warn")` inside them, one entry per range, warm-up ranges included."""

    def __init__(self, cuda: bool) -> None:
        self.cuda = cuda
        self.events: list[tuple[object, object]] = []
        self.sync_warnings: list[int] = []

    @contextlib.contextmanager
    def around(self, name: str) -> Iterator[None]:
        if name != MEASURED_RANGE or not self.cuda:
            yield
            return
        import torch

        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            try:
                yield
            finally:
                torch.cuda.set_sync_debug_mode(0)
        end.record()
        self.events.append((start, end))
        self.sync_warnings.append(sum("synchroniz" in str(w.message) for w in caught))

    def last(self, steps: int) -> tuple[float | None, float | None]:
        """The median wall time (ms) and the mean sync warnings of the last `steps` ranges."""
        if not self.cuda:
            return None, None
        import statistics

        import torch

        torch.cuda.synchronize()
        times = [start.elapsed_time(end) for start, end in self.events[-steps:]]
        warned = self.sync_warnings[-steps:]
        return round(statistics.median(times), 3), statistics.fmean(warned)


def rank_main(args: argparse.Namespace) -> None:
    """The case's profile script (`--script`, or its card's) as rank 0 of 1 on this tree; its
    figures into figures.json."""
    from hostsync.profiling.traces import analyse_trace, combine_ranks, load_trace
    from hostsync.rank import rankkit

    layout = Layout().for_case(args.case)
    case = cases.load(layout.root, args.case)
    if case.card.profile is None:
        raise WorkspaceError(f"case {args.case} has no [profile]: nothing to measure per step")
    spec = case.card.profile
    script = layout.repro / (args.script or spec.script)
    folder = Path(args.folder)
    os.environ.update(
        {
            "RANK": "0",
            "LOCAL_RANK": "0",
            "WORLD_SIZE": "1",
            "LOCAL_WORLD_SIZE": "1",
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
            RUN_DIR_ENV: str(folder),
            TREE_SRC_ENV: args.src,
            TREE_PACKAGE_ENV: case.project.name,
        }
    )
    clock = StepClock(args.device == "cuda")
    opened = rankkit.named_range

    @contextlib.contextmanager
    def clocked_range(name: str, nvtx: bool) -> Iterator[None]:
        with opened(name, nvtx), clock.around(name):
            yield

    rankkit.named_range = clocked_range  # before the script imports it
    sys.argv = [
        str(script),
        "--device",
        args.device,
        "--profiler",
        args.profiler,
        "--scenario",
        spec.scenario,
        "--warmup",
        str(args.warmup),
        "--steps",
        str(args.steps),
        *case.launch_of(spec.scenario).args,
    ]
    sys.path.insert(0, str(script.parent))  # as torchrun does: the script's folder first
    started = time.monotonic()
    runpy.run_path(str(script), run_name="__main__")  # a failure raises, its traceback on stderr
    step_ms, sync_warnings = clock.last(args.steps)
    rank = read_file(RankReport, folder / "rank-0.json").read(ProfiledRank)
    reads = None
    if rank.trace:
        step = combine_ranks([analyse_trace(load_trace(folder / rank.trace))])
        reads, copies, copied, calls, idle = (
            step.ops[SYNC_OP],
            step.dtoh_copies,
            step.dtoh_bytes,
            step.cuda_calls,
            step.gpu_idle_ms,
        )
    else:  # under nsys the script records no trace: Nsight Systems' report is the figure
        copies = copied = calls = idle = None
    figures = GpuTreeFigures(
        tree="",
        version="",
        host_reads=reads or 0,
        dtoh_copies=copies,
        dtoh_bytes=copied,
        cuda_calls=calls,
        sync_warnings=sync_warnings,
        step_ms=step_ms,
        gpu_idle_ms=idle,
    )
    (folder / FIGURES_FILE).write_text(json.dumps(figures.to_json(), indent=2) + "\n")
    print(f"{args.case}: {args.steps} steps in {time.monotonic() - started:.1f} s")


# --- command line --------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="the trees into gpu/carry/<case>/ (here)")
    packing.add_argument("--trees", default="pinned,patched", help="default: %(default)s")
    measuring = commands.add_parser("measure", help="each carried tree's steps (on the GPU)")
    measuring.add_argument("--out-dir", type=Path, required=True, help="where the result goes")
    rank = commands.add_parser("rank", help="one tree's steps (what `measure` runs)")
    rank.add_argument("--src", required=True)
    rank.add_argument("--folder", required=True)
    rank.add_argument("--profiler", choices=("torch", "nsys"), default="torch")
    for command in (packing, measuring, rank):
        command.add_argument("--case", required=True, help="a case with a [profile]")
    for command in (measuring, rank):
        command.add_argument(
            "--script",
            default="",
            help="another profile script of the case's repro/ folder than its card's",
        )
    for command in (measuring, rank):
        command.add_argument(
            "--device",
            choices=("cuda", "cpu"),
            default="cuda",
            help="cpu: a dry run, host reads only",
        )
        command.add_argument("--warmup", type=int, default=3)
        command.add_argument("--steps", type=int, default=10)
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.command == "rank":
        rank_main(args)
        return 0
    layout = Layout().for_case(args.case)
    carry = layout.root / "gpu" / "carry" / args.case
    if args.command == "pack":
        for archive in pack(layout, args.trees.split(","), carry):
            print(f"wrote {archive} ({archive.stat().st_size >> 20} MiB)")
    else:
        run = Steps(args.case, args.script, args.device, args.warmup, args.steps)
        result = measure(layout, carry, run, argv)
        for tree in result.figures:
            print(json.dumps(tree.to_json()))
        path = results.write(args.out_dir, result, keep_elsewhere=args.out_dir)
        print(f"wrote {path}: copy it into profiles/{args.case}/ for the drafts")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except WorkspaceError as error:
        sys.exit(f"error: {error}")
