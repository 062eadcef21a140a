"""One rank of the nan/inf loss filter reproducer: the real `Trainer.train()`, syncs counted.

`Trainer._run_epoch` filters nan/inf training losses out of the logged loss
(`logging_nan_inf_filter`, on by default). Up to transformers 5.24.0 it decides with
`torch.isnan(loss) or torch.isinf(loss)`: one or two host reads per micro-batch.

Each scenario trains a tiny Llama built from a config (no download) for a few optimizer steps,
logging every step (one scenario every 2), with the whole training under
`hostsync.detector.SyncScope`. A forward hook makes the loss of one chosen micro-batch nan or inf by
adding a constant: the value is non-finite like a real overflow, the gradients stay finite (as the
filter only changes what is logged), and the hook marks where each micro-batch starts, so each sync
is attributed to its micro-batch.

Started with plain `python` (single-process scenarios, several per process), or by
`accelerate launch` with DeepSpeed ZeRO 1 + Ulysses SP over 2 ranks (scenario `sp`, one per
launch), as the case card says. Returns through `rank_entry` one row per scenario: the syncs of
each micro-batch made directly in `_run_epoch` of transformers/trainer.py, by source line, and
the losses the Trainer logged.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
from collections import Counter

from hostsync.detector import Site, SiteCount
from hostsync.rank.protocol import RankRow, ReproRank, rank_entry, repro_parser

# The hunt's tiny Llama and its SFT-style samples: the same model in both.
from hostsync.rank.rankkit import (
    MODEL_SUMMARY,
    add_launch_arguments,
    finite_or_name,
    samples,
    trainer_llama,
    training_arguments,
)

SITE_FILE = "transformers/trainer.py"
SITE_FUNCTION = "_run_epoch"

# name: (what it shows, gradient accumulation steps, {micro-batch index: added loss}, filter on,
# logging steps)
SCENARIOS: dict[str, tuple[str, int, dict[int, float], bool, int]] = {
    "finite": ("every micro-batch finite", 1, {}, True, 1),
    "nan": ("micro-batch 2 of 4 has a nan loss", 1, {2: math.nan}, True, 1),
    "inf": ("micro-batch 2 of 4 has an inf loss", 1, {2: math.inf}, True, 1),
    "grad_accum": ("2 micro-batches per step, micro-batch 3 of 8 nan", 2, {3: math.nan}, True, 1),
    "filter_off": ("logging_nan_inf_filter=False, micro-batch 2 nan", 1, {2: math.nan}, False, 1),
    "nan_logged_every_2": (
        "logging every 2 steps, micro-batch 2 of 4 nan",
        1,
        {2: math.nan},
        True,
        2,
    ),
    "sp": ("DeepSpeed Ulysses SP over 2 ranks, micro-batch 2 nan", 1, {2: math.nan}, True, 1),
}
STEPS = 4


def parse_args() -> argparse.Namespace:
    parser = repro_parser(__doc__.splitlines()[0], known=SCENARIOS)
    add_launch_arguments(parser, precisions=("fp32",))  # as accelerate launches: fp32 only
    return parser.parse_args()


class MicroBatches:
    """A forward hook: adds the scenario's nan/inf to the chosen micro-batches' loss, and notes
    how many syncs the scope had recorded when each micro-batch's forward ended."""

    def __init__(self, scope, added_loss: dict[int, float]) -> None:
        self.scope = scope
        self.added_loss = added_loss
        self.starts: list[int] = []

    def __call__(self, module, args, kwargs, output):
        index = len(self.starts)
        self.starts.append(len(self.scope.events) if self.scope else 0)
        if index in self.added_loss and output.loss is not None:
            # A constant: the loss value is non-finite, its gradient is the model's own.
            output.loss = output.loss + self.added_loss[index]
        return output

    def site_syncs(self) -> tuple[list[int], tuple[SiteCount, ...]]:
        """Syncs made directly in the site's function, per micro-batch and per source line (with
        their kinds)."""
        bounds = [*self.starts, len(self.scope.events)]
        per_batch = [0] * len(self.starts)
        lines: Counter[Site] = Counter()
        kinds: dict[Site, set[str]] = {}
        for position, event in enumerate(self.scope.events):
            site = event.site
            if site.file != SITE_FILE or site.function != SITE_FUNCTION:
                continue
            batch = next((i for i in range(len(self.starts)) if position < bounds[i + 1]), None)
            if batch is not None:
                per_batch[batch] += 1
            lines[site] += 1
            kinds.setdefault(site, set()).add(event.kind)
        by_line = tuple(
            SiteCount(site, count, tuple(sorted(kinds[site])))
            for site, count in sorted(lines.items())
        )
        return per_batch, by_line


def run_scenario(name: str, args: argparse.Namespace) -> RankRow:
    from transformers import Trainer

    from hostsync.detector import SyncScope

    what, accumulation, added_loss, nan_inf_filter, logging_steps = SCENARIOS[name]
    training_args = training_arguments(
        f"{args.output_dir}/{name}",
        max_steps=STEPS,
        gradient_accumulation_steps=accumulation,
        logging_steps=logging_steps,
        logging_nan_inf_filter=nan_inf_filter,
        # TreeLaunch ranks need a backend (and on CPU `use_cpu`, which training_arguments adds);
        # one process must not.
        ddp_backend=args.backend if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
    )
    model = trainer_llama()
    trainer = Trainer(model=model, args=training_args, train_dataset=samples(STEPS * accumulation))
    with SyncScope(account=True) if args.detect else contextlib.nullcontext() as scope:
        micro_batches = MicroBatches(scope, added_loss)
        hook = model.register_forward_hook(micro_batches, with_kwargs=True)
        try:
            trainer.train()
        finally:
            hook.remove()
    per_batch, by_line = micro_batches.site_syncs() if args.detect else (None, ())
    pc = getattr(trainer.accelerator, "parallelism_config", None)
    plugin = trainer.accelerator.state.deepspeed_plugin
    return RankRow(
        scenario=name,
        cost=scope.cost(STEPS) if args.detect else None,
        site_lists={"site_lines": by_line},
        figures={
            "what": what,
            "zero_stage": plugin.zero_stage if plugin is not None else None,
            "gradient_accumulation_steps": accumulation,
            "logging_nan_inf_filter": nan_inf_filter,
            "logging_steps": logging_steps,
            "non_finite_micro_batches": {str(i): str(v) for i, v in added_loss.items()},
            "world_size": trainer.accelerator.num_processes,
            "sp_size": pc.sp_size if pc is not None and pc.sp_enabled else 1,
            "deepspeed": trainer.is_deepspeed_enabled,
            "device": str(trainer.args.device),
            "micro_batches": len(per_batch) if per_batch is not None else None,
            "losses": [
                finite_or_name(entry["loss"])
                for entry in trainer.state.log_history
                if "loss" in entry
            ],
            "syncs_per_micro_batch": per_batch,
            "logged": [
                {
                    "step": entry["step"],
                    "loss": finite_or_name(entry["loss"]),
                    "grad_norm": finite_or_name(float(entry.get("grad_norm", math.nan))),
                }
                for entry in trainer.state.log_history
                if "loss" in entry
            ],
            "model": MODEL_SUMMARY,
        },
    )


@rank_entry
def main() -> ReproRank:
    args = parse_args()
    args.detect = not args.no_detector
    if "sp" in args.scenarios and len(args.scenarios) > 1:
        raise SystemExit("scenario 'sp' runs alone, under accelerate launch")
    return ReproRank(tuple(run_scenario(name, args) for name in args.scenarios))


if __name__ == "__main__":
    main()
