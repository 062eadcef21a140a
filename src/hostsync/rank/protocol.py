"""What the launcher and the ranks agree on, for the rank side: standard library and the
records only.

Rank scripts import this module, torch and the tree under test, nothing else of the workspace
(besides the detector and `rankkit`): the launcher's git, download and environment code never
loads in a rank. The records a rank returns are named here for them: a repro script's
`ReproRank` of `RankRow`s, a profile script's `ProfiledRank` (`rankkit.profiled_rank`), the
Trainer worker's `TrainerRank`.
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import socket
import traceback
from collections.abc import Callable, Collection
from pathlib import Path

from hostsync.detector.codec import Record, dump, write_file
from hostsync.rank.records import ProfiledRank, RankReport, RankRow, ReproRank
from hostsync.sites.records import (
    HuntRecording,
    HuntStep,
    LoggedStep,
    ProfiledRead,
    StepSite,
    TrainerRank,
)
from hostsync.workspace.records import Device

__all__ = [
    "Device",
    "HuntRecording",
    "HuntStep",
    "LoggedStep",
    "ProfiledRank",
    "ProfiledRead",
    "RankRow",
    "ReproRank",
    "StepSite",
    "TrainerRank",
]

RUN_DIR_ENV = "HOSTSYNC_RUN_DIR"
TREE_SRC_ENV = "HOSTSYNC_TREE_SRC"
TREE_PACKAGE_ENV = "HOSTSYNC_TREE_PACKAGE"
# Every device-to-host read of a scalar reaches the first; `.item()` and `bool(t)` wrap it in the
# others. The names the PyTorch profiler gives them.
SYNC_OPS = ("aten::_local_scalar_dense", "aten::item", "aten::is_nonzero")
SYNC_OP = SYNC_OPS[0]
# The profile's ranges: each step's measured region, and the part of it measured apart (a model
# forward, say); a case's profile script opens them, `hostsync.profiling` reads them. The
# profiled steps together sit in the third: what Nsight Systems records (its capture range).
MEASURED_RANGE = "hostsync.measured"
EXCLUDED_RANGE = "hostsync.excluded"
PROFILED_RANGE = "hostsync.profiled"


def repro_parser(description: str, known: Collection[str] = ()) -> argparse.ArgumentParser:
    """The arguments `hostsync.measure.repro` gives every rank script: `--scenarios a,b` (a list;
    each one of `known`, when given), `--device cpu|cuda` and `--no-detector` (to time the
    detector). A script adds its own before it parses."""

    def scenario_list(text: str) -> list[str]:
        names = text.split(",")
        unknown = sorted(set(names) - set(known)) if known else []
        if unknown:
            raise argparse.ArgumentTypeError(f"unknown {unknown}; known: {sorted(known)}")
        return names

    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--scenarios", required=True, type=scenario_list)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--no-detector", action="store_true", help="count nothing (to time it)")
    return parser


def profile_parser(description: str) -> argparse.ArgumentParser:
    """The arguments `hostsync.profiling` gives every profile script: `--device cpu|cuda`,
    `--profiler torch|nsys` and how many steps run unrecorded (`--warmup`), then recorded
    (`--steps`). A script adds its own `--scenario` before it parses."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--profiler", choices=("torch", "nsys"), default="torch")
    parser.add_argument("--warmup", type=int, default=2, help="unprofiled steps first")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps")
    return parser


def free_port() -> int:
    """A port nobody listens on now, for a rendezvous: launchers pick theirs this way."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def rank_entry(main: Callable[[], Record]) -> Callable[[], None]:
    """Decorate a rank's main: the record it returns, in a `RankReport`, or its traceback, lands
    in the run folder."""

    @functools.wraps(main)
    def wrapper() -> None:
        run_dir = Path(os.environ[RUN_DIR_ENV])
        rank = int(os.environ.get("RANK", "0"))
        try:
            check_tree_origin()
            result = main()
        except BaseException as error:
            # First line: the exception itself, for the launcher's one-line message.
            summary = traceback.format_exception_only(error)[0].strip()
            (run_dir / f"rank-{rank}.error").write_text(f"{summary}\n\n{traceback.format_exc()}")
            raise
        write_file(RankReport(rank, dump(result)), run_dir / f"rank-{rank}.json")
        _leave_process_group()

    return wrapper


def _leave_process_group() -> None:
    """Tear the process group down before the interpreter exits: gloo's threads, left running,
    make some exits abort ("terminate called without an active exception")."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def check_tree_origin() -> None:
    """Refuse to measure an installed package when a tree was asked for."""
    package = importlib.import_module(os.environ[TREE_PACKAGE_ENV])
    expected = Path(os.environ[TREE_SRC_ENV]).resolve()
    actual = Path(package.__file__ or expected).resolve()
    if expected not in actual.parents:
        raise RuntimeError(
            f"{package.__name__} was imported from {actual.parent}, not from the tree under test"
            f" {expected}: something earlier on sys.path shadows it"
        )
