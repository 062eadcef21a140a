"""One rank of `python -m hostsync profile` for SFTTrainer's metrics: its loss calls, profiled.

Started through torchrun (one rank). Trains the reproducer's tiny Llama with TRL's real
SFTTrainer, set up as `sft_metrics.py`'s scenario; each micro-batch's `compute_loss` is in the
measured range, the model's forward inside it in the excluded range (entered and left from
forward hooks, so SFTTrainer runs unchanged). What is left in the range is the loss and the
metrics SFTTrainer computes around the forward: entropy, token accuracy, the token count. The
first `--warmup` optimizer steps are not recorded; the PyTorch profiler (this rank's trace) or
Nsight Systems records the next `--steps`.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

from sft_metrics import BATCH, SCENARIOS, sft_config  # torchrun puts this script's folder first
from trl import SFTTrainer

from hostsync.rank.protocol import (
    EXCLUDED_RANGE,
    MEASURED_RANGE,
    RUN_DIR_ENV,
    ProfiledRank,
    profile_parser,
    rank_entry,
)
from hostsync.rank.rankkit import (
    named_range,
    profiled_rank,
    recording,
    sft_samples,
    tiny_tokenizer,
    trace_file,
    trainer_llama,
)


def parse_args() -> argparse.Namespace:
    parser = profile_parser(__doc__.splitlines()[0])
    parser.add_argument("--scenario", default="padded", choices=tuple(SCENARIOS))
    return parser.parse_args()


class LossCalls:
    """The measured and excluded ranges of each `compute_loss`, and the recording of the steps
    after the warm-up (from the begin of step `warmup + 1` to the end of training)."""

    def __init__(self, args: argparse.Namespace, trace: Path | None) -> None:
        self.args, self.trace = args, trace
        self.nvtx = args.profiler == "nsys"
        self.recorded = contextlib.ExitStack()
        self.forwards: list[contextlib.AbstractContextManager] = []
        self.seconds: list[float] = []

    def on_step_begin(self, args, state, control, **_) -> None:
        if state.global_step == self.args.warmup:
            cuda = self.args.device == "cuda"
            self.recorded.enter_context(recording(self.args.profiler, cuda, self.trace))

    def on_train_end(self, args, state, control, **_) -> None:
        self.recorded.close()

    def enter_forward(self, *_: object) -> None:
        self.forwards.append(named_range(EXCLUDED_RANGE, self.nvtx))
        self.forwards[-1].__enter__()

    def leave_forward(self, *_: object) -> None:
        self.forwards.pop().__exit__(None, None, None)

    def trainer(self) -> type:
        """SFTTrainer with each `compute_loss` in the measured range."""
        calls = self

        class MeasuredLoss(SFTTrainer):
            def compute_loss(self, *args, **kwargs):
                started = time.perf_counter()
                with named_range(MEASURED_RANGE, calls.nvtx):
                    loss = super().compute_loss(*args, **kwargs)
                if self.state.global_step >= calls.args.warmup:
                    calls.seconds.append(time.perf_counter() - started)
                return loss

        return MeasuredLoss

    def callback(self):
        from transformers import TrainerCallback

        calls = self

        class Recording(TrainerCallback):
            on_step_begin = calls.on_step_begin
            on_train_end = calls.on_train_end

        return Recording()


@rank_entry
def main() -> ProfiledRank:
    args = parse_args()
    run_dir = Path(os.environ[RUN_DIR_ENV])
    trace = trace_file(args.profiler)
    _, accumulation, _ = SCENARIOS[args.scenario]
    steps = args.warmup + args.steps
    cpu = args.device == "cpu"
    training_args = sft_config(run_dir / "output", args.scenario, steps, use_cpu=cpu)
    calls = LossCalls(args, trace)
    model = trainer_llama()
    hooks = [
        model.register_forward_pre_hook(calls.enter_forward),
        model.register_forward_hook(calls.leave_forward),
    ]
    trainer = calls.trainer()(
        model=model,
        args=training_args,
        train_dataset=sft_samples(steps * BATCH * accumulation),
        processing_class=tiny_tokenizer(),
        callbacks=[calls.callback()],
    )
    trainer.train()
    for hook in hooks:
        hook.remove()
    return profiled_rank(args, trainer.args.device, calls.seconds, trace)


if __name__ == "__main__":
    main()
