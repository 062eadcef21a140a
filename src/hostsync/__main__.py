"""`python -m hostsync COMMAND [OPTIONS]`: what the nox sessions call.

Each command is a `main(argv) -> int` in its own module, imported only when asked for, so that
the commands that need no torch (env, clone, export-patches) run without it.
"""

from __future__ import annotations

import importlib
import logging
import signal
import sys
from collections.abc import Callable

from hostsync.workspace.errors import WorkspaceError

COMMANDS = {
    "clone": (
        "hostsync.commands.clone:main",
        "materialise the pinned tree, apply patches/",
    ),
    "export-patches": (
        "hostsync.commands.export_patches:main",
        "write the clone's commits to patches/",
    ),
    "env": (
        "hostsync.commands.env:main",
        "the environment the commands run in (built if needed)",
    ),
    "test-patch": (
        "hostsync.commands.test_patch:main",
        "the series' tests: red on pinned, green patched",
    ),
    "repro": (
        "hostsync.commands.repro:main",
        "a case's reproducer on real processes, tree by tree",
    ),
    "bench": (
        "hostsync.commands.bench:main",
        "time the reproducer cold and warm, and the detector cost",
    ),
    "hunt": (
        "hostsync.commands.hunt:main",
        "every host sync of a full SP Trainer step, tree by tree",
    ),
    "census": (
        "hostsync.commands.census:main",
        "every host sync of the training setups users run (census.toml)",
    ),
    "profile": (
        "hostsync.commands.profile:main",
        "before/after profiles of a case's measured code",
    ),
    "review": ("hostsync.commands.review:main", "a case's upstream drafts, from its result files"),
    "outbox": (
        "hostsync.commands.outbox:main",
        "what would be sent upstream, as the contributor's",
    ),
    "bisect": (
        "hostsync.commands.bisect:main",
        "since which release a site is there (and which commit)",
    ),
    "repin": (
        "hostsync.commands.repin:main",
        "move a case's card to its project's newest release, and rerun it",
    ),
    "watch": (
        "hostsync.commands.watch:main",
        "the newest releases against the pins and every case",
    ),
    "survey": (
        "hostsync.commands.survey:main",
        "a project's own tests without and with the pytest plugin: outcomes, cost, sites",
    ),
    "scan": (
        "hostsync.commands.scan:main",
        "the host syncs of your own training script, run unchanged",
    ),
}


def usage() -> str:
    lines = ["usage: python -m hostsync COMMAND [OPTIONS]", "", "commands:"]
    lines += [f"  {name:<16}{summary}" for name, (_, summary) in COMMANDS.items()]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] not in COMMANDS:
        print(usage(), file=sys.stderr)
        return 2
    target, _ = COMMANDS[argv[0]]
    module_name, function_name = target.split(":")
    module = importlib.import_module(module_name)
    command: Callable[[list[str]], int] = getattr(module, function_name)
    logging.basicConfig(level=logging.INFO, format="hostsync: %(message)s")
    # A kill is a Ctrl-C: the runs stop their process groups on the way out either way. Ctrl-C
    # itself is taken even where it was ignored when the command started (a job a script runs in
    # the background), which Python would otherwise keep.
    signal.signal(signal.SIGTERM, _interrupt)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        return command(argv[1:])
    except WorkspaceError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(
            "interrupted: every process it started was stopped, and no result was written",
            file=sys.stderr,
        )
        return 130


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


if __name__ == "__main__":
    sys.exit(main())
