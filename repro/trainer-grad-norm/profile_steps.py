"""One rank of `python -m hostsync profile` for the grad norm: Trainer steps under DeepSpeed.

Started by `accelerate launch` like `train.py` (DeepSpeed ZeRO 1 + Ulysses SP over the ranks),
the same tiny Llama and Trainer settings, the scenario's gradient clipping. Each optimizer step
is in the measured range, the forward and backward (`Trainer.training_step`) in the excluded
range inside it (`rankkit.TrainerSteps`): what is left is the loop around them, where the Trainer
asks accelerate for the engine's gradient norm. Logging comes once, after the last step, so the
measured steps hold no read made for the logs; the nan/inf loss filter, case
trainer-nan-filter's reads, is off, so the range holds this case's reads alone. The first
`--warmup` steps are not recorded; the PyTorch profiler (each rank's trace) or Nsight Systems
records the next `--steps`.
"""

from __future__ import annotations

import argparse

from train import SCENARIOS  # the launcher puts this script's folder first
from transformers import Trainer

from hostsync.rank.protocol import ProfiledRank, profile_parser, rank_entry
from hostsync.rank.rankkit import (
    TrainerSteps,
    add_launch_arguments,
    profiled_rank,
    samples,
    trace_file,
    trainer_llama,
    training_arguments,
)


def parse_args() -> argparse.Namespace:
    parser = profile_parser(__doc__.splitlines()[0])
    add_launch_arguments(parser)
    parser.add_argument("--scenario", default="every_4_steps", choices=tuple(SCENARIOS))
    return parser.parse_args()


@rank_entry
def main() -> ProfiledRank:
    args = parse_args()
    trace = trace_file(args.profiler)
    what, _, max_grad_norm = SCENARIOS[args.scenario]
    steps = args.warmup + args.steps
    ranges = TrainerSteps(args.warmup, args.profiler, cuda=args.device == "cuda", trace=trace)
    training_args = training_arguments(
        args.output_dir / args.scenario,
        precision=args.precision,
        max_steps=steps,
        max_grad_norm=max_grad_norm,
        logging_steps=steps,
        logging_nan_inf_filter=False,
        ddp_backend=args.backend,
    )
    trainer = ranges.excluding(Trainer)(
        model=trainer_llama(),
        args=training_args,
        train_dataset=samples(steps),
        callbacks=[ranges.callback()],
    )
    trainer.train()
    return profiled_rank(args, trainer.args.device, ranges.seconds, trace, what=what)


if __name__ == "__main__":
    main()
