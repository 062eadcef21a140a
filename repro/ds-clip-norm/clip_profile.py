"""One rank of `python -m hostsync profile` for ZeRO clipping: engine steps, warmed up, profiled.

Started through torchrun like `clip_step.py`, whose engine it builds unchanged (the tiny model
with a Trainer's two parameter groups, fused AdamW, gradient clipping 1.0, the ZeRO stage and
precision of the scenario's launch arguments), with no gradient made infinite: every step is
applied. Each step's `engine.backward` and `engine.step` run in the measured range, the backward
in the excluded range inside it, so that what is left is the optimizer step:
`unscale_and_clip_grads` and the step's own overflow check. The forward runs before the range.

`--profiler torch` records the steps with the PyTorch profiler and writes this rank's Chrome trace
to the run folder; `--profiler nsys` opens the ranges as NVTX ranges too, for Nsight Systems.
"""

from __future__ import annotations

import argparse
import time

import clip_step  # torchrun puts this script's folder first on sys.path
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
    clip_step.add_engine_arguments(parser)
    parser.add_argument("--scenario", default="bf16-zero1")
    return parser.parse_args()


def train_step(engine, inputs, target, nvtx: bool) -> float:
    """The forward, then backward and step in their ranges; the range's wall time in seconds."""
    loss = torch.nn.functional.mse_loss(engine(inputs).float(), target)
    started = time.perf_counter()
    with named_range(MEASURED_RANGE, nvtx):
        with named_range(EXCLUDED_RANGE, nvtx):
            engine.backward(loss)
        engine.step()
    return time.perf_counter() - started


@rank_entry
def main() -> ProfiledRank:
    args = parse_args()
    engine = clip_step.engine_for(args)
    nvtx = args.profiler == "nsys"
    batches = clip_step.batches(engine, args.dtype, args.warmup + args.steps)
    seconds, trace = profiled_steps(
        args, lambda: train_step(engine, *next(batches), nvtx), cuda=args.device == "cuda"
    )
    skipped = int(engine.skipped_steps)
    return profiled_rank(args, engine.device, seconds, trace, skipped_steps=skipped)


if __name__ == "__main__":
    main()
