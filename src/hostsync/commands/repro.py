"""`python -m hostsync repro`: a case's reproducer on real processes, tree by tree
(`hostsync.measure.repro`), its table printed and its result written."""

from __future__ import annotations

import argparse
import sys

from hostsync.commands.options import (
    add_case,
    add_device,
    add_nodes,
    add_timeout,
    chosen_cases,
    each_case,
    node_layout,
)
from hostsync.launch.nodes import clear_stale
from hostsync.measure.report import report
from hostsync.measure.repro import ReproSettings, repro_case
from hostsync.workspace import locks, results
from hostsync.workspace.cases import Case
from hostsync.workspace.values import comma_list


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync repro",
        description="Run a case's reproducer on real processes, tree by tree: host syncs by"
        " source line, and the figures that show the fix changes nothing else.",
    )
    add_case(parser)
    parser.add_argument(
        "--trees",
        help="pinned, patched, fixed (upstream's fixed release), a release like 5.14.0,"
        " NAME+tests, NAME+series (default: the case card's)",
    )
    parser.add_argument("--scenarios", help="comma-separated (default: all of the case's)")
    parser.add_argument(
        "--ranks", help="only these process counts of the card's, e.g. 2 (default: all of them)"
    )
    add_device(parser)
    add_timeout(parser, "one run")
    add_nodes(parser)
    parser.add_argument(
        "--trainer",
        action="store_true",
        help="also the full Trainer path (transformers trees): accelerate launch + DeepSpeed ZeRO"
        " 1 + Ulysses SP, two steps per tree, each step's loss against the same training without"
        " SP",
    )
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    settings = ReproSettings(
        trees=tuple(comma_list(args.trees, "--trees")) if args.trees else None,
        scenarios=args.scenarios,
        ranks=args.ranks,
        device=args.device,
        timeout=args.timeout,
        trainer=args.trainer,
        nodes=node_layout(args),
    )
    clear_stale(settings.nodes)

    def one(case: Case) -> None:
        layout = case.layout
        with locks.case(layout, settings.nodes.rank):
            result = repro_case(case, settings)
            print(f"case {case.name}: {case.title}")
            print(report(case, result))
            if not settings.nodes.writes_results:
                print(f"node {settings.nodes.rank}: node 0 writes the result", file=sys.stderr)
                return
            path = results.write(layout.profiles, result, keep_elsewhere=layout.unsaved)
        print(f"wrote {path.relative_to(layout.root)}", file=sys.stderr)

    return each_case(chosen_cases(args.case), one)
