"""A hunt of a case: its trees prepared, with the fixes of the stacked cases on them. Each tree
is hunted in each setup, and one result is written with its report. Also the sites a newer
release adds, which `watch --hunt` is handed."""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from hostsync.detector.sites import AllowRule
from hostsync.hunt.measure import hunt_tree
from hostsync.hunt.records import HuntResult, HuntSetup
from hostsync.hunt.report import console_summary, write_reports
from hostsync.launch import devices, trainer_step
from hostsync.launch.nodes import SINGLE, NodeLayout, node_0_first
from hostsync.measure import provenance
from hostsync.sites.known import load_known_sites
from hostsync.sites.records import HuntSite
from hostsync.upstream.trees import Tree, by_project, prepare_stack, prepare_tree, prepare_trees
from hostsync.workspace import locks, results
from hostsync.workspace.cases import Case
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.projects import DeepSpeedSetup
from hostsync.workspace.records import TreeRole

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
    rules = load_known_sites(layout.known_sites).allow
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


def new_sites(
    home: Case,
    pinned: str,
    newest: str,
    carried: tuple[AllowRule, ...],
    *,
    setups: Sequence[DeepSpeedSetup],
    timeout: float,
) -> tuple[str, tuple[HuntSite, ...]]:
    """The sites the hunt finds in release `newest` and not in `pinned`, in each setup, and what
    was hunted. `home` is a case of the project, its trees' home; `carried` every case's sites."""
    layout = home.layout
    rules = load_known_sites(layout.known_sites).allow
    found: dict[tuple[str, str, str, str], HuntSite] = {}
    with locks.case(layout):
        trees = [prepare_tree(home, version) for version in (pinned, newest)]
        for setup in setups:
            before, after = (
                hunt_tree(layout, tree, DEFAULT_STEPS, rules, timeout, setup, carried)
                for tree in trees
            )
            failed = [tree for tree in (before, after) if not tree.measured]
            if failed:
                return f"{failed[0].label} could not be hunted: {failed[0].error}", ()
            known = {hunted.key for hunted in before.sites}
            found |= {
                hunted.key: hunted
                for hunted in after.sites
                if hunted.key not in known and hunted.allowed is None
            }
    labels = ", ".join(setup.label for setup in setups)
    said = f"hunted {pinned} and {newest} through the training step ({labels})"
    return said, tuple(found.values())
