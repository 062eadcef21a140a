"""The census's setups, read from `census.toml` and checked before anything runs, and what each
asks of its launch: the worker's arguments, the launcher, the DeepSpeed config."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from hostsync.census.records import CensusSetup, TrainerKind
from hostsync.detector.codec import RecordError, Strict
from hostsync.launch import launchers
from hostsync.launch.launchers import LAUNCHERS, World
from hostsync.workspace.config import load_toml
from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.projects import DeepSpeedSetup, deepspeed_env
from hostsync.workspace.records import Launcher

FILE = "census.toml"


@dataclass(frozen=True)
class Matrix(Strict):
    """census.toml: the setups by name, and how many optimizer steps each runs."""

    steps: int
    setups: dict[str, CensusSetup]

    def __post_init__(self) -> None:
        if self.steps < 3:
            raise RecordError("steps", "must be 3 or more: the warm-up and steady steps")
        if not self.setups:
            raise RecordError("setups", "names no setup: add a [setups.NAME] table")
        for name, setup in self.setups.items():
            check(setup, f"setups.{name}")

    def chosen(self, names: list[str] | None) -> dict[str, CensusSetup]:
        """The setups `names` (every one not marked `extra` when None), in census.toml's order."""
        if names is None:
            found = {name: s for name, s in self.setups.items() if not s.extra}
            if not found:
                raise WorkspaceError(f"every setup of {FILE} is extra: name some with --setups")
            return found
        unknown = [name for name in names if name not in self.setups]
        if unknown:
            raise WorkspaceError(
                f"no setup {', '.join(unknown)} in {FILE}: the setups are {', '.join(self.setups)}"
            )
        return {name: self.setups[name] for name in self.setups if name in names}


def load(root: Path) -> Matrix:
    """census.toml, every setup checked field by field; refused in one line naming the field."""
    return load_toml(root / FILE, Matrix)


def check(setup: CensusSetup, name: str) -> None:
    """What types cannot say: the combinations a launch cannot run (`name`: the setup's path)."""
    if setup.ranks not in (1, 2):
        raise RecordError(f"{name}.ranks", "must be 1 or 2")
    if setup.zero_stage not in (0, 1, 2, 3):
        raise RecordError(f"{name}.zero_stage", "must be 0 (no DeepSpeed), 1, 2 or 3")
    if setup.sp and (setup.zero_stage == 0 or setup.ranks < 2):
        raise RecordError(f"{name}.sp", "Ulysses SP needs DeepSpeed (zero_stage 1-3) and 2 ranks")
    if setup.fsdp and (setup.zero_stage or setup.ranks < 2):
        raise RecordError(f"{name}.fsdp", "FSDP2 shards over 2 ranks, without DeepSpeed (zero 0)")
    if setup.fsdp and setup.trainer != TrainerKind.ACCELERATE_LOOP:
        # accelerate's state sets FSDP up only on accelerators; a CPU world runs as MULTI_CPU.
        raise RecordError(f"{name}.fsdp", "needs trainer = 'accelerate-loop' (see census.toml)")
    sft_only = [key for key in ("packing", "padding_free") if getattr(setup, key)]
    if sft_only and setup.trainer != TrainerKind.SFT:
        raise RecordError(
            f"{name}.{sft_only[0]}", "is an SFTTrainer option: set trainer = 'SFTTrainer'"
        )
    for key in ("batch_size", "gradient_accumulation_steps", "logging_steps"):
        if getattr(setup, key) < 1:
            raise RecordError(f"{name}.{key}", "must be 1 or more")


# The setups without SP run from one import of the worker; SP needs a launcher that sets the SP
# group up itself.
FORKED = launchers.with_capability(forks=True)
SETS_UP_SP = launchers.with_capability(sets_up_sp=True)


def launcher(setup: CensusSetup) -> Launcher:
    return SETS_UP_SP if setup.sp else FORKED


def deepspeed(setup: CensusSetup) -> DeepSpeedSetup | None:
    if not setup.zero_stage:
        return None
    return DeepSpeedSetup(zero_stage=setup.zero_stage, precision=setup.precision)


def world(setup: CensusSetup, steps: int, run_dir: Path, host_memory: Sequence[str] = ()) -> World:
    """The worker's ranks, arguments and variables for `setup` (`host_memory`: the option naming
    reads of host memory). A forked setup's DeepSpeed config is written into `run_dir` and passed
    as `accelerate launch` passes it (`deepspeed_env`); a launcher that sets DeepSpeed up itself
    writes its own."""
    args = [
        *host_memory,
        "--trainer",
        setup.trainer.value,
        "--steps",
        str(steps),
        "--detect-steps",
        str(steps),
        "--logging-steps",
        str(setup.logging_steps),
        "--batch-size",
        str(setup.batch_size),
        "--gradient-accumulation-steps",
        str(setup.gradient_accumulation_steps),
        "--eval-steps",
        str(setup.eval_steps),
    ]
    flags = (
        "gradient_checkpointing",
        "packing",
        "padding_free",
        "lora",
        "num_input_tokens_seen",
        "fsdp",
        "torch_compile",
    )
    args += [f"--{flag.replace('_', '-')}" for flag in flags if getattr(setup, flag)]
    ds, env = deepspeed(setup), {}
    if not LAUNCHERS[launcher(setup)].sets_up_sp:
        args += ["--precision", setup.precision.value]
        if ds is not None:
            run_dir.mkdir(parents=True, exist_ok=True)
            config = run_dir / f"deepspeed-{ds.label}.json"
            config.write_text(json.dumps(ds.config(), indent=2) + "\n")
            env = deepspeed_env(config)
    return World(setup.ranks, tuple(args), env)
