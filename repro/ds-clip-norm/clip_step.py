"""One rank of the ZeRO 1/2 clipping reproducer: a real DeepSpeed engine trained for a few steps.

Started by `python -m hostsync repro` (ranks forked from one import of this script; torchrun
works the same), gloo on CPU, NCCL with one GPU per rank, one run per scenario: the case card
gives each scenario its ZeRO stage and precision. Every rank builds the same
tiny two-layer model with the two parameter groups a Trainer makes (weight decay / none), wraps
it in `deepspeed.initialize` with gradient clipping 1.0 at the ZeRO stage and precision asked
for, and trains it. Returned through `rank_entry`:

- the host syncs of each step's `engine.backward` + `engine.step`, by source line
  (`hostsync.detector`), and the same reads by the ZeRO method that caused them (a line inside
  a shared helper such as `is_invalid_grad_norm` does not say which caller paid for it);
- how many of the clip's reads come after a parameter group's optimizer update was queued in
  the same step: the reads that wait for an update. ZeRO 1/2's `step` reads the norm before its
  per-group loop, so only the second and later groups' reads are such waits;
- what training did: loss, global grad norm, whether the step was applied, the skipped-step
  count and a checksum of the weights after each step. One step gets an infinite gradient from
  a backward hook (`--overflow-step`): the step is skipped, or, in bf16 with
  `--no-overflow-check`, the invalid norm reaches the clip under test.

The scenario's row (see `hostsync.measure.repro`) holds the reads per step, in the clip and in all,
the sites of the last step, its reads, stalls and device work (`cost`: that step's scope accounts),
the kernels each of its clip reads waited for (the first group's follow the step's own read of the
norm, the later groups' a group's update), and `training`, everything the fix must leave unchanged.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
from collections import Counter
from pathlib import Path

import deepspeed
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from hostsync.detector import Cost, SyncScope
from hostsync.rank.protocol import RankRow, ReproRank, rank_entry, repro_parser

HIDDEN = 16
SCALAR_READ = torch.ops.aten._local_scalar_dense.default
# The update of one parameter group by the fused AdamW the scenarios train with.
GROUP_UPDATE = torch.ops.aten._fused_adamw_
ZERO_PACKAGE = ("deepspeed", "runtime", "zero")
# BF16_Optimizer (ZeRO 1 in bf16 with fp32 gradient accumulation) lives beside the ZeRO package.
BF16_OPTIMIZER = ("deepspeed", "runtime", "bf16_optimizer.py")
# The clips under test: ZeRO 1/2's, and the one BF16_Optimizer calls.
CLIPS = ("unscale_and_clip_grads", "clip_tensors_by_global_norm")
DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    """What a scenario sets of the engine: the card's launch arguments (the profile's too)."""
    parser.add_argument("--zero-stage", type=int, choices=(1, 2, 3), default=1)
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bf16")
    parser.add_argument(
        "--grad-accum-dtype",
        choices=("fp32",),
        help="fp32 gradient accumulation: ZeRO 1 in bf16 then runs BF16_Optimizer",
    )
    parser.add_argument(
        "--no-overflow-check",
        action="store_true",
        help="bf16 check_grad_overflow off: an invalid norm then reaches the clip",
    )


def parse_args() -> argparse.Namespace:
    parser = repro_parser(__doc__.splitlines()[0])
    add_engine_arguments(parser)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--overflow-step", type=int, default=4, help="0: none")
    args = parser.parse_args()
    if len(args.scenarios) != 1:
        parser.error("one scenario per run: the card gives each its own stage and precision")
    (args.scenario,) = args.scenarios
    return args


class ReadsByZeroMethod(TorchDispatchMode):
    """Counts scalar reads by the innermost optimizer function on the stack: one of
    `deepspeed/runtime/zero/` or BF16_Optimizer's, or a clip they call; and the clip's reads
    made after a group's optimizer update was queued."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: Counter[str] = Counter()
        self.clip_reads_after_an_update = 0
        self.update_queued = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is SCALAR_READ:
            where = _zero_caller(sys._getframe(1))
            self.counts[where] += 1
            self.clip_reads_after_an_update += self.update_queued and where.endswith(CLIPS)
        elif func.overloadpacket is GROUP_UPDATE:
            self.update_queued = True
        return func(*args, **(kwargs or {}))


def _zero_caller(frame) -> str:
    while frame is not None:
        path = Path(frame.f_code.co_filename)
        optimizer = path.parent.parts[-3:] == ZERO_PACKAGE or path.parts[-3:] == BF16_OPTIMIZER
        if optimizer or frame.f_code.co_name in CLIPS:
            return f"{path.name}:{frame.f_lineno} {frame.f_code.co_name}"
        frame = frame.f_back
    return "<outside the optimizers>"


def tiny_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(HIDDEN, 2 * HIDDEN), torch.nn.ReLU(), torch.nn.Linear(2 * HIDDEN, HIDDEN)
    )


def trainer_param_groups(
    model: torch.nn.Module,
) -> list[dict[str, list[torch.nn.Parameter] | float]]:
    """Weight decay on the weights, none on the biases: the two groups a Trainer builds."""
    named = list(model.named_parameters())
    return [
        {"params": [p for n, p in named if not n.endswith("bias")], "weight_decay": 0.01},
        {"params": [p for n, p in named if n.endswith("bias")], "weight_decay": 0.0},
    ]


def engine_config(args: argparse.Namespace) -> dict:
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": args.zero_stage},
    }
    if args.dtype == "bf16":
        config["bf16"] = {"enabled": True, "check_grad_overflow": not args.no_overflow_check}
    if args.grad_accum_dtype:
        config["data_types"] = {"grad_accum_dtype": args.grad_accum_dtype}
    return config


def weights_checksum(engine) -> float:
    """Sum of the weights as every rank sees them (ZeRO 3 gathers its shards for the read)."""
    params = list(engine.module.parameters())
    with deepspeed.zero.GatheredParameters(params, enabled=engine.zero_optimization_stage() == 3):
        return float(sum(p.detach().double().sum() for p in params))


def engine_for(args: argparse.Namespace):
    """The engine of a scenario, its process group made: the tiny model, a Trainer's parameter
    groups, fused AdamW (the Trainer's default optimizer, adamw_torch_fused)."""
    if args.device == "cuda":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    deepspeed.init_distributed(dist_backend="nccl" if args.device == "cuda" else "gloo")
    model = tiny_model()
    optimizer = torch.optim.AdamW(trainer_param_groups(model), lr=1e-2, fused=True)
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=engine_config(args))
    return engine


def batches(engine, dtype: str, count: int):
    """This rank's inputs and targets, one pair per step."""
    data = torch.Generator().manual_seed(1234 + int(os.environ["RANK"]))
    for _ in range(count):
        inputs = torch.randn(1, HIDDEN, generator=data).to(engine.device, DTYPES[dtype])
        target = torch.randn(1, HIDDEN, generator=data).to(engine.device, torch.float32)
        yield inputs, target


def train(args: argparse.Namespace) -> tuple[object, list[dict], Cost | None, list[int]]:
    """The engine; for each step, what it read on the host and what training did; the last
    step's cost (None without the detector) and the kernels each of its clip reads waited for."""
    engine = engine_for(args)
    steps, cost, clip_waits = [], None, []
    for step, (inputs, target) in enumerate(batches(engine, args.dtype, args.steps), start=1):
        hook = None
        if step == args.overflow_step:
            # A real infinite gradient, entering DeepSpeed's reduction like any other.
            weight = engine.module[0].weight
            hook = weight.register_hook(lambda grad: torch.full_like(grad, math.inf))
        loss = torch.nn.functional.mse_loss(engine(inputs).float(), target)
        # The detector's mode on top, so that it sees each read at its own source line.
        counting = not args.no_detector
        accounting = counting and step == args.steps
        detector = SyncScope(account=accounting) if counting else contextlib.nullcontext()
        with ReadsByZeroMethod() as by_method, detector as scope:
            engine.backward(loss)
            engine.step()
        if hook is not None:
            hook.remove()
        if accounting:
            cost = scope.cost()
            clip_waits = [e.waited_for.kernels for e in scope.events if _in_clip(e)]
        norm = engine.get_global_grad_norm()
        steps.append(
            {
                "step": step,
                "loss": float(loss),
                "grad_norm": None if norm is None else float(norm),
                "step_applied": bool(engine.was_step_applied()),
                "skipped_steps": int(engine.skipped_steps),
                "weights_checksum": weights_checksum(engine),
                "sync_sites": scope.sync_sites() if counting else [],
                "reads_by_zero_method": dict(by_method.counts.most_common()),
                "clip_reads_after_an_update": by_method.clip_reads_after_an_update,
            }
        )
    return engine, steps, cost, clip_waits


def _in_clip(event) -> bool:
    """A read made by a clip under test, or by a helper it called."""
    return event.site.function in CLIPS or event.caller.rsplit(":", 1)[-1] in CLIPS


@rank_entry
def main() -> ReproRank:
    args = parse_args()
    engine, steps, cost, clip_waits = train(args)
    by_method = [step["reads_by_zero_method"] for step in steps]
    row = RankRow(
        scenario=args.scenario,
        cost=cost,
        site_lists={"sync_sites": tuple(steps[-1]["sync_sites"])},
        figures={
            "zero_stage": args.zero_stage,
            "dtype": args.dtype,
            "overflow_check": not args.no_overflow_check,
            "steps": args.steps,
            "overflow_step": args.overflow_step,
            "optimizer": type(engine.optimizer).__name__,
            "param_groups": len(engine.optimizer.param_groups),
            "device": str(engine.device),
            "clip_reads_per_step": [
                sum(n for where, n in counts.items() if where.endswith(CLIPS))
                for counts in by_method
            ],
            "clip_reads_after_an_update_per_step": [
                step["clip_reads_after_an_update"] for step in steps
            ],
            "reads_per_step": [sum(counts.values()) for counts in by_method],
            "clip_read_waited_kernels": clip_waits,
            "reads_by_zero_method": by_method[-1],
            "skipped_steps": steps[-1]["skipped_steps"],
            # What the fix must not change, step by step.
            "training": {
                key: [step[key] for step in steps]
                for key in (
                    "loss",
                    "grad_norm",
                    "step_applied",
                    "skipped_steps",
                    "weights_checksum",
                )
            },
        },
    )
    return ReproRank((row,))


if __name__ == "__main__":
    main()
