"""What rank scripts share: the tiny model and its samples, the Trainer's settings for a short
run, the arguments `accelerate launch` passes, JSON-safe numbers, named profiler ranges, the
recording of the profiled steps and the record of a step watched by the detector.

Rank scripts import this module, `hostsync.rank.protocol`, `hostsync.detector`, torch and the tree
under test, nothing else of the workspace. transformers is imported inside the functions that
need it, so that an import error of the tree under test is reported by `rank_entry` with the
rank and the reason, and a DeepSpeed-only script does not import it at all.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import functools
import math
import os
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from hostsync.detector.codec import dump
from hostsync.detector.sites import Site
from hostsync.rank.protocol import EXCLUDED_RANGE, MEASURED_RANGE, PROFILED_RANGE, RUN_DIR_ENV
from hostsync.rank.records import ProfiledRank
from hostsync.sites.records import HuntStep, StepSite

if TYPE_CHECKING:
    import datasets
    from accelerate import Accelerator
    from transformers import (
        PreTrainedModel,
        PreTrainedTokenizerFast,
        Trainer,
        TrainerCallback,
        TrainerControl,
        TrainerState,
        TrainingArguments,
    )

    from hostsync.detector import SyncScope

VOCAB, LAYERS, HEADS = 128, 2, 4  # four heads: Ulysses splits them over 2 or 4 ranks
SEQ_LEN = 16
HIDDEN = 32
# Positions whose label is -100, per sample, like an SFT prompt. The second sample masks the
# whole first half, so under SP its first shard has no token to learn from: the branch of
# `deepspeed_sp_compute_loss` that skips a rank with zero good tokens is taken on every other step.
PROMPT_LENGTHS = (3, SEQ_LEN // 2 + 1)
MODEL_SUMMARY = (
    f"{LAYERS} layers, hidden size {HIDDEN}, {HEADS} attention heads, vocabulary {VOCAB},"
    f" sequences of {SEQ_LEN} tokens with masked prompts"
)


def tiny_llama(
    hidden: int = HIDDEN, intermediate: int = 2 * HIDDEN, head: str = "CausalLM", **config: Any
) -> PreTrainedModel:
    """A tiny `LlamaFor<head>` (CausalLM, or SequenceClassification for a reward model) built
    from a config (nothing to download), the same weights on every rank (seeded); `config` sets
    further LlamaConfig fields."""
    import transformers

    torch.manual_seed(0)
    settings = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        attn_implementation="sdpa",  # type: ignore[call-arg]  # PreTrainedConfig's, by **kwargs
        **config,
    )
    model: PreTrainedModel = getattr(transformers, f"LlamaFor{head}")(settings)
    return model


def trainer_llama(head: str = "CausalLM") -> PreTrainedModel:
    """The Trainer runs' tiny Llama: positions for its samples' length and a little more; a
    reward model (`head="SequenceClassification"`) scores with one label."""
    reward = {"num_labels": 1, "pad_token_id": 0} if head == "SequenceClassification" else {}
    return tiny_llama(head=head, max_position_embeddings=2 * SEQ_LEN, **reward)


def samples(count: int) -> list[dict[str, torch.Tensor]]:
    """Deterministic token sequences with SFT-style masked prompts and explicit position_ids."""
    generator = torch.Generator().manual_seed(1234)
    data = []
    for index in range(count):
        input_ids = torch.randint(0, VOCAB, (SEQ_LEN,), generator=generator)
        labels = input_ids.clone()
        labels[: PROMPT_LENGTHS[index % len(PROMPT_LENGTHS)]] = -100
        positions = torch.arange(SEQ_LEN)
        data.append({"input_ids": input_ids, "labels": labels, "position_ids": positions})
    return data


def sft_samples(count: int, seed: int = 0) -> datasets.Dataset | None:
    """Pre-tokenized prompt-completion rows for TRL's SFTTrainer, of varying lengths (so that
    padding, packing and padding-free batches differ), each with its completion mask."""
    import datasets

    generator = torch.Generator().manual_seed(4321 + seed)
    rows: dict[str, list[list[int]]] = {"input_ids": [], "completion_mask": []}
    for index in range(count):
        length = SEQ_LEN // 2 + index % (SEQ_LEN // 2 + 1)
        prompt = PROMPT_LENGTHS[index % len(PROMPT_LENGTHS)] % length
        ids = torch.randint(_SPECIAL_TOKENS, VOCAB, (length,), generator=generator).tolist()
        rows["input_ids"].append(ids)
        rows["completion_mask"].append([0] * prompt + [1] * (length - prompt))
    return datasets.Dataset.from_dict(rows) if count else None


_SPECIAL_TOKENS = 2  # <pad> and <eos>, the first ids of the tiny tokenizer's vocabulary


def preference_samples(count: int, seed: int = 0) -> datasets.Dataset | None:
    """Prompt, chosen and rejected texts in the tiny tokenizer's words, for TRL's DPOTrainer and
    RewardTrainer (which tokenize them): prompts end in a space, since RewardTrainer joins the
    prompt and completion as strings, and completions end in the eos token, so none is added."""
    import datasets

    generator = torch.Generator().manual_seed(5678 + seed)

    def words(length: int) -> str:
        ids = torch.randint(_SPECIAL_TOKENS, VOCAB, (length,), generator=generator).tolist()
        return " ".join(f"t{i}" for i in ids)

    rows: dict[str, list[str]] = {"prompt": [], "chosen": [], "rejected": []}
    for index in range(count):
        rows["prompt"].append(words(PROMPT_LENGTHS[index % len(PROMPT_LENGTHS)]) + " ")
        for column in ("chosen", "rejected"):
            rows[column].append(f"{words(SEQ_LEN // 2 - 1 - index % 3)} <eos>")
    return datasets.Dataset.from_dict(rows) if count else None


def tiny_tokenizer() -> PreTrainedTokenizerFast:
    """A word-level tokenizer over the tiny model's vocabulary, built in memory (nothing to
    download): what SFTTrainer needs for its pad and eos tokens."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<pad>": 0, "<eos>": 1} | {f"t{i}": i for i in range(_SPECIAL_TOKENS, VOCAB)}
    words = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    return PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<pad>", eos_token="<eos>")


def add_launch_arguments(
    parser: argparse.ArgumentParser, precisions: tuple[str, ...] = ("bf16", "fp32")
) -> None:
    """What the `accelerate` launcher passes a script: where the Trainer writes, the process
    group's backend, the precision."""
    run_dir = os.environ.get(RUN_DIR_ENV)
    parser.add_argument(
        "--output-dir", type=Path, default=Path(run_dir) / "output" if run_dir else None
    )
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--precision", choices=precisions, default="fp32")


def training_arguments(
    output_dir: str | Path,
    *,
    precision: str = "fp32",
    kind: type[TrainingArguments] | None = None,
    **settings: Any,
) -> TrainingArguments:
    """`TrainingArguments` (or `kind`, e.g. TRL's SFTConfig) for a short deterministic run: one
    sample per device and step, a constant learning rate, sequential sampling, nothing saved or
    reported; `settings` add to or override them.

    bf16 on a machine without a GPU is what a GPU run passes: TrainingArguments refuses bf16
    without a GPU (its use_cpu way out also turns the DeepSpeed launch off), while DeepSpeed's
    CPU accelerator runs bf16, so it is set after the check and DeepSpeed's "auto" bf16 follows
    it as on a GPU.

    TreeLaunch ranks without a GPU train as one DDP group only with `use_cpu`: `ddp_backend` alone
    leaves accelerate's state not distributed (measured with transformers 5.24.0 and accelerate
    1.15.0: `NOT_PARALLEL`), each rank training alone, silently. DeepSpeed's ranks are set up by
    DeepSpeed, which `use_cpu` would turn off.
    """
    from transformers import TrainingArguments

    bf16 = precision == "bf16"
    kind = kind or TrainingArguments
    short_run: dict[str, Any] = {
        **({"use_cpu": True} if cpu_group() else {}),
        "per_device_train_batch_size": 1,
        "learning_rate": 1e-3,
        "lr_scheduler_type": "constant",
        "train_sampling_strategy": "sequential",
        "remove_unused_columns": False,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "seed": 0,
        "bf16": bf16 and torch.cuda.is_available(),
        "fp16": precision == "fp16",
    }
    arguments = kind(output_dir=str(output_dir), **(short_run | settings))
    if bf16:
        arguments.bf16 = True
    return arguments


def cpu_group() -> bool:
    """TreeLaunch ranks without a GPU and without DeepSpeed (which sets its ranks up itself):
    accelerate makes them one group only when told to run on CPU (`use_cpu`, `cpu=True`)."""
    launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    deepspeed = os.environ.get("ACCELERATE_USE_DEEPSPEED") == "true"  # how launchers pick it
    return launched and not deepspeed and not torch.cuda.is_available()


def check_one_group(accelerator: Accelerator) -> None:
    """Refuses a launched run whose ranks each train alone: its figures would be one rank's,
    without the collectives a distributed step runs."""
    if accelerator.num_processes > 1 and accelerator.distributed_type == "NO":
        raise RuntimeError(
            f"{accelerator.num_processes} ranks launched, but accelerate's state is not"
            " distributed: each rank would train alone (on CPU, TrainingArguments needs use_cpu)"
        )


def finite_or_name(value: float) -> float | str:
    """JSON has no nan/inf: those are written as their names."""
    return value if math.isfinite(value) else str(value)


@functools.cache
def nvtx_push_pop() -> tuple[Callable[[str], object], Callable[[], object]]:
    """NVTX's range push and pop: torch's own on a CUDA build; on a CPU build, which has none,
    libnvToolsExt's (Debian's libnvtoolsext1), so that Nsight Systems sees the ranges there too."""
    if torch.version.cuda:
        return torch.cuda.nvtx.range_push, torch.cuda.nvtx.range_pop
    found = ctypes.util.find_library("nvToolsExt")
    if found is None:
        raise RuntimeError(
            "NVTX ranges on a CPU build of torch need libnvToolsExt: install libnvtoolsext1"
            " (Debian non-free), or profile with --profiler torch"
        )
    library = ctypes.CDLL(found)
    return (lambda name: library.nvtxRangePushA(name.encode())), library.nvtxRangePop


@contextlib.contextmanager
def named_range(name: str, nvtx: bool) -> Iterator[None]:
    """A range the PyTorch profiler shows under `name`, and with `nvtx` Nsight Systems too."""
    push, pop = nvtx_push_pop() if nvtx else (None, None)
    with torch.profiler.record_function(name):
        if push:
            push(name)
        try:
            yield
        finally:
            if pop:
                pop()


@contextlib.contextmanager
def recording(profiler: str, cuda: bool, trace: Path | None) -> Iterator[None]:
    """Record the profiled steps run inside: with `torch`, the PyTorch profiler, its Chrome trace
    written to `trace`; with `nsys`, the NVTX range Nsight Systems captures (its capture range)."""
    if profiler == "nsys":
        with named_range(PROFILED_RANGE, nvtx=True):
            yield
            if cuda:
                torch.cuda.synchronize()  # so that the last step's copies are captured
        return
    activities = [torch.profiler.ProfilerActivity.CPU]
    activities += [torch.profiler.ProfilerActivity.CUDA] if cuda else []
    # No with_stack: on torch 2.13 long traces can then hold undecodable names (invalid JSON).
    with torch.profiler.profile(activities=activities, record_shapes=False) as profiler_:
        yield
        if cuda:
            torch.cuda.synchronize()  # so that the last step's kernels are in the trace
    profiler_.export_chrome_trace(str(trace))


def trace_file(profiler: str) -> Path | None:
    """Where this rank's Chrome trace goes under the PyTorch profiler (`torch`): the run's folder;
    None under Nsight Systems, which writes its own report. A Trainer joins its group only when
    it trains, so before that the launcher's `RANK` names the rank."""
    if profiler != "torch":
        return None
    joined = torch.distributed.is_initialized()
    rank = torch.distributed.get_rank() if joined else int(os.environ.get("RANK", "0"))
    return Path(os.environ[RUN_DIR_ENV]) / f"trace-rank{rank}.json.gz"


def profiled_steps(
    args: argparse.Namespace, step: Callable[[], float], cuda: bool
) -> tuple[list[float], Path | None]:
    """`args.warmup` steps, then `args.steps` steps recorded (`recording`): each recorded step's
    measured seconds, as `step` returns them, and the trace written."""
    trace = trace_file(args.profiler)
    for _ in range(args.warmup):
        step()
    with recording(args.profiler, cuda, trace):
        seconds = [step() for _ in range(args.steps)]
    return seconds, trace


def profiled_rank(
    args: argparse.Namespace,
    device: object,
    seconds: list[float],
    trace: Path | None,
    **more: object,
) -> ProfiledRank:
    """What a profile rank script returns, as `hostsync.profiling` reads it: where the rank ran,
    the steps recorded (`args.scenario`, `args.warmup`, `args.steps`), each measured range's
    seconds and the trace file; `more`, the script's own figures."""
    joined = torch.distributed.is_initialized()
    return ProfiledRank(
        rank=torch.distributed.get_rank() if joined else 0,
        world_size=torch.distributed.get_world_size() if joined else 1,
        backend=torch.distributed.get_backend() if joined else "none",
        device=str(device),
        scenario=args.scenario,
        warmup_steps=args.warmup,
        steps=args.steps,
        range_seconds=tuple(seconds),
        trace=trace.name if trace else None,
        more=dump(more),
    )


class TrainerSteps:
    """The profile of a `Trainer.train()`: each optimizer step in the measured range, from the
    step's begin to its end (`TrainerCallback.on_step_begin`/`on_step_end`), the steps after
    the first `warmup` recorded (`recording`); `excluding` sets the forward and backward
    (`Trainer.training_step`) apart. The Trainer itself runs unchanged."""

    def __init__(self, warmup: int, profiler: str, cuda: bool, trace: Path | None) -> None:
        self.warmup, self.profiler, self.cuda, self.trace = warmup, profiler, cuda, trace
        self.nvtx = profiler == "nsys"
        self.recorded = contextlib.ExitStack()
        self.step: contextlib.ExitStack | None = None
        self.seconds: list[float] = []
        self.started = 0.0

    def on_step_begin(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: object
    ) -> None:
        if state.global_step == self.warmup:
            self.recorded.enter_context(recording(self.profiler, self.cuda, self.trace))
        self.step = contextlib.ExitStack()
        self.step.enter_context(named_range(MEASURED_RANGE, self.nvtx))
        self.started = time.perf_counter()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: object
    ) -> None:
        if self.step is not None:
            self.step.close()
        if state.global_step > self.warmup:
            self.seconds.append(time.perf_counter() - self.started)

    def on_train_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: object
    ) -> None:
        self.recorded.close()

    def callback(self) -> TrainerCallback:
        """These methods as a `TrainerCallback`."""
        from transformers import TrainerCallback

        steps = self

        class StepRanges(TrainerCallback):
            on_step_begin = steps.on_step_begin
            on_step_end = steps.on_step_end
            on_train_end = steps.on_train_end

        return StepRanges()

    def excluding(self, trainer_class: type[Trainer]) -> type[Trainer]:
        """`trainer_class` with its forward and backward (`training_step`) in the excluded range."""
        nvtx = self.nvtx

        # A subclass of the class given: the type checker takes no variable as a base.
        class ExcludingForwardAndBackward(trainer_class):  # type: ignore[misc, valid-type]
            def training_step(self, *inputs: Any, **kwargs: Any) -> Any:
                with named_range(EXCLUDED_RANGE, nvtx):
                    return super().training_step(*inputs, **kwargs)

        return ExcludingForwardAndBackward


def hunt_step(step: int, warmup: bool, logging: bool, scope: SyncScope) -> HuntStep:
    """The record of one step watched by a closed `SyncScope(account=True)`: its sites, by
    caller too (a read inside a shared helper is paid for by whoever called it), how often each
    read and stalled, the step's cost and its reads of host memory."""
    found = Counter((event.kind, event.site, event.caller) for event in scope.events)
    stalled = Counter(
        (event.kind, event.site, event.caller) for event in scope.events if event.stall
    )
    sites = tuple(
        StepSite(kind, site, caller, count, stalled[kind, site, caller])
        for (kind, site, caller), count in sorted(found.items(), key=_site_order)
    )
    return HuntStep(step, warmup, logging, sites, scope.cost(), scope.host_reads)


def _site_order(item: tuple[tuple[str, Site, str], int]) -> tuple[str, int, str, str]:
    (kind, site, caller), _ = item
    return (site.file, site.line, caller, kind)
