"""`python -m hostsync test-patch`: the red/green proof of each case's series
(`hostsync.measure.test_patch`), printed and written."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from hostsync.commands.options import add_case, add_timeout, chosen_cases, each_case
from hostsync.measure.test_patch import prove_and_report
from hostsync.upstream.git import is_repository
from hostsync.upstream.releases import release_for
from hostsync.workspace import locks
from hostsync.workspace.cases import Case
from hostsync.workspace.errors import WorkspaceError


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync test-patch",
        description="A case's series tests red on the pinned release, green on the patched tree"
        " and on upstream's fixed release; upstream's nearby tests; the project's linters.",
    )
    add_case(parser)
    parser.add_argument(
        "--release",
        dest="releases",
        action="append",
        default=[],
        metavar="VERSION",
        help="also try the series on this release of the case's project (repeatable): does it"
        " apply, how do its tests go",
    )
    parser.add_argument(
        "--remote",
        type=Path,
        metavar="PATH",
        help="a git repository of the case's project (a local clone or mirror): trees made from"
        " the PyPI sdist, which ships no tests/, get its tests/ (at the pinned tag where it has"
        " it, else at its newest commit) before the series' test patches apply",
    )
    add_timeout(parser, "one pytest run")
    args = parser.parse_args(argv)
    for version in args.releases:
        if not re.fullmatch(r"\d+\.\d+\.\d+(?:(?:a|b|rc)\d+)?", version):
            raise WorkspaceError(f"--release {version!r} is no release number: use e.g. 5.12.0")
    if args.remote and not is_repository(args.remote):
        raise WorkspaceError(
            f"--remote {args.remote} is no git repository: give a local clone or mirror of the"
            " project (its git directory)"
        )
    chosen = chosen_cases(args.case)
    for case in chosen:  # before anything runs: a release PyPI does not have is refused now
        for version in args.releases:
            release_for(case, version)

    def one(case: Case) -> int:
        print(f"case {case.name}")
        with locks.case(case.layout):
            return prove_and_report(case, args.releases, args.timeout, remote=args.remote)[0]

    return each_case(chosen, one)
