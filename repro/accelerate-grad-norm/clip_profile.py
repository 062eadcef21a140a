"""One rank of `python -m hostsync profile` for accelerate's clip_grad_norm_ under DeepSpeed.

Started through torchrun with the loop `clip_loop.py` builds, unchanged (the tiny Llama, AdamW, a
real DeepSpeed engine with gradient clipping 1.0 at the scenario's ZeRO stage and accumulation).
Each optimizer step's `accelerator.backward`, `clip_grad_norm_` and `optimizer.step()` run in the
measured range, the backward (where DeepSpeed also runs its engine step) in the excluded range
inside it, so that what is left is what the loop adds: `clip_grad_norm_`, where the norm is read,
and accelerate's optimizer step, a no-op under DeepSpeed. The forward runs before the range.

`--profiler torch` records the steps with the PyTorch profiler and writes this rank's Chrome trace
to the run folder; `--profiler nsys` opens the ranges as NVTX ranges too, for Nsight Systems.
"""

from __future__ import annotations

import argparse
import time

import clip_loop  # torchrun puts this script's folder first on sys.path

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
    clip_loop.add_loop_arguments(parser)
    parser.add_argument("--scenario", default="zero2")
    return parser.parse_args()


def optimizer_step(accelerator, model, optimizer, batches, accumulation: int, nvtx: bool) -> float:
    """One optimizer step: each micro-batch's forward, then its backward, clip and step in their
    ranges; the measured ranges' wall time in seconds."""
    seconds = 0.0
    for _ in range(accumulation):
        with accelerator.accumulate(model):
            loss = model(**next(batches)).loss
            started = time.perf_counter()
            with named_range(MEASURED_RANGE, nvtx):
                with named_range(EXCLUDED_RANGE, nvtx):
                    accelerator.backward(loss)
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), clip_loop.MAX_GRAD_NORM)
                optimizer.step()
                optimizer.zero_grad()
            seconds += time.perf_counter() - started
    return seconds


@rank_entry
def main() -> ProfiledRank:
    args = parse_args()
    accelerator, model, optimizer, batches = clip_loop.prepared(args, args.warmup + args.steps)
    step = (accelerator, model, optimizer, batches, args.accumulation, args.profiler == "nsys")
    seconds, trace = profiled_steps(args, lambda: optimizer_step(*step), args.device == "cuda")
    return profiled_rank(args, accelerator.device, seconds, trace)


if __name__ == "__main__":
    main()
