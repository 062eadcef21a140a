"""`python -m hostsync hunt`: every host sync of a full SP Trainer step, tree by tree
(`hostsync.hunt`), settings read once, one hunt result per case."""

from __future__ import annotations

import argparse

from hostsync.commands.options import add_case, add_nodes, add_timeout, chosen_cases, node_layout
from hostsync.hunt.measure import LOGGING_STEPS, hunt_plan
from hostsync.hunt.run import DEFAULT_SETUPS, DEFAULT_STEPS, DEFAULT_TREES, HuntSettings, hunt_case
from hostsync.launch import trainer_step
from hostsync.launch.nodes import clear_stale
from hostsync.sites.known import carried_rules
from hostsync.workspace import cases
from hostsync.workspace.projects import DeepSpeedSetup
from hostsync.workspace.values import comma_list


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
