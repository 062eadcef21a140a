"""The census's records: a setup as `census.toml` describes it, and the census's result.

Each setup's run on each column is a `HuntTree`, which the site layer holds.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import ClassVar

from hostsync.detector.codec import Record, Strict
from hostsync.detector.sites import AllowRule
from hostsync.sites.records import HuntTree
from hostsync.workspace.records import Environment, Precision, Result, TreeInfo


class TrainerKind(StrEnum):
    """Which training loop a census setup runs: the Trainer, one of TRL's trainers, or a loop
    of a user's own over accelerate (prepare, backward, clip_grad_norm_, step)."""

    TRAINER = "Trainer"
    SFT = "SFTTrainer"
    DPO = "DPOTrainer"
    REWARD = "RewardTrainer"
    GRPO = "GRPOTrainer"
    ACCELERATE_LOOP = "accelerate-loop"


@dataclass(frozen=True)
class CensusSetup(Strict):
    """One training setup users run, as `census.toml` describes it: the trainer, how many ranks,
    DeepSpeed's ZeRO stage (0: none; several ranks then train with DDP), the precision, and the
    options that change which code a step runs."""

    about: str
    trainer: TrainerKind = TrainerKind.TRAINER
    ranks: int = 1
    zero_stage: int = 0
    # FSDP2 (torch's fully_shard) over the ranks, as the Trainer or accelerate set it up.
    fsdp: bool = False
    precision: Precision = Precision.FP32
    sp: bool = False
    batch_size: int = 1
    gradient_accumulation_steps: int = 1
    gradient_checkpointing: bool = False
    packing: bool = False
    padding_free: bool = False
    lora: bool = False
    logging_steps: int = 1
    eval_steps: int = 0
    num_input_tokens_seen: bool = False
    # The Trainer compiles the model (torch.compile): reported as compiled, not judged.
    torch_compile: bool = False
    # Left out of the default matrix (`census --setups NAME` runs it).
    extra: bool = False


@dataclass(frozen=True)
class CensusTrees(Record):
    """What one column of the census ran: the tree under test, the trees imported beside it,
    and the cases whose series they carry (none: the releases as published)."""

    tree: TreeInfo
    stacked: tuple[TreeInfo, ...]
    cases: tuple[str, ...]


@dataclass(frozen=True)
class CensusResult(Result):
    """Every host sync of every census setup, on the releases as published (`today`) and with
    every carried fix applied (`fixed`): one hunt record per setup and column."""

    KIND: ClassVar[str] = "census"
    DETECTED: ClassVar[bool] = True
    environment: Environment
    steps: int
    setups: dict[str, CensusSetup]
    columns: dict[str, CensusTrees]
    allowlist: tuple[AllowRule, ...]
    runs: tuple[HuntTree, ...]
    wall_s: float
