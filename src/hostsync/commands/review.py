"""`python -m hostsync review`: a case's upstream drafts, filled from its result files
(`hostsync.drafting.review`)."""

from __future__ import annotations

import argparse

from hostsync.commands.options import add_case, chosen_cases, each_case
from hostsync.drafting.review import review
from hostsync.workspace.cases import Case


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync review",
        description="Write a case's upstream drafts into issue_drafts/<case>/, from the latest"
        " repro, test_patch and profile results (and bisect, where there is one) only.",
    )
    add_case(parser)
    parser.add_argument(
        "--rerun",
        action="store_true",
        help="rerun the commands of stale results (pin.toml, the card, a patch or a script"
        " changed)",
    )
    parser.add_argument(
        "--refresh-reference",
        action="store_true",
        help="also make profiles/<case>/reference/ hold exactly the results the drafts cite",
    )
    args = parser.parse_args(argv)

    def one(case: Case) -> None:
        for path in review(case, rerun=args.rerun, refresh=args.refresh_reference):
            print(f"wrote {path.relative_to(case.root)}")

    return each_case(chosen_cases(args.case), one)
