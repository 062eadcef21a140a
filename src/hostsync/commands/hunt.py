"""The `hunt` command line: settings read once, one hunt result per case."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from hostsync.commands.options import (
    add_case,
    add_nodes,
    add_timeout,
    chosen_cases,
    comma_list,
    node_layout,
)
from hostsync.detector.sites import AllowRule
from hostsync.hunt.allowlist import carried_rules, load_allowlist
from hostsync.hunt.measure import LOGGING_STEPS, hunt_plan, hunt_tree
from hostsync.hunt.report import console_summary, write_reports
from hostsync.launch import devices, trainer_step
from hostsync.launch.nodes import SINGLE, NodeLayout, clear_stale, node_0_first
from hostsync.measure import provenance
from hostsync.upstream.trees import Tree, by_project, prepare_stack, prepare_trees
from hostsync.workspace import cases, locks, results
from hostsync.workspace.cases import Case
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.projects import DeepSpeedSetup
from hostsync.workspace.records import HuntResult, HuntSetup, TreeRole

DEFAULT_TREES = (TreeRole.PINNED.value, TreeRole.PATCHED.value)
DEFAULT_STEPS = 7
# What users run: bf16 mixed precision in every ZeRO stage (fp32 is a labelled variant).
DEFAULT_SETUPS = ("bf16-zero1", "bf16-zero2", "bf16-zero3")


@dataclass(frozen=True)
class HuntSettings:
    """What `hunt` was asked, read once from the command line."""

    trees: tuple[str, ...]
    steps: int
    setups: tuple[DeepSpeedSetup, ...]
    stack: tuple[str, ...]
    timeout: float
    nodes: NodeLayout = SINGLE


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync hunt",
        description="Record every host sync of a full accelerate + Trainer + DeepSpeed Ulysses"
        " training step on 2 ranks, per tree, and compare the trees.",
    )
    add_case(parser)
    parser.add_argument(
        "--trees",
        default=",".join(DEFAULT_TREES),
        help="pinned, patched, a release like 5.14.0, NAME+tests, NAME+series"
        " (default: %(default)s)",
    )
    parser.add_argument(
        "--release",
        dest="releases",
        action="append",
        default=[],
        metavar="VERSION",
        help="also hunt this release of the case's project as published on PyPI"
        " (repeatable), e.g. the newest",
    )
    parser.add_argument(
        "--steps",
        type=int,
        default=DEFAULT_STEPS,
        help="steps under the detector, the first being the warm-up (default: %(default)s)",
    )
    parser.add_argument(
        "--setups",
        default=",".join(DEFAULT_SETUPS),
        help="DeepSpeed setups, PRECISION-zeroSTAGE each, one run per tree"
        " and setup (default: %(default)s; fp32-zero1: the labelled variant)",
    )
    parser.add_argument(
        "--stack",
        action="append",
        default=[],
        metavar="CASE",
        help="also apply this case's series: on the patched tree when it is of"
        " the same project and release, else on a tree of its own imported"
        " beside every tree; a hunt with every carried fix (repeatable)",
    )
    add_timeout(parser, "one training run")
    add_nodes(parser)
    return parser


def settings_from(args: argparse.Namespace) -> HuntSettings:
    """The settings, every value checked before anything is downloaded or run."""
    hunt_plan(args.steps, LOGGING_STEPS)
    nodes = node_layout(args)
    nodes.per_node(trainer_step.SP_SIZE, "the hunt's Trainer run")
    return HuntSettings(
        trees=tuple(dict.fromkeys(comma_list(args.trees, "--trees") + args.releases)),
        steps=args.steps,
        setups=tuple(DeepSpeedSetup.parse(text) for text in comma_list(args.setups, "--setups")),
        stack=tuple(args.stack),
        timeout=args.timeout,
        nodes=nodes,
    )


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    settings = settings_from(args)
    clear_stale(settings.nodes)
    chosen = chosen_cases(args.case)
    everyone = cases.every(chosen[0].root, chosen)
    stack = cases.named(everyone, settings.stack, chosen[0].root)
    carried = carried_rules(everyone)
    status = 0
    for case in chosen:
        status = max(status, hunt_case(case, stack, carried, settings))
    return status


def stacked(case: Case, tree: Tree, stack: Sequence[Case]) -> Tree:
    """`tree` with the fixes of the cases `stack`: the series of those of its own project
    applied on the patched tree after the case's own (one release, several series), the
    other projects' cases as one tree per project imported beside every tree."""
    own = [other for other in stack if other.project == tree.project]
    others = [other for other in stack if other not in own]
    layout = case.layout
    if own and tree.role == TreeRole.PATCHED:
        both = prepare_stack(layout, [case, *own])
        tree = dataclasses.replace(both, label=tree.label)
    beside = [prepare_stack(layout, group, runs=False) for group in by_project(others)]
    return dataclasses.replace(tree, stacked=tuple(other.src for other in beside))


def check_stack(case: Case, stack: Sequence[Case], settings: HuntSettings) -> None:
    """A case of the hunted case's project stacks on the patched tree: refuse a hunt without it
    rather than apply nothing."""
    same = [other.name for other in stack if other.project == case.project]
    if same and "patched" not in settings.trees:
        raise WorkspaceError(
            f"--stack {', '.join(same)}: a case of {case.project.name} is applied on the patched"
            " tree, which --trees leaves out: add patched to --trees"
        )


def hunt_case(
    case: Case, stack: Sequence[Case], carried: tuple[AllowRule, ...], settings: HuntSettings
) -> int:
    check_stack(case, stack, settings)
    with contextlib.ExitStack() as held:
        for each in (case, *stack):
            held.enter_context(locks.case(each.layout, settings.nodes.rank))
        return _hunt(case, stack, carried, settings)


def _hunt(
    case: Case, stack: Sequence[Case], carried: tuple[AllowRule, ...], settings: HuntSettings
) -> int:
    layout = case.layout
    rules = load_allowlist(layout.allowlist).allow
    measured_against = provenance.inputs(layout)

    def prepared() -> list[Tree]:
        found = prepare_trees(case, list(settings.trees))
        return [stacked(case, tree, stack) for tree in found]

    trees = node_0_first(settings.nodes, f"trees of {layout.case}", settings.timeout, prepared)
    hunted = [
        hunt_tree(
            layout, tree, settings.steps, rules, settings.timeout, setup, carried, settings.nodes
        )
        for tree in trees
        for setup in settings.setups
    ]
    failed = [tree for tree in hunted if not tree.measured]
    for tree in failed:
        print(f"error: {tree.label}: {tree.error}", file=sys.stderr)
    if len(failed) == len(hunted):
        raise WorkspaceError("no tree could be hunted: see the errors above")
    if not settings.nodes.writes_results:
        print(f"node {settings.nodes.rank}: node 0 writes the hunt", file=sys.stderr)
        return 1 if failed else 0
    ranks = next(tree.ranks for tree in hunted if tree.measured)
    environment = devices.describe(trees[0].python)
    result = HuntResult(
        stamp=provenance.stamp(layout, measured_against),
        setup=HuntSetup(
            world_size=len(ranks),
            sp_size=trainer_step.SP_SIZE,
            model=ranks[0].model,
            device=ranks[0].device,
            backend=ranks[0].backend,
            versions=environment.versions,
        ),
        allowlist=rules,
        trees=tuple(hunted),
    )
    json_path = results.write(layout.profiles, result, keep_elsewhere=layout.unsaved)
    print(console_summary(result.measured))
    for path in [json_path, *write_reports(layout, json_path)]:
        print(f"wrote {path.relative_to(layout.root)}", file=sys.stderr)
    return 1 if failed else 0
