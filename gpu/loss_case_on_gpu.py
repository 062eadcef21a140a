"""The loss case on one GPU: device-to-host copies and syncs per step, pinned against fixed.

What the issue snippet runs, on the GPU: `deepspeed_sp_compute_loss` through its mesh branch at
world size 1 (NCCL refuses two ranks on one GPU; the mesh branch needs no DeepSpeed), a few
warm-up steps, then measured steps, each tree in a process of its own (a tree is imported by
path). Per step, inside the measured range: the host reads (`aten::_local_scalar_dense`), the
device-to-host copies and synchronising CUDA calls (the PyTorch profiler's CUDA activity, read by
`hostsync.profiling.traces`), the warnings of `torch.cuda.set_sync_debug_mode("warn")`, and,
where `nsys` is installed, Nsight Systems' count of the same range (`hostsync.profiling.nsys`).

    python gpu/loss_case_on_gpu.py pack                  # here: the trees into gpu/carry/
    python gpu/loss_case_on_gpu.py measure --out-dir D   # there: writes D/gpu-<time>.json

`pack` writes the case's pinned and fixed trees' `transformers` packages as archives into
gpu/carry/ (ignored, about 9 MB each: what a GPU machine is given beside the working tree).
`measure` reads them from there; its result goes into profiles/sp-loss/, where `review` cites it
as the source `gpu`. `--device cpu` is a dry run of the same steps on a CPU, host reads only.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from hostsync import provenance, results  # noqa: E402 (the workspace's engine, by path)
from hostsync.errors import WorkspaceError  # noqa: E402
from hostsync.launchers import ENGINE_SRC, NODE_FIELD, RUN_DIR_FIELD  # noqa: E402
from hostsync.layout import Layout  # noqa: E402
from hostsync.profiling import nsys  # noqa: E402
from hostsync.records import GpuResult, GpuTreeFigures, Stamp, TreeInfo  # noqa: E402

CASE = "sp-loss"
TREES_FILE = "trees.json"
PACKAGE = "transformers"
_TREE_TIMEOUT_S = 600


# --- here: the trees to carry --------------------------------------------------------------------


def pack(layout: Layout, names: list[str], carry: Path) -> list[Path]:
    """Each tree's package as `<label>.tar.gz` in `carry`, and what they are in trees.json."""
    from hostsync.upstream.trees import prepare_tree  # needs the workspace's tools: here only

    carry.mkdir(parents=True, exist_ok=True)
    infos, archives = {}, []
    for name in names:
        tree = prepare_tree(layout, name)
        archives.append(carry / f"{tree.label}.tar.gz")
        with tarfile.open(archives[-1], "w:gz") as archive:
            archive.add(tree.src / PACKAGE, PACKAGE, filter=_without_bytecode)
        infos[tree.label] = tree.info(layout.root).to_json()
    (carry / TREES_FILE).write_text(json.dumps(infos, indent=2) + "\n")
    return archives


def _without_bytecode(member: tarfile.TarInfo) -> tarfile.TarInfo | None:
    return None if "__pycache__" in member.name else member


# --- there: each tree measured in a process of its own -------------------------------------------


def measure(
    layout: Layout, carry: Path, device: str, warmup: int, steps: int, argv: list[str]
) -> GpuResult:
    """Every carried tree's steps; with nsys installed (and a GPU), Nsight Systems' too."""
    trees_file = carry / TREES_FILE
    if not trees_file.exists():
        raise WorkspaceError(f"no {trees_file}: run `python gpu/loss_case_on_gpu.py pack` first")
    infos = {
        label: TreeInfo.from_json(info)
        for label, info in json.loads(trees_file.read_text()).items()
    }
    measured_against = provenance.inputs(layout)
    use_nsys = device == "cuda" and shutil.which("nsys") is not None
    found, seen = [], {}
    with tempfile.TemporaryDirectory(prefix="gpu-trees-") as scratch:
        for label, info in infos.items():
            src = Path(scratch) / label
            with tarfile.open(carry / f"{label}.tar.gz") as archive:
                archive.extractall(src, filter="data")
            seen = run_tree(src, Path(scratch), label, device, warmup, steps, "torch")
            nsys_figures = None
            if use_nsys:
                nsys_figures = nsys_steps(src, Path(scratch), label, device, warmup, steps)
            found.append(
                GpuTreeFigures(
                    tree=label,
                    version=info.version,
                    host_reads=seen["host_reads"],
                    dtoh_copies=seen["dtoh_copies"],
                    dtoh_bytes=seen["dtoh_bytes"],
                    cuda_calls=seen["cuda_calls"],
                    sync_warnings=seen["sync_warnings"],
                    nsys=nsys_figures,
                )
            )
    command = shlex.join(["python", "gpu/loss_case_on_gpu.py", *argv])
    return GpuResult(
        stamp=Stamp.now(command, layout.case, measured_against),
        device=seen["device"],
        torch=seen["torch"],
        dry_run=device != "cuda",
        warmup_steps=warmup,
        steps=steps,
        trees=infos,
        figures=tuple(found),
    )


def child_command(
    src: Path, folder: Path, device: str, warmup: int, steps: int, profiler: str
) -> list[str]:
    return [
        sys.executable,
        __file__,
        "steps",
        "--src",
        str(src),
        "--folder",
        str(folder),
        "--device",
        device,
        "--warmup",
        str(warmup),
        "--steps",
        str(steps),
        "--profiler",
        profiler,
    ]


def run_tree(
    src: Path,
    scratch: Path,
    label: str,
    device: str,
    warmup: int,
    steps: int,
    profiler: str,
    wrap: list[str] | None = None,
) -> dict:
    """One tree's steps in a process of its own, the tree first on its path; what it saw."""
    folder = scratch / f"{label}-{profiler}"
    folder.mkdir()
    env = os.environ | nsys.ENV | {"PYTHONPATH": os.pathsep.join([str(src), str(ENGINE_SRC)])}
    command = [*(wrap or []), *child_command(src, folder, device, warmup, steps, profiler)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=_TREE_TIMEOUT_S)
    if done.returncode != 0:
        raise WorkspaceError(f"{label}: the steps failed ({done.stderr.strip()[-2000:]})")
    return json.loads((folder / "seen.json").read_text())


def nsys_steps(src: Path, scratch: Path, label: str, device: str, warmup: int, steps: int):
    """The same steps under Nsight Systems, and its figures of the measured ranges."""
    session = nsys.new_session()
    folder = scratch / f"{label}-nsys"
    wrap = [
        word.replace(RUN_DIR_FIELD, str(folder)).replace(NODE_FIELD, "0")
        for word in nsys.profile_command(session)
    ]
    try:
        run_tree(src, scratch, label, device, warmup, steps, "nsys", wrap)
    finally:
        nsys.end_agents(session)
    tables = nsys.tables()
    return nsys.figures(
        [nsys.run_stats(report, tables) for report in nsys.reports_in(folder)], tables
    )


# --- the steps, in the tree's own process --------------------------------------------------------


def steps_main(args: argparse.Namespace) -> None:
    """The snippet's call, warmed up, then measured: the figures into `seen.json`."""
    import types
    import warnings

    import torch
    import torch.distributed as dist
    import torch.distributed.nn  # the function under test uses it; importing Trainer loads it
    import transformers
    from torch.distributed.device_mesh import init_device_mesh
    from transformers.integrations.deepspeed import deepspeed_sp_compute_loss

    from hostsync.profiling.traces import analyse_trace, combine_ranks, load_trace
    from hostsync.rank.protocol import MEASURED_RANGE, SYNC_OP
    from hostsync.rank.rankkit import named_range, recording

    if Path(args.src).resolve() not in Path(transformers.__file__).resolve().parents:
        raise RuntimeError(f"transformers came from {transformers.__file__}, not {args.src}")
    device, cuda, nvtx = args.device, args.device == "cuda", args.profiler == "nsys"
    dist.init_process_group(
        "nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1
    )
    mesh = init_device_mesh(device, (1,), mesh_dim_names=("sp",))  # the SP group, from the mesh
    accelerator = types.SimpleNamespace(torch_device_mesh=mesh)
    pc = types.SimpleNamespace(sp_backend="deepspeed", sp_size=1)
    labels = torch.tensor([[5, 7, -100, 9]], device=device)

    def step() -> None:
        loss = torch.tensor(2.5, device=device, requires_grad=True)  # the forward's output
        outputs = types.SimpleNamespace(loss=loss)
        with named_range(MEASURED_RANGE, nvtx):
            total = deepspeed_sp_compute_loss(
                accelerator, lambda **_: outputs, {"shift_labels": labels}, False, pc
            )
        total.backward()

    for _ in range(args.warmup):
        step()
    trace = Path(args.folder) / "trace.json.gz"
    with recording(args.profiler, cuda, trace if args.profiler == "torch" else None):
        for _ in range(args.steps):
            step()
    seen = {"device": torch.cuda.get_device_name(0) if cuda else "cpu", "torch": torch.__version__}
    if args.profiler == "torch":
        figures = combine_ranks([analyse_trace(load_trace(trace))])
        seen |= {
            "host_reads": figures.ops[SYNC_OP],
            "dtoh_copies": figures.dtoh_copies,
            "dtoh_bytes": figures.dtoh_bytes,
            "cuda_calls": figures.cuda_calls,
            "sync_warnings": None,
        }
    if cuda:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            torch.cuda.set_sync_debug_mode("warn")
            for _ in range(args.steps):
                step()
            torch.cuda.set_sync_debug_mode(0)
        said = [w for w in caught if "synchroniz" in str(w.message)]
        seen["sync_warnings"] = len(said) / args.steps
    dist.destroy_process_group()
    (Path(args.folder) / "seen.json").write_text(json.dumps(seen, indent=2) + "\n")


# --- command line --------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    packing = commands.add_parser("pack", help="the trees into gpu/carry/ (here)")
    packing.add_argument("--trees", default="pinned,fixed", help="default: %(default)s")
    measuring = commands.add_parser("measure", help="each carried tree's steps (on the GPU)")
    measuring.add_argument("--out-dir", type=Path, required=True, help="where the result goes")
    steps = commands.add_parser("steps", help="one tree's steps (what `measure` runs)")
    steps.add_argument("--src", required=True)
    steps.add_argument("--folder", required=True)
    steps.add_argument("--profiler", choices=("torch", "nsys"), default="torch")
    for command in (measuring, steps):
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
    layout = Layout().for_case(CASE)
    carry = layout.root / "gpu" / "carry"
    if args.command == "steps":
        steps_main(args)
    elif args.command == "pack":
        for archive in pack(layout, args.trees.split(","), carry):
            print(f"wrote {archive} ({archive.stat().st_size >> 20} MiB)")
    else:
        result = measure(layout, carry, args.device, args.warmup, args.steps, argv)
        for tree in result.figures:
            print(json.dumps(tree.to_json()))
        path = results.write(args.out_dir, result, keep_elsewhere=args.out_dir)
        print(f"wrote {path}: copy it into profiles/{CASE}/ for the drafts")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except WorkspaceError as error:
        sys.exit(f"error: {error}")
