"""`python -m hostsync watch`: the newest releases against the pins and every case
(`hostsync.history.watch`), its digest printed and written."""

from __future__ import annotations

import argparse
import functools

from hostsync.commands.options import add_timeout
from hostsync.history.records import WatchResult
from hostsync.history.report import digest
from hostsync.history.watch import WatchSettings, watch
from hostsync.hunt.run import new_sites
from hostsync.workspace import results
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import DeepSpeedSetup
from hostsync.workspace.values import comma_list

# A small set: one hunt per setup and tree is a full training run.
DEFAULT_HUNT_SETUPS = ("bf16-zero1",)


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync watch",
        description="The newest release of each project on the package index against the pins:"
        " each case's sites there, whether its series applies, and (asked) its tests and the"
        " hunt's new sites. Writes a short Markdown digest.",
    )
    parser.add_argument(
        "--tests",
        action="store_true",
        help="also run each case's tests on its project's newest release, and its"
        " sites there under the detector, as test-patch --release does (a tree"
        " and an environment each)",
    )
    parser.add_argument(
        "--hunt",
        action="store_true",
        help="also hunt each project's pinned and newest release through the"
        " training step and list the sites new in the newest (expensive)",
    )
    parser.add_argument(
        "--setups",
        default=",".join(DEFAULT_HUNT_SETUPS),
        help="the DeepSpeed setups --hunt runs (default: %(default)s)",
    )
    add_timeout(parser, "one pytest or training run")
    return parser


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    setups = tuple(DeepSpeedSetup.parse(text) for text in comma_list(args.setups, "--setups"))
    if args.setups != ",".join(DEFAULT_HUNT_SETUPS) and not args.hunt:
        raise WorkspaceError("--setups chooses what --hunt runs: add --hunt")
    layout = Layout()
    hunt = functools.partial(new_sites, setups=setups, timeout=args.timeout) if args.hunt else None
    result = watch(layout, WatchSettings(args.tests, args.timeout, hunt))
    path = results.write(layout.watch, result, keep_elsewhere=layout.unsaved)
    markdown = results.write_markdown(
        path, WatchResult, lambda made, at: digest(made, str(at.relative_to(layout.root)))
    )
    print(digest(result, str(path.relative_to(layout.root))), end="")
    for written in [path, *markdown]:
        print(f"wrote {written.relative_to(layout.root)}")
    return 0
