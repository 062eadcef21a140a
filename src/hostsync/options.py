"""Command-line values several commands take, parsed the same way everywhere."""

from __future__ import annotations

import argparse

from hostsync.errors import WorkspaceError


def comma_list(text: str, option: str) -> list[str]:
    """`--trees pinned,patched` and the like: the items, refusing an empty list."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise WorkspaceError(f"empty {option} list: give comma-separated values")
    return items


def add_device(parser: argparse.ArgumentParser) -> None:
    """`--device`, resolved later by `environment.resolve_device`."""
    parser.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="cuda: NCCL, one GPU per rank; auto: cuda when every rank gets a GPU, else cpu (gloo)",
    )


def add_timeout(parser: argparse.ArgumentParser, default: float, run: str) -> None:
    """`--timeout`: how long one `run` may take before it counts as hung and is killed."""
    parser.add_argument(
        "--timeout",
        type=float,
        default=default,
        metavar="SECONDS",
        help=f"seconds before {run} counts as hung and is killed (default: %(default)s)",
    )
