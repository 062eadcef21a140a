"""One rank of `python -m hostsync profile` for the nan/inf filter: Trainer steps, profiled.

Started through torchrun (one rank). Trains the reproducer's tiny Llama with the real Trainer;
each optimizer step is in the measured range, the forward and backward (`Trainer.training_step`)
in the excluded range inside it (`rankkit.TrainerSteps`, the Trainer itself untouched). What is
left in the range is the training loop's own work around them: the nan/inf filter, gradient
clipping, the optimizer step. The first `--warmup` steps are not recorded; the PyTorch profiler
(this rank's trace) or Nsight Systems records the next `--steps`.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from train import SCENARIOS  # torchrun puts this script's folder first

from hostsync.rank.protocol import RUN_DIR_ENV, ProfiledRank, profile_parser, rank_entry
from hostsync.rank.rankkit import (
    TrainerSteps,
    profiled_rank,
    samples,
    trace_file,
    trainer_llama,
    training_arguments,
)


def parse_args() -> argparse.Namespace:
    parser = profile_parser(__doc__.splitlines()[0])
    # The scenarios that make no loss non-finite: nothing here injects one.
    parser.add_argument("--scenario", default="finite", choices=("finite", "filter_off"))
    return parser.parse_args()


@rank_entry
def main() -> ProfiledRank:
    from transformers import Trainer

    args = parse_args()
    run_dir = Path(os.environ[RUN_DIR_ENV])
    trace = trace_file(args.profiler)
    what, accumulation, _, nan_inf_filter, _ = SCENARIOS[args.scenario]
    steps = args.warmup + args.steps
    ranges = TrainerSteps(args.warmup, args.profiler, cuda=args.device == "cuda", trace=trace)
    training_args = training_arguments(
        run_dir / "output",
        max_steps=steps,
        gradient_accumulation_steps=accumulation,
        logging_steps=steps,
        logging_nan_inf_filter=nan_inf_filter,
        lr_scheduler_type="linear",
        use_cpu=args.device == "cpu",
    )
    trainer = ranges.excluding(Trainer)(
        model=trainer_llama(),
        args=training_args,
        train_dataset=samples(steps * accumulation),
        callbacks=[ranges.callback()],
    )
    trainer.train()
    return profiled_rank(args, trainer.args.device, ranges.seconds, trace, what=what)


if __name__ == "__main__":
    main()
