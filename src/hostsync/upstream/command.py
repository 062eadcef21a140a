"""`python -m hostsync clone`, `export-patches` and `env`: the commands that need no torch."""

from __future__ import annotations

import argparse
import logging

from hostsync import locks
from hostsync.options import add_case, chosen_cases
from hostsync.upstream.envs import python_for
from hostsync.upstream.patchqueue import clone, export_patches

log = logging.getLogger(__name__)


def clone_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync clone",
        description="Materialise a case's pinned release in work/clones/<case>, apply its patches.",
    )
    add_case(parser)
    parser.add_argument("--remote", help="git remote to clone from (default: the project's)")
    args = parser.parse_args(argv)
    for case in chosen_cases(args.case):
        with locks.case(case.layout):
            said = clone(case, remote=args.remote)
        log.info("%s: %s", case.name, said or "the clone matches the patches: nothing to do")
    return 0


def export_main(argv: list[str]) -> int:
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
    for case in chosen_cases(args.case):
        with locks.case(case.layout):
            report = export_patches(case, force=args.force)
        for change in ("added", "changed", "removed"):
            for name in report[change]:
                log.info("%s patches/%s/%s", change, case.name, name)
        if not any(report[change] for change in ("added", "changed", "removed")):
            log.info("patches/%s already matches the clone: nothing changed", case.name)
    return 0


def env_main(argv: list[str]) -> int:
    """Print the interpreter the commands run in: the environment of the default case's pinned
    release (pin.toml's own pins), built first if needed."""
    argparse.ArgumentParser(
        prog="python -m hostsync env",
        description="Print the interpreter of the environment the workspace's commands run in.",
    ).parse_args(argv)
    (case,) = chosen_cases(None)
    print(python_for(case.layout, case.project, case.pin))
    return 0
