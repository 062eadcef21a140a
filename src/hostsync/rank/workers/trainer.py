"""One rank of a real training run with the Trainer, one of TRL's trainers (SFT, DPO, reward) or
a plain accelerate loop, set up as users set it.

Started by `hostsync.launch.trainer_step` (the hunt: `accelerate launch`, DeepSpeed ZeRO, Ulysses
SP) or by the census (one setup each: ranks forked with the variables torchrun and `accelerate
launch` give them, or `accelerate launch` itself for SP). It builds a tiny Llama from a config (no
download), optionally with LoRA adapters or sharded with FSDP2 (the loop), trains it for a few steps
as a user would, and returns what it saw through `rank_entry`:

- the loss and grad norm the Trainer logged at each step;
- with `--detect-steps N`, every host sync of steps 1..N as `hostsync.detector` records it, each
  step from fetching its batch to the end of its logging, with whether it stalled and the
  step's reads, stalls and device work (`records.Cost`);
- with `--profile-step K`, the scalar reads of step K as the PyTorch profiler records them: it also
  sees reads made inside C++ kernels, which a dispatch mode cannot attribute.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import os
import re
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hostsync.detector import CompiledInScope
from hostsync.rank.protocol import (
    SYNC_OP,
    SYNC_OPS,
    Device,
    HuntRecording,
    HuntStep,
    LoggedStep,
    ProfiledRead,
    TrainerRank,
    rank_entry,
)
from hostsync.rank.rankkit import (
    MODEL_SUMMARY,
    SEQ_LEN,
    add_launch_arguments,
    check_one_group,
    cpu_group,
    hunt_step,
    preference_samples,
    samples,
    sft_samples,
    tiny_tokenizer,
    trainer_llama,
    training_arguments,
)
from hostsync.workspace.projects import PROJECTS

if TYPE_CHECKING:
    from accelerate import Accelerator
    from peft import LoraConfig
    from torch.autograd.profiler_util import FunctionEvent
    from transformers import PreTrainedModel, Trainer, TrainerCallback, TrainerState

    from hostsync.detector import SyncScope

# Every project's package, imported here, once, when the fork launcher imports this script: each
# forked rank then starts with them loaded. An import error of the tree under test is raised
# again in `main`, where `rank_entry` reports it with the rank.
for _name in PROJECTS:
    with contextlib.suppress(ImportError):
        importlib.import_module(_name)

# Every device-to-host read of a scalar reaches SYNC_OP; `.item()` and `bool(t)` wrap it in these.
PYTHON_LEVEL_READS = tuple(op for op in SYNC_OPS if op != SYNC_OP)
# The profiler names a Python function event "<path>(<line of its def>): <name>".
PYTHON_FRAME = re.compile(r"^(?P<file>.+\.py)\((?P<line>\d+)\): (?P<function>.+)$")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_launch_arguments(parser, precisions=("bf16", "fp16", "fp32"))
    parser.add_argument("--steps", type=int, default=2, help="optimizer steps in all")
    parser.add_argument("--logging-steps", type=int, default=1)
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="the Trainer's default")
    parser.add_argument("--detect-steps", type=int, default=0, help="steps 1..N under the detector")
    parser.add_argument("--profile-step", type=int, default=0, help="one step under the profiler")
    parser.add_argument(
        "--host-memory", default="[]", help="allow rules naming reads of host memory, as JSON"
    )
    parser.add_argument(
        "--trainer",
        default="Trainer",
        choices=(
            "Trainer",
            "SFTTrainer",
            "DPOTrainer",
            "RewardTrainer",
            "GRPOTrainer",
            "accelerate-loop",
        ),
    )
    parser.add_argument("--batch-size", type=int, default=1, help="per device")
    parser.add_argument("--gradient-accumulation-steps", type=int, default=1)
    parser.add_argument("--gradient-checkpointing", action="store_true")
    parser.add_argument("--packing", action="store_true", help="SFTTrainer: bfd packing")
    parser.add_argument("--padding-free", action="store_true", help="SFTTrainer: one flat row")
    parser.add_argument("--lora", action="store_true", help="train LoRA adapters (PEFT)")
    parser.add_argument("--fsdp", action="store_true", help="shard with FSDP2 (fully_shard)")
    parser.add_argument("--torch-compile", action="store_true", help="the Trainer compiles")
    parser.add_argument("--eval-steps", type=int, default=0, help="evaluate every N steps")
    parser.add_argument(
        "--num-input-tokens-seen",
        action="store_true",
        help="the Trainer counts the tokens it trained on",
    )
    return parser.parse_args()


def as_callback(mixin: type) -> type:
    """`mixin` as a TrainerCallback, which supplies the events it leaves out.

    Made at run time so that this module imports transformers only inside `main`: an import
    error of the tree under test is then reported by `rank_entry` with the rank and the reason.
    """
    from transformers import TrainerCallback

    return type(mixin.__name__, (mixin, TrainerCallback), {})


class LoggedValues:
    """What the Trainer logs (loss, grad_norm), by optimizer step."""

    def __init__(self) -> None:
        self.by_step: dict[int, LoggedStep] = {}

    def on_log(
        self,
        args: object,
        state: TrainerState,
        control: object,
        logs: dict[str, float] | None = None,
        **kwargs: object,
    ) -> None:
        if logs and "loss" in logs:
            norm = logs.get("grad_norm")
            self.by_step[state.global_step] = LoggedStep(
                float(logs["loss"]), None if norm is None else float(norm)
            )


class SyncHunt:
    """Watches whole optimizer steps: from fetching the step's batch to the end of its logging.

    The Trainer fetches each step's batches with `get_batch_samples`, so that call begins a step
    (ending the previous one); the end of the epoch ends the last. Steps up to `detected_steps`
    run under a detector scope. Step 1 is marked as the warm-up: it pays one-off costs (the
    epoch's data iterator, first-call caches). `profiled_step` runs under the PyTorch profiler
    instead, without the detector, whose re-dispatch would show up in the trace.
    """

    def __init__(self, detected_steps: int, profiled_step: int, host_memory: str = "[]") -> None:
        self.detected_steps = detected_steps
        self.host_memory = host_memory
        self.profiled_step = profiled_step
        self.steps: list[HuntStep] = []
        self.profiled: list[ProfiledRead] = []
        self._open = contextlib.ExitStack()
        self._step = 0
        self._logged = False

    def begin_step(self, step: int) -> None:
        """Start watching `step` (ending the previous one); repeated calls for a step are no-ops."""
        if step == self._step:
            return
        self.end_step()
        self._step, self._logged = step, False
        if step <= self.detected_steps:
            from hostsync.detector import AllowRule, SyncScope

            reading_host = [AllowRule(**rule) for rule in json.loads(self.host_memory)]
            scope = SyncScope(allow=reading_host, account=True)
            self._open.callback(self._keep_step, step, scope)
            self._open.enter_context(scope)
        elif step == self.profiled_step:
            profile = torch.profiler.profile(
                activities=[torch.profiler.ProfilerActivity.CPU], with_stack=True
            )
            self._open.callback(self._keep_profile, profile)
            self._open.enter_context(profile)

    def end_step(self) -> None:
        self._open.close()

    def on_epoch_begin(
        self, args: object, state: TrainerState, control: object, **kwargs: object
    ) -> None:
        # Before the epoch's iterator is made: step 1 covers its creation.
        self.begin_step(state.global_step + 1)

    def on_log(self, *args: object, **kwargs: object) -> None:
        self._logged = True

    def on_epoch_end(self, *args: object, **kwargs: object) -> None:
        self.end_step()

    def _keep_step(self, step: int, scope: SyncScope) -> None:
        self.steps.append(hunt_step(step, step == 1, self._logged, scope))

    def _keep_profile(self, profile: torch.profiler.profile) -> None:
        found = Counter(_attribute(event) for event in profile.events() if event.name == SYNC_OP)
        self.profiled = [
            ProfiledRead(self.profiled_step, self._logged, file, function, via, count)
            for (file, function, via), count in sorted(found.items(), key=str)
        ]


def _attribute(event: FunctionEvent) -> tuple[str, str, str | None]:
    """(file, function, via) of a profiled read: the innermost Python function outside torch
    that led to it, as the detector attributes reads, and the outermost kernel it was made in
    when that is not a plain `.item()`/`bool()` (a read no dispatch mode can see).
    """
    from hostsync.detector import package_path

    via = None
    parent = event.cpu_parent
    while parent is not None:
        frame = PYTHON_FRAME.match(parent.name)
        if frame:
            # The profiler shortens the paths it can to their package, like package_path.
            file = frame["file"]
            file = package_path(file) if Path(file).is_absolute() else file
            if not file.startswith("torch/"):
                return file, frame["function"], via
        elif parent.name.startswith("aten::") and parent.name not in PYTHON_LEVEL_READS:
            via = parent.name
        parent = parent.cpu_parent
    return "<no Python frame>", "", via


def hunting_trainer(hunt: SyncHunt, base: type[Trainer]) -> type[Trainer]:
    """`base` (a Trainer) telling `hunt` when each optimizer step starts fetching its batch."""

    # A subclass of the class given: the type checker takes no variable as a base.
    class HuntingTrainer(base):  # type: ignore[misc, valid-type]
        def get_batch_samples(self, *args: Any, **kwargs: Any) -> Any:
            hunt.begin_step(self.state.global_step + 1)
            return super().get_batch_samples(*args, **kwargs)

    return HuntingTrainer


def lora_config() -> LoraConfig:
    """Rank 4 adapters on the attention's query and value projections, PEFT's usual targets."""
    from peft import LoraConfig

    return LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], task_type="CAUSAL_LM")


GENERATIONS = 2  # GRPO's group: completions per prompt


def even_words(completions: list[str], **_: object) -> list[float]:
    """GRPO's reward: how many of a completion's words are even-numbered tokens, a rule that
    tells completions apart (so their advantages, and the loss, are not all zero)."""
    return [float(sum(word[-1:] in "02468" for word in c.split())) for c in completions]


def build_trainer(
    args: argparse.Namespace, callbacks: list[TrainerCallback], hunt: SyncHunt | None
) -> Trainer:
    """The Trainer or TRL trainer of the setup, with enough samples for one epoch."""
    world_size = int(os.environ.get("WORLD_SIZE", "1"))
    per_step = args.batch_size * args.gradient_accumulation_steps * world_size
    count = per_step * args.steps
    eval_count = 2 * args.batch_size * world_size if args.eval_steps else 0
    settings: dict[str, Any] = {
        "precision": args.precision,
        "max_steps": args.steps,
        "max_grad_norm": args.max_grad_norm,
        "logging_steps": args.logging_steps,
        "per_device_train_batch_size": args.batch_size,
        "per_device_eval_batch_size": args.batch_size,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "eval_strategy": "steps" if args.eval_steps else "no",
        "eval_steps": args.eval_steps or None,
        "include_num_input_tokens_seen": args.num_input_tokens_seen,
        # Set only when asked for: transformers 5.24 deprecates the name, even set to False.
        **({"gradient_checkpointing": True} if args.gradient_checkpointing else {}),
        **({"torch_compile": True} if args.torch_compile else {}),
        "ddp_backend": args.backend,
    }
    reward = args.trainer == "RewardTrainer"
    model: torch.nn.Module = trainer_llama("SequenceClassification" if reward else "CausalLM")
    peft_config = lora_config() if args.lora else None
    extra: dict[str, Any] = {}
    # A list of samples, or a datasets.Dataset
    train: Any
    evaluation: Any
    if args.trainer == "Trainer":
        from transformers import Trainer

        if peft_config:
            from peft import get_peft_model

            model = get_peft_model(model, peft_config)
        base = Trainer
        training_args = training_arguments(args.output_dir, **settings)
        train, evaluation = samples(count), samples(eval_count) or None
    else:
        import trl

        base = getattr(trl, args.trainer)
        config = getattr(trl, args.trainer.replace("Trainer", "Config"))
        extra |= {"processing_class": tiny_tokenizer(), "peft_config": peft_config}
        if args.trainer == "SFTTrainer":
            # Padding-free batches without packing leave truncation to the data (SFTConfig).
            if args.padding_free and not args.packing:
                settings["max_length"] = None
            training_args = training_arguments(
                args.output_dir,
                kind=config,
                packing=args.packing,
                padding_free=args.padding_free,
                dataset_num_proc=None,
                **settings,
            )
            train, evaluation = sft_samples(count), sft_samples(eval_count, seed=1) or None
        elif args.trainer == "GRPOTrainer":
            # Two completions per prompt, generated by the tiny model itself, scored by a rule.
            training_args = training_arguments(
                args.output_dir,
                kind=config,
                num_generations=GENERATIONS,
                max_completion_length=SEQ_LEN // 2,
                **settings,
            )
            prompts = preference_samples(count)
            train = prompts.select_columns(["prompt"]) if prompts else None
            evaluation = None
            extra["reward_funcs"] = even_words
        else:
            training_args = training_arguments(args.output_dir, kind=config, **settings)
            train = preference_samples(count)
            evaluation = preference_samples(eval_count, seed=1) or None
        if args.trainer == "DPOTrainer" and not peft_config:
            # A model built from a config has no path DPOTrainer could load its reference from.
            extra["ref_model"] = trainer_llama()
    trainer_class = hunting_trainer(hunt, base) if hunt else base
    return trainer_class(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=evaluation,
        callbacks=callbacks,
        **extra,
    )


def shard_fsdp2(model: PreTrainedModel) -> None:
    """`model` sharded with torch's `fully_shard` as accelerate's FSDP2 does on a GPU: each
    decoder layer, then the root. accelerate sets FSDP up only on accelerators (its state runs a
    CPU world as MULTI_CPU), so on CPU the loop shards the model itself."""
    from torch.distributed.fsdp import fully_shard

    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)


def accelerate_loop(
    args: argparse.Namespace, hunt: SyncHunt | None
) -> tuple[Accelerator, dict[int, LoggedStep]]:
    """A user's own loop over accelerate, as its docs write one: prepare, backward,
    clip_grad_norm_ (whose norm is logged), step; DeepSpeed from the launch's variables, FSDP2
    with `--fsdp`. Each step is watched from fetching its first batch to its logging."""
    from accelerate import Accelerator
    from accelerate.utils import InitProcessGroupKwargs

    accelerator = Accelerator(
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        mixed_precision={"fp32": "no"}.get(args.precision, args.precision),
        cpu=cpu_group(),
        kwargs_handlers=[InitProcessGroupKwargs(backend=args.backend)],
    )
    check_one_group(accelerator)
    model = trainer_llama()
    if args.fsdp:
        shard_fsdp2(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    per_step = args.batch_size * args.gradient_accumulation_steps * accelerator.num_processes
    loader: torch.utils.data.DataLoader[dict[str, torch.Tensor]] = torch.utils.data.DataLoader(
        samples(per_step * args.steps),  # type: ignore[arg-type]  # a list is a map-style dataset
        batch_size=args.batch_size,
    )
    if args.fsdp:  # sharded already: accelerate would wrap it in DDP on top
        optimizer, loader = accelerator.prepare(optimizer, loader)
    else:
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    model.train()
    batches, logged = iter(loader), {}
    for step in range(1, args.steps + 1):
        if hunt:
            hunt.begin_step(step)
        for _ in range(args.gradient_accumulation_steps):
            with accelerator.accumulate(model):
                loss = model(**next(batches)).loss
                accelerator.backward(loss)
                if accelerator.sync_gradients:
                    grad_norm = accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()
                optimizer.zero_grad()
        if step % args.logging_steps == 0:
            logged[step] = LoggedStep(loss.item(), float(grad_norm))
            if hunt:
                hunt.on_log(args, None, None)
    if hunt:
        hunt.end_step()
    return accelerator, logged


@rank_entry
def main() -> TrainerRank:
    started = time.monotonic()
    args = parse_args()
    hunting = args.detect_steps or args.profile_step
    not_judged = None
    if args.trainer == "accelerate-loop":
        hunt = SyncHunt(args.detect_steps, args.profile_step, args.host_memory) if hunting else None
        accelerator, logged = accelerate_loop(args, hunt)
        device = accelerator.device
    else:
        values = as_callback(LoggedValues)()
        hunt = (
            as_callback(SyncHunt)(args.detect_steps, args.profile_step, args.host_memory)
            if hunting
            else None
        )
        trainer = build_trainer(args, [values, *([hunt] if hunt else [])], hunt)
        check_one_group(trainer.accelerator)
        try:
            trainer.train()
        except CompiledInScope as error:
            # Compiled graphs run fused kernels no scope can judge: said so, not measured.
            if hunt:
                hunt.end_step()
            not_judged = f"compiled, not judged: {error}"
        accelerator, logged, device = trainer.accelerator, values.by_step, trainer.args.device
    pc = getattr(accelerator, "parallelism_config", None)
    recorded = HuntRecording(tuple(hunt.steps), tuple(hunt.profiled), not_judged) if hunt else None
    return TrainerRank(
        world_size=accelerator.num_processes,
        sp_size=pc.sp_size if pc is not None and pc.sp_enabled else 1,
        device=Device(device.type),
        backend=args.backend,
        model=MODEL_SUMMARY,
        logged={str(step): values for step, values in sorted(logged.items())},
        seconds=round(time.monotonic() - started, 1),
        hunt=recorded,
    )


if __name__ == "__main__":
    main()
