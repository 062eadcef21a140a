"""`python -m hostsync repin`: a case's card moved to a newer release of its project."""

from __future__ import annotations

import argparse
import datetime
import logging
import subprocess
import sys

from hostsync.commands.options import add_case, chosen_cases, each_case
from hostsync.history import repin
from hostsync.workspace import locks
from hostsync.workspace.cases import Case
from hostsync.workspace.errors import WorkspaceError

log = logging.getLogger(__name__)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync repin",
        description="Move a case's [pin] to its project's newest release (sdist, sha256, tag);"
        " with --run, rerun its sessions and refresh its reference once its drafts pass.",
    )
    add_case(parser)
    parser.add_argument("--version", help="the release to pin (default: the newest on the index)")
    parser.add_argument(
        "--run",
        action="store_true",
        help="then rerun repro, test-patch, profile and bisect, and review --refresh-reference",
    )
    parser.add_argument("--remote", help="test-patch's --remote, for an sdist without tests/")
    parser.add_argument("--judge", action="store_true", help="bisect's --judge: run each release")
    args = parser.parse_args(argv)

    def one(case: Case) -> None:
        with locks.case(case.layout):
            target = repin.chosen(case, args.version)
            if target.version == case.pin.version:
                log.info("%s: pinned to %s already", case.name, case.pin.version)
                return
            moved = repin.repinned(case, target, datetime.date.today())
            aside = repin.apply(case, moved)
        log.info("%s: [pin] %s -> %s", case.name, moved.was, moved.now.version)
        if aside is not None:
            log.info("%s: its clone of %s is kept at %s", case.name, moved.was, aside)
        passed_on = {
            "test-patch": ["--remote", args.remote] if args.remote else [],
            "bisect": ["--judge"] if args.judge else [],
        }
        sessions = [
            [name, "--case", case.name, *passed_on.get(name, [])] for name in repin.SESSIONS
        ]
        sessions.append(["review", "--case", case.name, "--refresh-reference"])
        if not args.run:
            log.info(
                "%s: every result is stale; rerun %s",
                case.name,
                "; then ".join(f"`python -m hostsync {' '.join(words)}`" for words in sessions),
            )
            return
        for words in sessions:
            if subprocess.run([sys.executable, "-m", "hostsync", *words]).returncode:
                raise WorkspaceError(
                    f"`python -m hostsync {' '.join(words)}` failed for {case.name} on"
                    f" {moved.now.version}: see above; the card stays moved, rerun from there"
                )

    return each_case(chosen_cases(args.case), one)
