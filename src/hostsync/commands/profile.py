"""The `profile` command line: one profile per case, settings read once."""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from dataclasses import replace

from hostsync.commands.options import (
    ALL_CASES,
    add_case,
    add_device,
    add_nodes,
    add_timeout,
    chosen_cases,
    comma_list,
    node_layout,
)
from hostsync.launch import devices
from hostsync.launch.nodes import SINGLE, NodeLayout, clear_stale, node_0_first
from hostsync.measure import provenance
from hostsync.profiling.capture import ProfileSettings, capture_with_fallback, choose_profiler
from hostsync.profiling.report import publish, summary_table
from hostsync.upstream.trees import infos, prepare_trees
from hostsync.workspace import locks, table
from hostsync.workspace.cases import Case
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.records import ProfiledScenario, ProfileResult, RegionLabels
from hostsync.workspace.results import attachments

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


def profile_case(settings: ProfileSettings) -> None:
    case = settings.case
    layout = case.layout
    measured_against = provenance.inputs(layout)
    trees = node_0_first(
        settings.nodes,
        f"trees of {case.name}",
        settings.timeout,
        lambda: prepare_trees(case, list(settings.trees)),
    )
    device = devices.resolve_device(
        settings.device, settings.nodes.ranks_here(settings.ranks), trees[0].python
    )
    # What `auto` resolved to on this machine, for the captures.
    settings = replace(settings, device=device, profiler=choose_profiler(settings.profiler, device))
    notes = [
        f"{name}: not profiled, the series is empty (the patched tree would equal pinned)"
        for name in settings.trees
        if case.tree_name(name) not in {tree.label for tree in trees}
    ]
    staging = layout.new_run_dir("profile")
    (staging / "artifacts").mkdir()
    captures = [capture_with_fallback(layout, tree, staging, settings, notes) for tree in trees]
    if not settings.nodes.writes_results:
        shutil.rmtree(staging)
        print(f"node {settings.nodes.rank}: node 0 writes the profile", file=sys.stderr)
        return
    result = ProfileResult(
        stamp=provenance.stamp(layout, measured_against),
        environment=devices.describe(trees[0].python),
        trees=infos(layout, trees),
        setting=ProfiledScenario(settings.scenario, settings.ranks),
        labels=RegionLabels(case.profile.measured, case.profile.excluded),
        warmup_steps=settings.warmup,
        steps=settings.steps,
        notes=tuple(notes),
        captures=tuple(captures),
    )
    path = publish(layout, result, staging)
    shutil.rmtree(staging)
    table_headers, rows = summary_table(result)
    print(table.text(table_headers, rows))
    for note in notes:
        print(f"note: {note}")
    folder = attachments(path).relative_to(layout.root)
    print(f"wrote {path.relative_to(layout.root)} and {folder}/", file=sys.stderr)


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    if args.warmup < 1 or args.steps < 1:
        raise WorkspaceError("--warmup and --steps must be at least 1: the first step is slow")
    nodes = node_layout(args)
    chosen = [settings_for(case, args, nodes) for case in chosen_cases(args.case)]
    clear_stale(nodes)
    for settings in chosen:
        if settings is not None:
            with locks.case(settings.case.layout, nodes.rank):
                profile_case(settings)
    return 0
