"""`python -m hostsync export-patches`: the clone's commits written back as the series."""

from __future__ import annotations

import argparse
import logging

from hostsync.commands.options import add_case, chosen_cases, each_case
from hostsync.upstream.patchqueue import export_patches
from hostsync.workspace import locks
from hostsync.workspace.cases import Case

log = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync export-patches",
        description="Write the commits of `patched` in a case's clone back into patches/<case>/.",
    )
    add_case(parser)
    parser.add_argument(
        "--force",
        action="store_true",
        help="replace patches/<case>/ with the clone's commits even where it holds patches or"
        " edits the clone does not (they are lost)",
    )
    args = parser.parse_args(argv)

    def one(case: Case) -> None:
        with locks.case(case.layout):
            report = export_patches(case, force=args.force)
        for change in ("added", "changed", "removed"):
            for name in report[change]:
                log.info("%s patches/%s/%s", change, case.name, name)
        if not any(report[change] for change in ("added", "changed", "removed")):
            log.info("patches/%s already matches the clone: nothing changed", case.name)

    return each_case(chosen_cases(args.case), one)
