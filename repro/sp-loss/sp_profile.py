"""One rank of `python -m hostsync profile`: the reproducer's loss call, warmed up, then profiled.

Started through torchrun like `sp_loss.py`, whose setup it reuses unchanged (the tiny Llama, the
engine that makes the real Ulysses SP group, a scenario's sharded batch, the call of the tree's
`deepspeed_sp_compute_loss`). Each step runs the loss call inside the measured range, with the
model forward inside it in the excluded range, so that the aggregation's syncs can be told apart
from the forward's; then `engine.backward`, outside the range, as in training.

`--profiler torch` records the steps with the PyTorch profiler and writes this rank's Chrome trace
to the run folder. `--profiler nsys` runs under `nsys profile --capture-range=nvtx`: the ranges
are NVTX ranges too, and nsys records the profiled steps (`rankkit.recording`).
"""

from __future__ import annotations

import argparse
import time

import sp_loss  # torchrun puts this script's folder first on sys.path
import torch

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
    parser.add_argument("--scenario", default="all_tokens")
    return parser.parse_args()


def train_step(engine, batch: dict[str, torch.Tensor], pc, nvtx: bool) -> float:
    """The loss call in its range, then backward; the range's wall time in seconds."""
    rank, sp_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    inputs = sp_loss.shard(batch, rank, sp_size)
    engine.zero_grad()
    started = time.perf_counter()
    with named_range(MEASURED_RANGE, nvtx):
        loss, _ = sp_loss.compute_loss(engine, inputs, pc, detect=False)
    seconds = time.perf_counter() - started
    engine.backward(loss)
    return seconds


@rank_entry
def main() -> ProfiledRank:
    from accelerate.parallelism_config import ParallelismConfig

    args = parse_args()
    device = sp_loss.setup_distributed(args.device)
    sp_size = torch.distributed.get_world_size()
    cuda = device.type == "cuda"
    model = sp_loss.sp_llama(device)
    batch = sp_loss.full_batch(args.scenario, sp_size, device)
    engine = sp_loss.sp_engine(model, sp_size, seq_len=sp_loss.TOKENS_PER_RANK * sp_size)
    pc = ParallelismConfig(sp_size=sp_size, sp_backend="deepspeed")
    nvtx = args.profiler == "nsys"
    with sp_loss.around_forward(engine, lambda: named_range(EXCLUDED_RANGE, nvtx)):
        seconds, trace = profiled_steps(args, lambda: train_step(engine, batch, pc, nvtx), cuda)
    return profiled_rank(args, device, seconds, trace)


if __name__ == "__main__":
    main()
