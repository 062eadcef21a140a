"""`python -m hostsync env`: the interpreter the commands run in, built if needed; or the folder
of tools that run beside it."""

from __future__ import annotations

import argparse

from hostsync.commands.options import chosen_cases
from hostsync.upstream import tools
from hostsync.upstream.envs import python_for


def main(argv: list[str]) -> int:
    """Print the interpreter the commands run in: the environment of the default case's pinned
    release (pin.toml's own pins), built first if needed. With `--tools`, the folder those tools
    are installed in instead."""
    parser = argparse.ArgumentParser(
        prog="python -m hostsync env",
        description="Print the interpreter of the environment the workspace's commands run in.",
    )
    parser.add_argument(
        "--tools",
        nargs="+",
        metavar="REQUIREMENT",
        help="install these (`name==version`, without their dependencies) once into the download"
        " cache, for that interpreter's PYTHONPATH, and print their folder",
    )
    args = parser.parse_args(argv)
    (case,) = chosen_cases(None)
    if args.tools:
        print(tools.installed(case.layout, *args.tools, deps=False))
    else:
        print(python_for(case.layout, case.project, case.pin))
    return 0
