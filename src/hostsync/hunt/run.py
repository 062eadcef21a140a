"""A hunt of a case: its trees prepared (with the fixes of the cases stacked on them), each
hunted in each setup, and one result written with its report."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from hostsync.detector.sites import AllowRule
from hostsync.hunt.allowlist import load_allowlist
from hostsync.hunt.measure import hunt_tree
from hostsync.hunt.report import console_summary, write_reports
from hostsync.launch import devices, trainer_step
from hostsync.launch.nodes import SINGLE, NodeLayout, node_0_first
from hostsync.measure import provenance
from hostsync.upstream.trees import Tree, by_project, prepare_stack, prepare_trees
from hostsync.workspace import locks, results
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
    """Hunt `case` with the fixes of `stack`, every case involved locked; the exit status (1
    when a tree could not be hunted)."""
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
