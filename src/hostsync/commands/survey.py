"""`python -m hostsync survey`: a project's own tests without and with the pytest plugin
(`hostsync.measure.survey`), the result written and its differences refused."""

from __future__ import annotations

import argparse
import shlex
import sys

from hostsync.commands.options import add_timeout, positive_count
from hostsync.detector.words import counted
from hostsync.measure.records import SurveyResult
from hostsync.measure.survey import (
    FILE,
    ROUNDS,
    SURVEY,
    load_spec,
    release_tree,
    render,
    summary,
    survey,
)
from hostsync.workspace import results
from hostsync.workspace.layout import Layout


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync survey",
        description="Run a slice of a project's own tests without the pytest plugin, in report"
        " mode and gated by the baseline the report wrote: same outcomes (asserted), the"
        " plugin's cost as median ratios over interleaved rounds, the top sites.",
    )
    parser.add_argument("--project", required=True, help=f"a project of {FILE}")
    parser.add_argument(
        "--tests",
        metavar="ARGS",
        help="the pytest arguments that choose the tests, from the sdist's root, as one string:"
        f" 'tests/test_x.py -k lora' (default: the slice of {FILE})",
    )
    parser.add_argument(
        "--rounds",
        type=positive_count,
        default=ROUNDS,
        metavar="N",
        help="rounds of interleaved runs (off, report, gate), the ratios being their medians"
        " (default: %(default)s)",
    )
    add_timeout(parser, "one run of the slice")
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    layout = Layout(case=SURVEY)
    spec = load_spec(layout.root, args.project)
    tree = release_tree(layout, args.project, spec)
    tests = tuple(shlex.split(args.tests)) if args.tests else spec.tests
    result = survey(layout, tree, spec, tests, args.timeout, args.rounds)
    json_path = results.write(layout.profiles, result, keep_elsewhere=layout.unsaved)
    for path in [json_path, *results.write_markdown(json_path, SurveyResult, render)]:
        print(f"wrote {path.relative_to(layout.root)}", file=sys.stderr)
    print(summary(result))
    if result.differences:
        print(
            f"error: the plugin changed {counted(len(result.differences), 'outcome')}:"
            f" {'; '.join(result.differences[:5])}",
            file=sys.stderr,
        )
        return 1
    return 0
