"""One rank of the input-token count reproducer: the real `Trainer.train()`, reads counted.

With `include_num_input_tokens_seen` on, `Trainer._track_num_input_tokens` adds
`accelerator.gather(input_tokens).sum().item()` to `state.num_input_tokens_seen` after every
micro-batch's backward (transformers 5.24.0): one host read per micro-batch.

Started by `python -m hostsync repro` (ranks forked from one import of this script; torchrun
works the same), gloo on CPU, NCCL with one GPU per rank, one Trainer per run: the card gives each
scenario its micro-batches per optimizer step and what is counted. Every rank trains the tiny
Llama built from its config for a few optimizer steps, logging every step, with the whole
training under `SyncScope(account=True)`. The nan/inf loss filter (case trainer-nan-filter) is
off unless a scenario turns it on, as the Trainer's default does: then it reads each loss just
before this case's read, which waits only for what was queued since. Returned through
`rank_entry`: per optimizer step the reads made in `_track_num_input_tokens` and in all, their
cost, and what the user sees of the count, which the fix must leave unchanged: the state at each
step's end (what callbacks read), each log, and the state each saved checkpoint holds.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
from pathlib import Path

import torch
from transformers import Trainer, TrainerCallback

from hostsync.detector import SyncScope
from hostsync.rank.protocol import RankRow, ReproRank, rank_entry, repro_parser
from hostsync.rank.rankkit import (
    MODEL_SUMMARY,
    add_launch_arguments,
    check_one_group,
    samples,
    trainer_llama,
    training_arguments,
)

SITE_FILE = "transformers/trainer.py"
SITE_FUNCTION = "_track_num_input_tokens"
STEPS = 4
SAVE_STEPS = 2


def add_count_arguments(parser: argparse.ArgumentParser) -> None:
    """What a scenario sets: the card's launch arguments (the profile's too)."""
    add_launch_arguments(parser, precisions=("fp32",))
    parser.add_argument("--accumulation", type=int, default=1, help="micro-batches per step")
    parser.add_argument(
        "--count",
        choices=("all", "non_padding"),
        default="all",
        help="include_num_input_tokens_seen; non_padding pads the samples",
    )
    parser.add_argument(
        "--nan-inf-filter",
        action="store_true",
        help="logging_nan_inf_filter on, the Trainer's default (it reads each loss first)",
    )


def parse_args() -> argparse.Namespace:
    parser = repro_parser(__doc__.splitlines()[0])
    add_count_arguments(parser)
    args = parser.parse_args()
    if len(args.scenarios) != 1:
        parser.error("one scenario per run: accelerate's state is made once per process")
    (args.scenario,) = args.scenarios
    return args


def counted_samples(count: int, padded: bool) -> list[dict[str, torch.Tensor]]:
    """The tiny model's samples; padded ones end in 0 to 4 padding positions (an attention mask
    and labels of -100 there), so each rank counts a different number of real tokens."""
    rows = samples(count)
    if padded:
        for index, row in enumerate(rows):
            mask = torch.ones_like(row["input_ids"])
            mask[len(mask) - index % 5 :] = 0
            row["attention_mask"] = mask
            row["labels"] = row["labels"].masked_fill(mask == 0, -100)
    return rows


def trainer_for(
    args: argparse.Namespace,
    output_dir: Path,
    steps: int,
    trainer_class: type = Trainer,
    **settings: object,
) -> Trainer:
    """The Trainer (or `trainer_class`) of a scenario, the profile's too: the count on, `steps`
    optimizer steps."""
    training_args = training_arguments(
        output_dir,
        max_steps=steps,
        gradient_accumulation_steps=args.accumulation,
        include_num_input_tokens_seen=args.count,
        logging_nan_inf_filter=args.nan_inf_filter,
        ddp_backend=args.backend,
        **settings,
    )
    world = training_args.world_size
    dataset = counted_samples(steps * args.accumulation * world, args.count == "non_padding")
    trainer = trainer_class(model=trainer_llama(), args=training_args, train_dataset=dataset)
    check_one_group(trainer.accelerator)  # alone, a rank's `gather` returns its own count
    return trainer


class StepEnds(TrainerCallback):
    """At each optimizer step's end: how many reads the scope holds, and the count callbacks see."""

    def __init__(self, scope: SyncScope | None) -> None:
        self.scope = scope
        self.marks: list[int] = []
        self.seen: list[int] = []

    def on_step_end(self, args, state, control, **kwargs) -> None:
        self.marks.append(len(self.scope.events) if self.scope else 0)
        self.seen.append(state.num_input_tokens_seen)

    def reads(self, scope: SyncScope, site_only: bool) -> list[int]:
        """Reads per optimizer step (up to its end), all or only the site's."""
        counted = [
            not site_only or (event.site.file, event.site.function) == (SITE_FILE, SITE_FUNCTION)
            for event in scope.events
        ]
        return [sum(counted[start:end]) for start, end in itertools.pairwise([0, *self.marks])]


def saved_counts(output_dir: Path) -> dict[str, int]:
    """`num_input_tokens_seen` in each checkpoint's trainer_state.json, by checkpoint."""
    return {
        path.parent.name: json.loads(path.read_text())["num_input_tokens_seen"]
        for path in sorted(output_dir.glob("checkpoint-*/trainer_state.json"))
    }


@rank_entry
def main() -> ReproRank:
    args = parse_args()
    output_dir = args.output_dir / args.scenario
    saving = {"save_strategy": "steps", "save_steps": SAVE_STEPS, "save_only_model": True}
    trainer = trainer_for(
        args, output_dir, STEPS, logging_steps=1, **(saving if args.count == "non_padding" else {})
    )
    with contextlib.nullcontext() if args.no_detector else SyncScope(account=True) as scope:
        step_ends = StepEnds(scope)
        trainer.add_callback(step_ends)
        trainer.train()
    trainer.accelerator.wait_for_everyone()  # rank 0 has written the checkpoints
    found = tuple(scope.sync_sites()) if scope else ()
    row = RankRow(
        scenario=args.scenario,
        cost=scope.cost(STEPS) if scope else None,
        site_lists={
            "token_sites": tuple(s for s in found if s.site.function == SITE_FUNCTION),
            "sync_sites": found,
        },
        figures={
            "model": MODEL_SUMMARY,
            "include_num_input_tokens_seen": args.count,
            "accumulation": args.accumulation,
            "world_size": trainer.accelerator.num_processes,
            "device": str(trainer.args.device),
            "token_reads_per_step": step_ends.reads(scope, site_only=True) if scope else None,
            "reads_per_step": step_ends.reads(scope, site_only=False) if scope else None,
            "num_input_tokens_seen": trainer.state.num_input_tokens_seen,
            # What the fix must not change: the count callbacks, the logs and the checkpoints see.
            "seen": {
                "step_end": step_ends.seen,
                "logged": [
                    log["num_input_tokens_seen"]
                    for log in trainer.state.log_history
                    if "loss" in log
                ],
                "saved": saved_counts(output_dir),
            },
        },
    )
    return ReproRank((row,))


if __name__ == "__main__":
    main()
