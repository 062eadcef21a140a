"""One rank of the SFT metrics reproducer: TRL's `SFTTrainer.train()`, its host reads counted.

`SFTTrainer.compute_loss` turns the entropy, token accuracy and token count of every micro-batch
into Python floats, though they are only averaged and logged every `logging_steps`. Each scenario
trains the tiny Llama for a few steps (ranks forked as torchrun starts them: one process, or DDP
on two), the whole training under `hostsync.detector.SyncScope`.

Returns through `rank_entry` one row per scenario: the host reads made by sft_trainer.py's own
lines in each micro-batch's `compute_loss` (the model's forward apart) and in each `log` call,
by source line, and what SFTTrainer logged, to 6 significant digits (the fix sums a window's
float32 values on the device instead of in Python).
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections import Counter
from pathlib import Path

from trl import SFTConfig, SFTTrainer

from hostsync.detector import SiteCount, SyncScope
from hostsync.rank.protocol import RankRow, ReproRank, rank_entry, repro_parser
from hostsync.rank.rankkit import (
    MODEL_SUMMARY,
    add_launch_arguments,
    sft_samples,
    tiny_tokenizer,
    trainer_llama,
    training_arguments,
)

SFT_FILE = "trl/trainer/sft_trainer.py"
# name: (logging_steps, gradient_accumulation_steps, padding_free)
SCENARIOS = {"padded": (2, 1, False), "padding_free": (2, 1, True), "grad_accum": (2, 2, False)}
STEPS, BATCH = 4, 2
LOGGED = ("loss", "entropy", "mean_token_accuracy", "num_tokens")


def parse_args() -> argparse.Namespace:
    parser = repro_parser(__doc__.splitlines()[0], known=SCENARIOS)
    add_launch_arguments(parser, precisions=("fp32",))
    return parser.parse_args()


def measured_trainer(scope: SyncScope | None) -> type:
    """SFTTrainer noting, per `compute_loss` and per `log` call, the reads of sft_trainer.py."""

    class MeasuredSFTTrainer(SFTTrainer):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.micro_batches: list[int] = []
            self.logs: list[int] = []

        def compute_loss(self, *args, **kwargs):
            begin = len(scope.events) if scope else 0
            loss = super().compute_loss(*args, **kwargs)
            self.micro_batches.append(_own_reads(scope, begin))
            return loss

        def log(self, *args, **kwargs):
            begin = len(scope.events) if scope else 0
            super().log(*args, **kwargs)
            self.logs.append(_own_reads(scope, begin))

    return MeasuredSFTTrainer


def _own_reads(scope: SyncScope | None, begin: int) -> int:
    return sum(1 for event in scope.events[begin:] if event.site.file == SFT_FILE) if scope else 0


def sft_config(output_dir: str | Path, scenario: str, steps: int, **settings: object) -> SFTConfig:
    """The scenario's SFTConfig for `steps` optimizer steps (the profile's too)."""
    logging_steps, accumulation, padding_free = SCENARIOS[scenario]
    return training_arguments(
        output_dir,
        kind=SFTConfig,
        max_steps=steps,
        logging_steps=logging_steps,
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=accumulation,
        padding_free=padding_free,
        max_length=None,
        dataset_num_proc=None,
        **settings,
    )


def rounded(value: float) -> float:
    return float(f"{value:.6g}")


def run_scenario(name: str, args: argparse.Namespace, world_size: int) -> RankRow:
    logging_steps, accumulation, _ = SCENARIOS[name]
    training_args = sft_config(args.output_dir / name, name, STEPS, ddp_backend=args.backend)
    count = STEPS * BATCH * accumulation * world_size
    with contextlib.nullcontext() if args.no_detector else SyncScope(account=True) as scope:
        trainer = measured_trainer(scope)(
            model=trainer_llama(),
            args=training_args,
            train_dataset=sft_samples(count),
            processing_class=tiny_tokenizer(),
        )
        trainer.train()
    own = [event.site for event in scope.events if event.site.file == SFT_FILE] if scope else []
    return RankRow(
        scenario=name,
        cost=scope.cost(STEPS) if scope else None,
        site_lists={
            "site_lines": tuple(SiteCount(site, n) for site, n in sorted(Counter(own).items()))
        },
        figures={
            "world_size": trainer.accelerator.num_processes,
            "steps": STEPS,
            "logging_steps": logging_steps,
            "gradient_accumulation_steps": accumulation,
            "reads_per_micro_batch": trainer.micro_batches if scope else None,
            "reads_per_log": trainer.logs if scope else None,
            "logged": [
                {key: rounded(entry[key]) for key in ("step", *LOGGED)}
                for entry in trainer.state.log_history
                if "loss" in entry
            ],
            "model": MODEL_SUMMARY,
        },
    )


@rank_entry
def main() -> ReproRank:
    args = parse_args()
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    return ReproRank(tuple(run_scenario(name, args, world_size) for name in args.scenarios))


if __name__ == "__main__":
    main()
