"""`python -m hostsync clone`: a case's pinned release as a git repository, its series applied."""

from __future__ import annotations

import argparse
import logging

from hostsync.commands.options import add_case, chosen_cases, each_case
from hostsync.upstream.patchqueue import clone
from hostsync.workspace import locks
from hostsync.workspace.cases import Case

log = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync clone",
        description="Materialise a case's pinned release in work/clones/<case>, apply its patches.",
    )
    add_case(parser)
    parser.add_argument("--remote", help="git remote to clone from (default: the project's)")
    args = parser.parse_args(argv)

    def one(case: Case) -> None:
        with locks.case(case.layout):
            said = clone(case, remote=args.remote)
        log.info("%s: %s", case.name, said or "the clone matches the patches: nothing to do")

    return each_case(chosen_cases(args.case), one)
