"""One rank of the grad-norm reproducer: the real `Trainer.train()` under DeepSpeed, reads counted.

Under DeepSpeed the Trainer asks `accelerator.clip_grad_norm_` for the gradient norm on every
optimizer step; accelerate returns the engine's norm as a float (`.item()`), a host read, for a
value the Trainer only needs when it logs. Each scenario trains the hunt's tiny Llama for a few
steps under `accelerate launch` (DeepSpeed ZeRO 1 + Ulysses SP over 2 ranks, gradient clipping
1.0 unless the scenario turns it off), the whole training under `hostsync.detector.SyncScope`.

Returns through `rank_entry` one row per scenario: per optimizer step, the reads made for the
norm before it is logged (in accelerate's `get_global_grad_norm` or the Trainer's
`_clip_grad_norm` / `_get_grad_norm`) and the reads of the norm when it is logged
(`_maybe_log_save_evaluate`), by source line; and what the Trainer logged.
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
from collections import Counter
from collections.abc import Callable

from transformers import Trainer, TrainerCallback

from hostsync.detector import Site, SiteCount, SyncScope
from hostsync.rank.protocol import RankRow, ReproRank, rank_entry, repro_parser
from hostsync.rank.rankkit import (
    MODEL_SUMMARY,
    add_launch_arguments,
    finite_or_name,
    samples,
    trainer_llama,
    training_arguments,
)

# (file, function) of the reads that fetch the norm before it is logged.
FETCH_SITES = {
    ("accelerate/utils/deepspeed.py", "get_global_grad_norm"),
    ("transformers/trainer.py", "_clip_grad_norm"),
    ("transformers/trainer.py", "_get_grad_norm"),
}
# The logging step's read of the norm (the same function also reads the loss).
LOGGED_AT = ("transformers/trainer.py", "_maybe_log_save_evaluate", "grad_norm")
# name: (what it shows, logging_steps, max_grad_norm)
SCENARIOS = {
    "every_step": ("logging_steps=1", 1, 1.0),
    "every_4_steps": ("logging_steps=4", 4, 1.0),
    "no_clipping": ("max_grad_norm=0, logging_steps=4", 4, 0.0),
}
STEPS = 4


def parse_args() -> argparse.Namespace:
    parser = repro_parser(__doc__.splitlines()[0], known=SCENARIOS)
    add_launch_arguments(parser)
    args = parser.parse_args()
    if len(args.scenarios) > 1:
        parser.error("one scenario per launch: Ulysses makes its SP group once per process")
    return args


class StepMarks(TrainerCallback):
    """Where each optimizer step starts in the scope's events: a step's reads, its logging
    included, are the events up to the next step's start."""

    def __init__(self, scope: SyncScope) -> None:
        self.scope = scope
        self.starts: list[int] = []

    def on_step_begin(self, args, state, control, **kwargs) -> None:
        self.starts.append(len(self.scope.events))

    def per_step(self, wanted: Callable[[Site], bool]) -> list[int]:
        bounds = [*self.starts, len(self.scope.events)]
        return [
            sum(1 for event in self.scope.events[begin:end] if wanted(event.site))
            for begin, end in itertools.pairwise(bounds)
        ]

    def lines(self, wanted: Callable[[Site], bool]) -> tuple[SiteCount, ...]:
        counts = Counter(event.site for event in self.scope.events if wanted(event.site))
        return tuple(SiteCount(site, count) for site, count in sorted(counts.items()))


def fetches_norm(site: Site) -> bool:
    return (site.file, site.function) in FETCH_SITES


def logs_norm(site: Site) -> bool:
    file, function, code = LOGGED_AT
    return site.file == file and site.function == function and code in site.code


def run_scenario(name: str, args: argparse.Namespace) -> RankRow:
    what, logging_steps, max_grad_norm = SCENARIOS[name]
    training_args = training_arguments(
        f"{args.output_dir}/{name}",
        precision=args.precision,
        max_steps=STEPS,
        max_grad_norm=max_grad_norm,
        logging_steps=logging_steps,
        ddp_backend=args.backend,
    )
    trainer = Trainer(model=trainer_llama(), args=training_args, train_dataset=samples(STEPS))
    with contextlib.nullcontext() if args.no_detector else SyncScope(account=True) as scope:
        marks = StepMarks(scope) if scope else None
        if marks:
            trainer.add_callback(marks)
        trainer.train()
    pc = trainer.accelerator.parallelism_config
    logged = [entry for entry in trainer.state.log_history if "loss" in entry]
    return RankRow(
        scenario=name,
        cost=scope.cost(STEPS) if scope else None,
        site_lists={"grad_norm_sites": marks.lines(fetches_norm) if marks else ()},
        figures={
            "what": what,
            "zero_stage": trainer.accelerator.state.deepspeed_plugin.zero_stage,
            "world_size": trainer.accelerator.num_processes,
            "sp_size": pc.sp_size if pc is not None and pc.sp_enabled else 1,
            "precision": args.precision,
            "steps": STEPS,
            "logging_steps": logging_steps,
            "max_grad_norm": max_grad_norm,
            "grad_norm_reads_per_step": marks.per_step(fetches_norm) if marks else None,
            "logged_reads_per_step": marks.per_step(logs_norm) if marks else None,
            "logged": [
                {
                    "step": entry["step"],
                    "loss": finite_or_name(entry["loss"]),
                    "grad_norm": finite_or_name(float(entry["grad_norm"])),
                }
                for entry in logged
            ],
            "model": MODEL_SUMMARY,
        },
    )


@rank_entry
def main() -> ReproRank:
    args = parse_args()
    return ReproRank(tuple(run_scenario(name, args) for name in args.scenarios))


if __name__ == "__main__":
    main()
