"""One rank of `python -m hostsync profile` for the nan/inf filter: Trainer steps, profiled.

Started through torchrun (one rank). Trains the reproducer's tiny Llama with the real Trainer
and, for each optimizer step, opens the measured range when the step begins and closes it when
it ends (`TrainerCallback.on_step_begin`/`on_step_end`); the forward and backward
(`Trainer.training_step`, wrapped by a subclass, the Trainer itself untouched) run in the
excluded range inside it. What is left in the range is the training loop's own work around
them: the nan/inf filter, gradient clipping, the optimizer step. The first `--warmup` steps are
not recorded; the PyTorch profiler records the next `--steps` and writes this rank's trace.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from pathlib import Path

import torch
import torch.distributed as dist
from train import SCENARIOS  # torchrun puts this script's folder first

from hostsync.protocol import EXCLUDED_RANGE, MEASURED_RANGE, RUN_DIR_ENV, rank_entry
from hostsync.rankkit import samples, trainer_llama, training_arguments


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    # The scenarios that make no loss non-finite: nothing here injects one.
    parser.add_argument("--scenario", default="finite", choices=("finite", "filter_off"))
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--profiler", choices=("torch",), default="torch")
    parser.add_argument("--warmup", type=int, default=2, help="unprofiled steps first")
    parser.add_argument("--steps", type=int, default=3, help="profiled steps")
    return parser.parse_args()


class StepRanges:
    """Trainer callbacks: each step in the measured range, the profiler over the last steps."""

    def __init__(self, warmup: int, trace: Path, cuda: bool) -> None:
        self.warmup, self.trace, self.cuda = warmup, trace, cuda
        self.profiler: torch.profiler.profile | None = None
        self.open: contextlib.ExitStack | None = None
        self.seconds: list[float] = []
        self.started = 0.0

    def on_step_begin(self, args, state, control, **_) -> None:
        if state.global_step == self.warmup:
            activities = [torch.profiler.ProfilerActivity.CPU]
            activities += [torch.profiler.ProfilerActivity.CUDA] if self.cuda else []
            self.profiler = torch.profiler.profile(activities=activities)
            self.profiler.start()
        self.open = contextlib.ExitStack()
        self.open.enter_context(torch.profiler.record_function(MEASURED_RANGE))
        self.started = time.perf_counter()

    def on_step_end(self, args, state, control, **_) -> None:
        self.open.close()
        if self.profiler is not None:
            self.seconds.append(time.perf_counter() - self.started)

    def on_train_end(self, args, state, control, **_) -> None:
        if self.profiler is not None:
            if self.cuda:
                torch.cuda.synchronize()
            self.profiler.stop()
            self.profiler.export_chrome_trace(str(self.trace))


@rank_entry
def main() -> dict:
    from transformers import Trainer, TrainerCallback

    args = parse_args()
    run_dir = Path(os.environ[RUN_DIR_ENV])
    trace = run_dir / "trace-rank0.json.gz"
    what, accumulation, _, nan_inf_filter = SCENARIOS[args.scenario]
    steps = args.warmup + args.steps
    ranges = StepRanges(args.warmup, trace, cuda=args.device == "cuda")

    class Callbacks(TrainerCallback):
        on_step_begin = ranges.on_step_begin
        on_step_end = ranges.on_step_end
        on_train_end = ranges.on_train_end

    class ExcludingForwardAndBackward(Trainer):
        def training_step(self, *inputs, **kwargs):
            with torch.profiler.record_function(EXCLUDED_RANGE):
                return super().training_step(*inputs, **kwargs)

    training_args = training_arguments(
        run_dir / "output", max_steps=steps, gradient_accumulation_steps=accumulation,
        logging_steps=steps, logging_nan_inf_filter=nan_inf_filter, lr_scheduler_type="linear",
        use_cpu=args.device == "cpu",
    )  # fmt: skip
    trainer = ExcludingForwardAndBackward(
        model=trainer_llama(), args=training_args, train_dataset=samples(steps * accumulation),
        callbacks=[Callbacks()],
    )  # fmt: skip
    trainer.train()
    return {
        "rank": 0,
        "world_size": 1,
        "backend": dist.get_backend() if dist.is_initialized() else "none",
        "device": str(trainer.args.device),
        "scenario": args.scenario,
        "what": what,
        "warmup_steps": args.warmup,
        "steps": args.steps,
        "range_seconds": ranges.seconds,
        "trace": trace.name,
    }


if __name__ == "__main__":
    main()
