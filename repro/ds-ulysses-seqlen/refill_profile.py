"""One rank of `python -m hostsync profile` for the Ulysses SP data loader: refills, profiled.

Started through torchrun like `sp_dataloader.py`, all ranks one SP group, each wrapping the same
DataLoader (the scenario's tensors, one sample a batch) in `UlyssesSPDataLoaderAdapter`. A step
is one refill: drawing the SP group's micro-batches of one batch, in the measured range; the
wrapped DataLoader's own fetch of the batch runs in the excluded range inside it, so that what is
left is `refill`'s gather, length check and sharding. The first refills are the warm-up.

`--profiler torch` records the refills with the PyTorch profiler and writes this rank's Chrome
trace to the run folder; `--profiler nsys` opens the ranges as NVTX ranges too, for Nsight Systems.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Iterable, Iterator

import deepspeed
import deepspeed.comm as dist
import sp_dataloader  # torchrun puts this script's folder first on sys.path
import torch
from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
from torch.utils.data import DataLoader

from hostsync.rank.protocol import (
    EXCLUDED_RANGE,
    MEASURED_RANGE,
    ProfiledRank,
    profile_parser,
    rank_entry,
)
from hostsync.rank.rankkit import named_range, profiled_rank, profiled_steps


def parse_args() -> argparse.Namespace:
    parser = profile_parser(__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=tuple(sp_dataloader.SCENARIOS), default="refill")
    return parser.parse_args()


class FetchApart(Iterable):
    """The DataLoader the adapter wraps, each batch's fetch in the excluded range."""

    def __init__(self, loader: DataLoader, nvtx: bool) -> None:
        self.loader, self.nvtx = loader, nvtx

    def __iter__(self) -> Iterator[dict[str, torch.Tensor]]:
        batches = iter(self.loader)
        while True:
            with named_range(EXCLUDED_RANGE, self.nvtx):
                batch = next(batches, None)
            if batch is None:
                return
            yield batch

    def __len__(self) -> int:
        return len(self.loader)


def refill(loader: UlyssesSPDataLoaderAdapter, nvtx: bool) -> float:
    """One refill, its micro-batches all drawn, in the measured range; its wall time in seconds."""
    started = time.perf_counter()
    with named_range(MEASURED_RANGE, nvtx):
        for _ in range(loader.sp_world_size):
            next(loader)
    return time.perf_counter() - started


@rank_entry
def main() -> ProfiledRank:
    args = parse_args()
    cuda = args.device == "cuda"
    deepspeed.init_distributed(dist_backend="nccl" if cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device(args.device, rank) if cuda else "cpu"
    nvtx = args.profiler == "nsys"
    keys, _ = sp_dataloader.SCENARIOS[args.scenario]
    batches = DataLoader(sp_dataloader.samples(keys, args.warmup + args.steps), batch_size=1)
    loader = UlyssesSPDataLoaderAdapter(
        FetchApart(batches, nvtx),
        sp_rank=rank,
        sp_group=None,
        sp_world_size=dist.get_world_size(),
        device=device,
    )
    seconds, trace = profiled_steps(args, lambda: refill(loader, nvtx), cuda)
    return profiled_rank(args, device, seconds, trace)


if __name__ == "__main__":
    main()
