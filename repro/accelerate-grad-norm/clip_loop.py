"""One rank of a user's accelerate loop under DeepSpeed: backward, clip_grad_norm_, step.

Started by `python -m hostsync repro` (ranks forked from one import of this script; torchrun
works the same), gloo on CPU, NCCL with one GPU per rank, one run per scenario: the card gives
each its ZeRO stage and accumulation. Every rank builds the tiny Llama from its config, hands it
to `Accelerator` with a `DeepSpeedPlugin` (gradient clipping 1.0), and trains it as accelerate's
docs write a loop: `accelerator.backward` (which runs the engine's step at the accumulation
boundary), then `clip_grad_norm_` whose norm the loop keeps, then `optimizer.step()`. Returned
through `rank_entry`, per optimizer step: the host reads inside `clip_grad_norm_` and in the
whole step, by source line (`hostsync.detector`), the type of the norm it returned, and what
training did (loss, grad norm, a weights checksum), which the fix must leave unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections import Counter
from collections.abc import Iterator
from typing import Any

import torch
from accelerate import Accelerator
from accelerate.utils import DeepSpeedPlugin, InitProcessGroupKwargs

from hostsync.detector import Cost, SiteCount, SyncScope
from hostsync.rank.protocol import RankRow, ReproRank, rank_entry, repro_parser
from hostsync.rank.rankkit import (
    MODEL_SUMMARY,
    add_launch_arguments,
    finite_or_name,
    samples,
    trainer_llama,
)

STEPS = 4
MAX_GRAD_NORM = 1.0


def add_loop_arguments(parser: argparse.ArgumentParser) -> None:
    """What a scenario sets of the loop: the card's launch arguments (the profile's too)."""
    add_launch_arguments(parser, precisions=("fp32",))
    parser.add_argument("--zero-stage", type=int, choices=(1, 2), default=2)
    parser.add_argument("--accumulation", type=int, default=1, help="micro-batches per step")


def parse_args() -> argparse.Namespace:
    parser = repro_parser(__doc__.splitlines()[0])
    add_loop_arguments(parser)
    args = parser.parse_args()
    if len(args.scenarios) != 1:
        parser.error("one scenario per run: accelerate's state is made once per process")
    (args.scenario,) = args.scenarios
    return args


def deepspeed_accelerator(args: argparse.Namespace) -> Accelerator:
    """An Accelerator driving a real DeepSpeed engine, as `accelerate launch --use_deepspeed`
    sets one up from the launch's variables."""
    os.environ["ACCELERATE_USE_DEEPSPEED"] = "true"
    plugin = DeepSpeedPlugin(
        zero_stage=args.zero_stage,
        gradient_accumulation_steps=args.accumulation,
        gradient_clipping=MAX_GRAD_NORM,
    )
    return Accelerator(
        deepspeed_plugin=plugin,
        # Without it accelerate's state has no backend on CPU: each rank trains alone, silently.
        kwargs_handlers=[InitProcessGroupKwargs(backend=args.backend)],
    )


def weights_checksum(model) -> float:
    """Sum of this rank's weights (ZeRO 1/2 keep every weight on every rank)."""
    return float(sum(p.detach().double().sum() for p in model.parameters()))


def prepared(
    args: argparse.Namespace, steps: int
) -> tuple[Accelerator, torch.nn.Module, torch.optim.Optimizer, Iterator[dict[str, torch.Tensor]]]:
    """The accelerator, the tiny Llama and AdamW as it prepared them, and batches for `steps`
    optimizer steps (the profile's too)."""
    accelerator = deepspeed_accelerator(args)
    model = trainer_llama()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    per_step = args.accumulation * accelerator.num_processes
    loader = torch.utils.data.DataLoader(samples(per_step * steps), batch_size=1)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    return accelerator, model, optimizer, iter(loader)


def train(args: argparse.Namespace) -> tuple[Accelerator, list[dict[str, Any]]]:
    """The accelerator and, for each optimizer step, its host reads, their cost (stalls, device
    work) and what training did."""
    accelerator, model, optimizer, batches = prepared(args, STEPS)
    steps = []
    for _ in range(STEPS):
        with contextlib.nullcontext() if args.no_detector else SyncScope(account=True) as scope:
            for _ in range(args.accumulation):
                with accelerator.accumulate(model):
                    loss = model(**next(batches)).loss
                    accelerator.backward(loss)
                    if accelerator.sync_gradients:
                        clip_begin = len(scope.events) if scope else 0
                        grad_norm = accelerator.clip_grad_norm_(model.parameters(), MAX_GRAD_NORM)
                        clip_end = len(scope.events) if scope else 0
                    optimizer.step()
                    optimizer.zero_grad()
        in_clip = scope.events[clip_begin:clip_end] if scope else []
        steps.append(
            {
                "clip_reads": len(in_clip) if scope else None,
                "clip_sites": [
                    SiteCount(site, count)
                    for site, count in sorted(Counter(event.site for event in in_clip).items())
                ],
                "step_reads": len(scope.events) if scope else None,
                "step_sites": scope.sync_sites() if scope else [],
                "cost": scope.cost() if scope else None,
                "norm_type": type(grad_norm).__name__,
                # Read here, after the step's reads were counted: what a loop logs.
                "loss": finite_or_name(float(loss)),
                "grad_norm": finite_or_name(float(grad_norm)),
                "weights_checksum": weights_checksum(model),
            }
        )
    return accelerator, steps


def steps_cost(steps: list[dict[str, Any]]) -> Cost:
    """Every step's cost together: waits, stalls, device work and idle time over the optimizer
    steps (the reads after a step, what the loop logs, left out)."""
    return Cost.in_sequence(step["cost"] for step in steps)


@rank_entry
def main() -> ReproRank:
    args = parse_args()
    accelerator, steps = train(args)
    row = RankRow(
        scenario=args.scenario,
        cost=None if args.no_detector else steps_cost(steps),
        site_lists={
            "clip_sites": tuple(steps[-1]["clip_sites"]),
            "sync_sites": tuple(steps[-1]["step_sites"]),
        },
        figures={
            "model": MODEL_SUMMARY,
            "zero_stage": args.zero_stage,
            "accumulation": args.accumulation,
            "world_size": accelerator.num_processes,
            "device": str(accelerator.device),
            "precision": args.precision,
            "max_grad_norm": MAX_GRAD_NORM,
            "clip_reads_per_step": [step["clip_reads"] for step in steps],
            "reads_per_step": [step["step_reads"] for step in steps],
            "norm_type": steps[-1]["norm_type"],
            # What the fix must not change, step by step.
            "training": {
                key: [step[key] for step in steps]
                for key in ("loss", "grad_norm", "weights_checksum")
            },
        },
    )
    return ReproRank((row,))


if __name__ == "__main__":
    main()
