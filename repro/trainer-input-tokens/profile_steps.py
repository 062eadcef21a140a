"""One rank of `python -m hostsync profile` for the input-token count: Trainer steps, profiled.

Started by torchrun like `train.py`'s ranks, the same tiny Llama, Trainer settings and scenario
arguments (micro-batches per optimizer step, what is counted). Each optimizer step is in the
measured range, the forward and backward (`Trainer.training_step`) in the excluded range inside it
(`rankkit.TrainerSteps`): what is left is the loop around them, where the Trainer counts each
micro-batch's input tokens. Logging comes once, after the last step, and the nan/inf loss filter
is off, so the range holds this case's reads alone. The first `--warmup` steps are not recorded;
the PyTorch profiler (each rank's trace) or Nsight Systems records the next `--steps`.
"""

from __future__ import annotations

import argparse

from train import add_count_arguments, trainer_for  # torchrun puts this script's folder first
from transformers import Trainer

from hostsync.rank.protocol import ProfiledRank, profile_parser, rank_entry
from hostsync.rank.rankkit import TrainerSteps, profiled_rank, trace_file


def parse_args() -> argparse.Namespace:
    parser = profile_parser(__doc__.splitlines()[0])
    add_count_arguments(parser)
    parser.add_argument("--scenario", default="accum4", choices=("accum4", "non_padding"))
    return parser.parse_args()


@rank_entry
def main() -> ProfiledRank:
    args = parse_args()
    trace = trace_file(args.profiler)
    steps = args.warmup + args.steps
    ranges = TrainerSteps(args.warmup, args.profiler, cuda=args.device == "cuda", trace=trace)
    trainer = trainer_for(
        args,
        args.output_dir / args.scenario,
        steps,
        trainer_class=ranges.excluding(Trainer),
        logging_steps=steps,
    )
    trainer.add_callback(ranges.callback())
    trainer.train()
    what = f"{args.accumulation} micro-batches per optimizer step, counting {args.count} tokens"
    return profiled_rank(args, trainer.args.device, ranges.seconds, trace, what=what)


if __name__ == "__main__":
    main()
