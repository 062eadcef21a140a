"""The upstream projects a case can pin, each described once: where it keeps its package and
version, how its CI runs its tests, which linters it applies, what the environment probe
reports beside it, how its compiled extensions are cached.

A tree under test is imported by path: `Project.import_root` is the folder that goes first on
`PYTHONPATH` (transformers and accelerate keep their package under `src/`, DeepSpeed at the top
together with its `accelerator` and `op_builder` packages).

Adding a project is adding one entry to `PROJECTS`: nothing else in the engine names one.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from hostsync.workspace.errors import WorkspaceError
from hostsync.workspace.records import Precision


@dataclass(frozen=True)
class RuffLint:
    """`ruff check` and `ruff format --check`, at the version the tree pins: group 1 of
    `pattern` in the tree's `file`."""

    file: str
    pattern: str


@dataclass(frozen=True)
class Formatter:
    """One Python formatter of a `.pre-commit-config.yaml`, run as a check."""

    name: str  # on PyPI, and as the card's [lint] names it
    repo: str  # how the pre-commit config names its repository
    module: str  # python -m MODULE
    check_flags: tuple[str, ...] = ()  # what makes it report instead of rewrite
    config_flag: str | None = None  # how it takes a config file the card supplies


@dataclass(frozen=True)
class PreCommitLint:
    """The formatters of the tree's `.pre-commit-config.yaml`; for a tree without one (an
    sdist), their versions and configs from the case card's `[lint]`."""

    formatters: tuple[Formatter, ...]


@dataclass(frozen=True)
class Project:
    name: str  # on PyPI, and the import name
    repository: str
    import_root: str  # relative to the tree root
    version_file: str  # relative to the tree root
    version_pattern: str  # its group 1 is the version
    lint: RuffLint | PreCommitLint
    # Installed packages the environment probe reports beside the project (the tree is
    # imported by path, so the project's own installed version is reported too, as installed).
    reports: tuple[str, ...] = ()
    test_env: tuple[tuple[str, str], ...] = ()  # as the project's CPU CI sets it
    # JIT-compiled extensions are built from the tree's own sources: one cache per tree, or
    # each tree would rebuild the other's.
    extensions_per_tree: bool = False
    # DCO: every commit sent upstream carries `Signed-off-by` (the outbox adds it).
    sign_off: bool = False
    # What a contributor does before sending a PR there (the outbox's checklist).
    before_sending: tuple[str, ...] = ()
    # How the project asks contributors to disclose assistance (the outbox's checklist).
    assistance: str = "say in your own text what a tool did (no policy of its own is recorded)"
    # Who the project lets send assisted work at all: the checklist's first step, where it says.
    who_may_send: str = ""
    # Where the project holds an assisted PR until a maintainer approves the work in its issue's
    # thread, what its policy says: the outbox then sends the issue alone, until the card's
    # `[upstream] approved` links that approval.
    pr_after_approval: str = ""
    # The command whose output its issue template asks for as system info: the contributor's own.
    system_info: str = "python -m torch.utils.collect_env"
    # Its Trainer is what the hunt and the census run: its tree is the one the ranks check.
    trainer: bool = False

    def version_in(self, root: Path) -> str:
        """The version the tree at `root` says it is, or "unknown"."""
        path = root / self.version_file
        match = (
            re.search(self.version_pattern, path.read_text(), re.MULTILINE)
            if path.exists()
            else None
        )
        return match[1] if match else "unknown"


_DUNDER_VERSION = r'^__version__ = "([^"]+)"'

PROJECTS = {
    project.name: project
    for project in (
        Project(
            "transformers",
            "https://github.com/huggingface/transformers",
            "src",
            "src/transformers/__init__.py",
            _DUNDER_VERSION,
            # `make style`: the ruff of its dependency table.
            lint=RuffLint(
                "src/transformers/dependency_versions_table.py", r'"ruff": "ruff==([^"]+)"'
            ),
            reports=("tokenizers", "huggingface_hub"),
            trainer=True,
            before_sending=(
                "Paste the PR template as it stands on the default branch and fill in its boxes"
                " yourself: its Code Agent Policy is reworded often",
                "Say in the PR's description what .ai/AGENTS.md requires of AI-assisted work: the"
                " links to the issue and to the approval comment, why no open PR does the same"
                " (its `gh pr list` checks), the test commands you ran with their results, and"
                " that AI assistance was used",
                "Run `make style` and `make check-repo` in your clone of transformers",
            ),
            assistance="say that AI assistance was used and what it did, as its .ai/AGENTS.md"
            " asks of AI-assisted work (it warns that breaching its agent contribution guidelines"
            " can get an account banned)",
            who_may_send="If you have not contributed to transformers before, do not send this:"
            " the Code Agent Policy of its templates (as of 2026-09) says first-time contributors"
            " should not use code agents to submit PRs or issues, and issues and PRs that break"
            " the rule are closed without review and may get you blocked",
            pr_after_approval="its agentic contribution policy (.ai/AGENTS.md) has AI-assisted work"
            " coordinated in an issue, with a maintainer's approval in its thread, before any PR,"
            " and no PR-ready change made without that approval",
            system_info="transformers env",
        ),
        Project(
            "accelerate",
            "https://github.com/huggingface/accelerate",
            "src",
            "src/accelerate/__init__.py",
            _DUNDER_VERSION,
            # `make quality`: the ruff of setup.py's quality extra.
            lint=RuffLint("setup.py", r"ruff\s*==\s*([\w.]+)"),
            before_sending=("Run `make style` and `make quality` in your clone of accelerate",),
            system_info="accelerate env",
        ),
        Project(
            "deepspeed",
            "https://github.com/deepspeedai/DeepSpeed",
            ".",
            "version.txt",
            r"^(\S+)\s*$",
            lint=PreCommitLint(
                (
                    Formatter("yapf", "google/yapf", "yapf", ("--diff",), "--style"),
                    Formatter("flake8", "flake8", "flake8", (), "--config"),
                    Formatter("codespell", "codespell", "codespell_lib"),
                )
            ),
            # Its cpu-torch-latest workflow: `cd tests; DS_ACCELERATOR=cpu pytest unit/...`. The
            # CPU accelerator counts its devices from LOCAL_SIZE (else NUMA nodes, one here): 2
            # lets DistributedTest spawn the 2 gloo ranks the cases run; larger worlds skip.
            test_env=(("DS_ACCELERATOR", "cpu"), ("LOCAL_SIZE", "2")),
            extensions_per_tree=True,
            sign_off=True,
            before_sending=(
                "Check that each commit's Signed-off-by line is you (DCO, checked on every PR)",
                "Run `pre-commit run --files <changed files>` in your clone of DeepSpeed",
            ),
            assistance="its AGENTS.md, the rules it sets for AI coding agents, says nothing of"
            " disclosure: say in your own text what a tool did; it asks for your own sign-off,"
            " no formatting-only changes, and tests consolidated rather than new files",
            system_info="ds_report",
        ),
        Project(
            "trl",
            "https://github.com/huggingface/trl",
            ".",
            "VERSION",
            r"^(\S+)\s*$",
            # `make precommit`: the ruff of its pre-commit config; a PyPI sdist lacks that file,
            # so the case card's [lint] gives the version.
            lint=RuffLint(
                ".pre-commit-config.yaml", r"astral-sh/ruff-pre-commit\s+rev:\s*v([\w.]+)"
            ),
            reports=("datasets",),
            before_sending=(
                "Fill in the PR template's 'Before submitting' box yourself",
                "Run `make precommit` in your clone of trl",
            ),
            assistance="the 'AI writing disclosure' box of its PR template: a first-time"
            " contributor's PR without it is closed automatically",
            system_info="trl env",
        ),
        Project(
            "peft",
            "https://github.com/huggingface/peft",
            "src",
            "src/peft/__init__.py",
            _DUNDER_VERSION,
            # `make quality`: the ruff of setup.py's quality extra.
            lint=RuffLint("setup.py", r'"ruff==([^"]+)"'),
            before_sending=("Run `make style` and `make quality` in your clone of peft",),
        ),
    )
}

# What the hunt attributes a site to, in the order it ranks them: the projects, then torch.
PACKAGES = (*PROJECTS, "torch")


def get(name: str) -> Project:
    if name not in PROJECTS:
        raise WorkspaceError(f"unknown project {name!r}: use one of {', '.join(PROJECTS)}")
    return PROJECTS[name]


def trainer_project() -> str:
    """The project whose Trainer the hunt and the census run."""
    return next(name for name, project in PROJECTS.items() if project.trainer)


def probed_packages() -> tuple[str, ...]:
    """What the environment probe reports: torch, every project and what each names."""
    reported = [name for project in PROJECTS.values() for name in project.reports]
    return tuple(dict.fromkeys(["torch", *PROJECTS, *reported]))


# --- what the projects' own launchers are given -------------------------------------------------


@dataclass(frozen=True)
class DeepSpeedSetup:
    """What DeepSpeed users choose per run and several host reads depend on: the ZeRO stage and
    the precision (ZeRO 1/2 check overflow on the host in fp32 and fp16, and in bf16 only with
    check_grad_overflow; fp16 scales the loss dynamically)."""

    zero_stage: int = 1
    precision: Precision = Precision.FP32

    @property
    def label(self) -> str:
        return f"{self.precision}-zero{self.zero_stage}"

    @classmethod
    def parse(cls, text: str) -> DeepSpeedSetup:
        precision, _, stage = text.partition("-zero")
        if precision not in set(Precision) or stage not in ("1", "2", "3"):
            raise WorkspaceError(f"setup {text!r}: use PRECISION-zeroSTAGE, e.g. bf16-zero2")
        return cls(zero_stage=int(stage), precision=Precision(precision))

    def config(self) -> dict[str, object]:
        """The DeepSpeed config, every size left to the Trainer ("auto") so that runs with and
        without SP share one config. The precision is spelled out: accelerate fills an "auto"
        one from its own mixed precision, which it ignores beside a DeepSpeed config file, and
        the Trainer from TrainingArguments before a CPU run may set bf16."""
        return {
            "zero_optimization": {"stage": self.zero_stage},
            "bf16": {"enabled": self.precision == Precision.BF16},
            "fp16": {"enabled": self.precision == Precision.FP16},
            "train_batch_size": "auto",
            "train_micro_batch_size_per_gpu": "auto",
            "gradient_accumulation_steps": "auto",
            "gradient_clipping": "auto",
        }


DEFAULT_SETUP = DeepSpeedSetup()


def accelerate_config(num_processes: int, deepspeed_file: Path) -> dict[str, object]:
    """What `accelerate config` would write for DeepSpeed, plus Ulysses SP over every rank when
    there are several."""
    config: dict[str, object] = {
        "compute_environment": "LOCAL_MACHINE",
        "distributed_type": "DEEPSPEED",
        "deepspeed_config": {"deepspeed_config_file": str(deepspeed_file)},
        "num_machines": 1,
        "num_processes": num_processes,
        "machine_rank": 0,
        "main_training_function": "main",
        "rdzv_backend": "static",
        "same_network": True,
        "use_cpu": False,
    }
    if num_processes > 1:
        config["parallelism_config"] = {
            "parallelism_config_sp_size": num_processes,
            "parallelism_config_sp_backend": "deepspeed",
            "parallelism_config_sp_seq_length_is_variable": True,
            "parallelism_config_sp_attn_implementation": "sdpa",
        }
    return config


def deepspeed_env(deepspeed_file: Path) -> dict[str, str]:
    """What `accelerate launch` with `accelerate_config` gives each rank for DeepSpeed (accelerate's
    `prepare_deepspeed_cmd_env`): a rank started otherwise (forked) with these variables sets
    DeepSpeed up through the Trainer exactly as an accelerate-launched one."""
    return {
        "ACCELERATE_USE_DEEPSPEED": "true",
        "ACCELERATE_DEEPSPEED_CONFIG_FILE": str(deepspeed_file),
        "ACCELERATE_CONFIG_DS_FIELDS": "deepspeed_config_file",
        "ACCELERATE_MIXED_PRECISION": "no",
    }
