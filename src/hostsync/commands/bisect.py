"""`python -m hostsync bisect`: since which release a site is there, and which commit
(`hostsync.history.bisect`), printed and written."""

from __future__ import annotations

import argparse
from pathlib import Path

from packaging.version import InvalidVersion, Version

from hostsync.commands.options import add_case, add_timeout, chosen_cases, each_case
from hostsync.detector.sites import AllowRule
from hostsync.history.bisect import (
    DEFAULT_TAG_FORMAT,
    BisectSettings,
    Reader,
    Target,
    bisect_sites,
    case_targets,
)
from hostsync.history.report import report
from hostsync.upstream.git import is_repository
from hostsync.workspace import locks, projects
from hostsync.workspace.cases import Case
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.layout import Layout


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hostsync bisect",
        description="Since which release, and until which, a case's sites (or one site named"
        " here) are in a project's releases on the package index; with --remote, the commit.",
    )
    add_case(parser)
    site = parser.add_argument_group("a site of no case")
    site.add_argument("--project", choices=sorted(projects.PROJECTS))
    site.add_argument(
        "--file",
        help="the site's file as a path suffix from the package's import"
        " root, e.g. deepspeed/runtime/zero/stage_1_and_2.py",
    )
    site.add_argument("--code", help="what the site's line holds, e.g. 'is_invalid_grad_norm('")
    site.add_argument("--function", help="the function the site lies in")
    parser.add_argument(
        "--since",
        metavar="VERSION",
        help="the oldest release searched of the case's project (or --project);"
        " a site in another project is searched through all its releases",
    )
    parser.add_argument("--until", metavar="VERSION", help="the newest release searched, likewise")
    parser.add_argument(
        "--anchor",
        metavar="VERSION",
        help="a release that carries the site, where the search starts (default:"
        " the case's pinned release, else the newest)",
    )
    parser.add_argument(
        "--remote",
        type=Path,
        metavar="PATH",
        help="a local clone or mirror of the project with its release tags:"
        " narrow each boundary to a commit and its pull request",
    )
    parser.add_argument(
        "--tag-format",
        metavar="FORMAT",
        help="the remote's release tags (default: as the case's pinned tag,"
        f" else {DEFAULT_TAG_FORMAT})",
    )
    parser.add_argument(
        "--judge",
        action="store_true",
        help="judge where the reads begin by running: the site under the detector"
        " on the boundary releases, each in an environment built for it"
        " (expensive: an environment each)",
    )
    parser.add_argument(
        "--tests",
        action="store_true",
        help="with --case, also run the case's tests on the boundary releases, as"
        " test-patch --release does (expensive: a tree each)",
    )
    add_timeout(parser, "one pytest run or probe (--judge)")
    return parser


def _version(text: str | None, option: str) -> str | None:
    if text is None:
        return None
    try:
        return str(Version(text))
    except InvalidVersion:
        raise WorkspaceError(f"{option} {text!r} is no version: use e.g. 0.19.0") from None


def settings_from(args: argparse.Namespace) -> BisectSettings:
    """The settings, every value checked before anything is downloaded."""
    if args.project and args.case:
        raise WorkspaceError("--case and --project name different things: give one of them")
    if args.project and not (args.file and (args.code or args.function)):
        raise WorkspaceError("--project needs --file and --code or --function: name the site")
    if not args.project and (args.file or args.code or args.function):
        raise WorkspaceError("--file, --code and --function name a site of --project: add it")
    if args.tests and not args.case:
        raise WorkspaceError("--tests runs a case's tests: add --case NAME")
    if args.remote and not is_repository(args.remote):
        raise WorkspaceError(
            f"--remote {args.remote} is no git repository: give a local clone or mirror of the"
            " project (`git clone --mirror URL`)"
        )
    if args.tag_format is not None and "{version}" not in args.tag_format:
        raise WorkspaceError(
            f"--tag-format {args.tag_format!r} has no {{version}}: e.g. v{{version}}"
        )
    return BisectSettings(
        since=_version(args.since, "--since"),
        until=_version(args.until, "--until"),
        anchor=_version(args.anchor, "--anchor"),
        remote=args.remote,
        tag_format=args.tag_format,
        judge=args.judge,
        tests=args.tests,
        timeout=args.timeout,
    )


def main(argv: list[str]) -> int:
    args = parser().parse_args(argv)
    settings = settings_from(args)
    if args.project:
        layout = Layout()
        site = AllowRule(
            args.file, "named on the command line", function=args.function, code=args.code
        )
        targets = [Target(site, projects.get(args.project), settings.anchor)]
        reader = Reader(layout, targets, targets[0].project, settings.since, settings.until)
        report(layout, layout.sites, bisect_sites(layout, reader, targets, settings, None))
        return 0

    def one(case: Case) -> None:
        layout = case.layout
        targets = case_targets(case, settings.anchor)
        reader = Reader(layout, targets, case.project, settings.since, settings.until)
        with locks.case(layout):
            made = bisect_sites(layout, reader, targets, settings, case)
        report(layout, layout.profiles, made)

    return each_case(chosen_cases(args.case), one)
