"""`python -m hostsync env`: the interpreter the commands run in, built if needed."""

from __future__ import annotations

import argparse

from hostsync.commands.options import chosen_cases
from hostsync.upstream.envs import python_for


def main(argv: list[str]) -> int:
    """Print the interpreter the commands run in: the environment of the default case's pinned
    release (pin.toml's own pins), built first if needed."""
    argparse.ArgumentParser(
        prog="python -m hostsync env",
        description="Print the interpreter of the environment the workspace's commands run in.",
    ).parse_args(argv)
    (case,) = chosen_cases(None)
    print(python_for(case.layout, case.project, case.pin))
    return 0
