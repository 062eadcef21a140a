"""Command-line values several commands take, parsed the same way everywhere."""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

from hostsync.launch import launchers, nodes
from hostsync.launch.processes import DEFAULT_TIMEOUT_S
from hostsync.workspace import cases
from hostsync.workspace.cases import Case
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.pin import load as load_pin

ALL_CASES = "all"


def add_case(parser: argparse.ArgumentParser) -> None:
    """`--case NAME` (default: pin.toml's `default_case`), or `--case all`."""
    parser.add_argument(
        "--case",
        metavar="NAME",
        help=f"a case of cases/ by name, or {ALL_CASES!r} (default: pin.toml's default_case)",
    )


def chosen_cases(name: str | None, layout: Layout | None = None) -> list[Case]:
    """Each case `--case` names, its card read and checked (its launches against the launchers
    too) before anything runs: the one load of the card the command makes."""
    layout = layout or Layout()
    if name == ALL_CASES:
        names = cases.names(layout.root)
    elif name is None:
        names = [load_pin(layout.pin_file).default_case]
    else:
        names = [name]
    loaded = [cases.load(layout.root, each) for each in names]
    for case in loaded:
        launchers.check_launches(case)
    return loaded


def each_case(chosen: Sequence[Case], do: Callable[[Case], int | None]) -> int:
    """`do` for each case in turn; with several (`--case all`), one case's refusal is said in one
    line and the others still run. The status is the worst: 2 where a case was refused."""
    status, refused = 0, []
    for case in chosen:
        try:
            status = max(status, do(case) or 0)
        except WorkspaceError as error:
            if len(chosen) == 1:
                raise
            print(f"error: case {case.name}: {error}", file=sys.stderr)
            refused.append(case.name)
    if refused:
        print(f"error: not done for {', '.join(refused)} (each said why above)", file=sys.stderr)
        return max(status, 2)
    return status


def add_device(parser: argparse.ArgumentParser) -> None:
    """`--device`, resolved later by `devices.resolve_device`."""
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="cuda: NCCL, one GPU per rank; auto: cuda when every rank gets a GPU, else cpu (gloo)",
    )


# A run allowed longer than this is hung, however slow the machine.
MAX_TIMEOUT_S = 86400.0


def positive_count(text: str) -> int:
    """A whole number of at least 1 (rounds, runs)."""
    try:
        count = int(text)
    except ValueError:
        count = 0
    if count < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is no whole number of at least 1")
    return count


def positive_seconds(text: str) -> float:
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0 or not math.isfinite(seconds):
        raise argparse.ArgumentTypeError(f"{text!r} is no positive number of seconds")
    if seconds > MAX_TIMEOUT_S:
        raise argparse.ArgumentTypeError(
            f"{text} s is over a day ({MAX_TIMEOUT_S:.0f} s): no run here takes that long"
        )
    return seconds


def add_timeout(parser: argparse.ArgumentParser, run: str) -> None:
    """`--timeout`: how long one `run` may take before it counts as hung and is killed."""
    parser.add_argument(
        "--timeout",
        type=positive_seconds,
        default=DEFAULT_TIMEOUT_S,
        metavar="SECONDS",
        help=f"seconds before {run} counts as hung and is killed (default: %(default)s)",
    )


def add_nodes(parser: argparse.ArgumentParser) -> None:
    """Where this node stands in a run across nodes (default: SLURM's variables, or one node);
    torchrun's spellings with `_` are taken too."""
    group = parser.add_argument_group(
        "across nodes (torchrun's c10d rendezvous; default: SLURM_NNODES, SLURM_NODEID and the"
        " first host of SLURM_JOB_NODELIST when set)"
    )
    group.add_argument(
        "--nnodes",
        type=int,
        metavar="N",
        help="nodes the ranks span; without --rdzv-endpoint every node's agent"
        " starts on this machine",
    )
    group.add_argument(
        "--node-rank", "--node_rank", type=int, metavar="R", help="this node (0 writes the result)"
    )
    group.add_argument(
        "--rdzv-endpoint",
        "--rdzv_endpoint",
        metavar="HOST:PORT",
        help=f"node 0's rendezvous (under SLURM: its first host, port MASTER_PORT"
        f" or {nodes.DEFAULT_PORT})",
    )
    group.add_argument(
        "--node-results",
        type=Path,
        metavar="DIR",
        help="a folder every node reads, where they pool their ranks' results"
        " (default: the workspace's work/nodes/)",
    )


def node_layout(args: argparse.Namespace, layout: Layout | None = None) -> nodes.NodeLayout:
    """The node layout `add_nodes`' options (or SLURM) give, read once per command."""
    layout = layout or Layout()
    return nodes.from_options(
        args.nnodes, args.node_rank, args.rdzv_endpoint, args.node_results, layout.work / "nodes"
    )
