"""`python -m hostsync outbox`: what would be sent upstream for a case, as its contributor's
(`hostsync.drafting.outbox`)."""

from __future__ import annotations

import argparse

from hostsync.commands.options import add_case, chosen_cases, each_case
from hostsync.drafting.outbox import outbox
from hostsync.workspace import locks
from hostsync.workspace.cases import Case


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync outbox",
        description="Write what would be sent upstream for a case into issue_drafts/<case>/outbox/:"
        " its drafts, its patches as the contributor's commits, the files to attach, and what"
        " only the contributor can do; or nothing-to-send.md, saying why.",
    )
    add_case(parser)
    args = parser.parse_args(argv)

    def one(case: Case) -> None:
        with locks.case(case.layout):
            target = outbox(case)
        for path in sorted(target.rglob("*")):
            if path.is_file():
                print(f"wrote {path.relative_to(case.root)}")

    return each_case(chosen_cases(args.case), one)
