"""`python -m hostsync profile`: before/after profiles of a case's measured code, tree by tree
(`hostsync.profiling`), settings read once, one profile per case."""

from __future__ import annotations

import argparse
import logging

from hostsync.commands.options import (
    ALL_CASES,
    add_case,
    add_device,
    add_nodes,
    add_timeout,
    chosen_cases,
    each_case,
    node_layout,
)
from hostsync.launch.nodes import SINGLE, NodeLayout, clear_stale
from hostsync.profiling.capture import ProfileSettings
from hostsync.profiling.run import profile_case
from hostsync.workspace import locks
from hostsync.workspace.cases import Case
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.values import comma_list

log = logging.getLogger(__name__)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync profile",
        description="Profile a case's measured code before and after, tree by tree: Nsight"
        " Systems where nsys and GPUs exist (or when asked for), the PyTorch profiler everywhere.",
    )
    add_case(parser)
    parser.add_argument("--trees", help="trees to profile, before first (default: the card's)")
    parser.add_argument("--scenario", help="one of the case's (default: the card's)")
    parser.add_argument("--warmup", type=int, default=2, help="unprofiled steps first (default: 2)")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps (default: 3)")
    add_device(parser)
    parser.add_argument(
        "--profiler",
        choices=("auto", "torch", "nsys"),
        default="auto",
        help="auto: nsys when it is on the PATH and the ranks have GPUs; nsys on a CPU records"
        " the measured ranges and no CUDA (needs libnvToolsExt)",
    )
    add_timeout(parser, "one profiled launch")
    add_nodes(parser)
    return parser


def settings_for(
    case: Case, args: argparse.Namespace, nodes: NodeLayout = SINGLE
) -> ProfileSettings | None:
    """The case's settings, checked before anything runs; None for a case without a profile
    under `--case all`."""
    if case.profile is None:
        if args.case == ALL_CASES:
            log.info("case %s has no [profile] in its card: not profiled", case.name)
            return None
        raise WorkspaceError(f"case {case.name} has no [profile] in its card: nothing to profile")
    scenario = args.scenario or case.profile.scenario
    if scenario not in case.scenarios:
        raise WorkspaceError(f"--scenario {scenario}: choose one of {', '.join(case.scenarios)}")
    names = tuple(comma_list(args.trees, "--trees") if args.trees else case.trees)
    nodes.per_node(case.profile.ranks, f"{case.name}'s profile")
    return ProfileSettings(
        case,
        names,
        scenario,
        args.warmup,
        args.steps,
        args.device,
        args.profiler,
        args.timeout,
        nodes,
    )


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        raise WorkspaceError("--warmup and --steps must be at least 1: the first step is slow")
    nodes = node_layout(args)
    chosen = [settings_for(case, args, nodes) for case in chosen_cases(args.case)]
    clear_stale(nodes)
    profiled = {settings.case.name: settings for settings in chosen if settings is not None}

    def one(case: Case) -> None:
        with locks.case(case.layout, nodes.rank):
            profile_case(profiled[case.name])

    return each_case([settings.case for settings in profiled.values()], one)
