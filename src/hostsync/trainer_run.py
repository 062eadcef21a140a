"""The full Trainer path: `accelerate launch` + `Trainer` + DeepSpeed Ulysses SP, as users run it.

`launch_accelerate` starts a script with configs written at run time (DeepSpeed ZeRO stage 1;
Ulysses through accelerate's `parallelism_config` when there are several ranks) and reads back
what each rank reported; a case's reproducer can use it too (`launcher = "accelerate"`). The
engine's own worker, `workers/sp_trainer.py`, trains a tiny Llama with the Trainer for two uses:
the full-fidelity loss check (`compare_losses`) and the host-sync hunt (`hunt_run`).
"""

from __future__ import annotations

import json
import math
import re
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hostsync import environment
from hostsync.errors import WorkspaceError
from hostsync.launch import Run, RunFailed, launch
from hostsync.layout import Layout
from hostsync.options import DEFAULT_TIMEOUT_S
from hostsync.protocol import free_port
from hostsync.upstream import Tree

SP_SIZE = 2
WORKER = Path(__file__).parent / "workers" / "sp_trainer.py"


@dataclass(frozen=True)
class Setup:
    """What DeepSpeed users choose per run and several host reads depend on: the ZeRO stage and
    the precision (ZeRO 1/2 check overflow on the host in fp32, and in bf16 only with
    check_grad_overflow)."""

    zero_stage: int = 1
    precision: str = "fp32"

    @property
    def label(self) -> str:
        return f"{self.precision}-zero{self.zero_stage}"

    @classmethod
    def parse(cls, text: str) -> Setup:
        match = re.fullmatch(r"(bf16|fp32)-zero([123])", text)
        if not match:
            raise WorkspaceError(f"setup {text!r}: use PRECISION-zeroSTAGE, e.g. bf16-zero2")
        return cls(zero_stage=int(match[2]), precision=match[1])


DEFAULT_SETUP = Setup()


def deepspeed_config(setup: Setup) -> dict:
    """The setup's stage and precision, every size left to the Trainer ("auto") so that runs
    with and without SP share one config. bf16 is spelled out: accelerate fills an "auto" one
    from its own mixed precision, which it ignores beside a DeepSpeed config file."""
    return {
        "zero_optimization": {"stage": setup.zero_stage},
        "bf16": {"enabled": setup.precision == "bf16"},
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
    }


def accelerate_config(num_processes: int, sp_size: int, deepspeed_file: Path) -> dict:
    """What `accelerate config` would write for DeepSpeed, plus Ulysses SP when sp_size > 1."""
    config = {
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
    if sp_size > 1:
        config["parallelism_config"] = {
            "parallelism_config_sp_size": sp_size,
            "parallelism_config_sp_backend": "deepspeed",
            "parallelism_config_sp_seq_length_is_variable": True,
            "parallelism_config_sp_attn_implementation": "sdpa",
        }
    return config


def launch_accelerate(run: Run, script: Path, nprocs: int, args: Sequence[str], *, device: str,
                      timeout: float, env: Mapping[str, str] | None = None,
                      setup: Setup = DEFAULT_SETUP) -> list[dict]:  # fmt: skip
    """One `accelerate launch` of `script` on `nprocs` ranks (one SP group of all of them when
    there are several), DeepSpeed set up as `setup` says; each rank's result, by rank. The script
    also gets `--output-dir`, `--backend` and `--precision`. The run folder stays: the caller
    removes it once it has read what it needs."""
    deepspeed_file = run.run_dir / "deepspeed.json"
    run.run_dir.mkdir(parents=True, exist_ok=True)
    deepspeed_file.write_text(json.dumps(deepspeed_config(setup), indent=2))
    accelerate_file = run.run_dir / "accelerate.json"
    config = accelerate_config(nprocs, nprocs, deepspeed_file)
    accelerate_file.write_text(json.dumps(config, indent=2))
    backend = "nccl" if device == "cuda" else "gloo"
    command = [
        run.tree.python, "-m", "accelerate.commands.launch",
        "--config_file", str(accelerate_file), "--main_process_port", str(free_port()),
        str(script), "--output-dir", str(run.run_dir / "output"), "--backend", backend,
        "--precision", setup.precision, *args,
    ]  # fmt: skip
    env = environment.device_env(device) | dict(env or {})
    return launch(run, command, nprocs=nprocs, timeout=timeout, env=env)


def run_trainer(layout: Layout, tree: Tree, *, sp: bool, steps: int, logging_steps: int = 1,
                worker_args: Sequence[str] = (), timeout: float = DEFAULT_TIMEOUT_S,
                device: str = "auto", setup: Setup = DEFAULT_SETUP) -> list[dict]:  # fmt: skip
    """One `accelerate launch` of the engine's Trainer worker; each rank's result, by rank.

    With SP: two ranks forming one SP group of two. Without: one rank, same engine and config.
    The run folder is removed after a success and kept, with its launcher log, after a failure.
    """
    mode = f"sp{SP_SIZE}" if sp else "nosp"
    run = Run(layout.new_run_dir(f"trainer-{tree.label}-{mode}"), tree, layout)
    nprocs = SP_SIZE if sp else 1
    # NCCL when every rank gets a GPU of its own; else gloo with GPUs hidden: with one GPU
    # visible accelerate would still place rank 1 on a `cuda:1` that does not exist.
    device = environment.resolve_device(device, SP_SIZE, tree.python)
    args = ["--steps", str(steps), "--logging-steps", str(logging_steps), *worker_args]
    results = launch_accelerate(
        run, WORKER, nprocs, args, device=device, timeout=timeout, setup=setup
    )
    check_layout(results, sp_size=nprocs, log_file=run.log_file)
    shutil.rmtree(run.run_dir)
    return results


def check_layout(results: list[dict], sp_size: int, log_file: Path) -> None:
    """Refuse a run whose ranks did not form the intended groups (e.g. each rank alone, which
    accelerate does silently on CPU when the backend is missing)."""
    seen = [(result["world_size"], result["sp_size"]) for result in results]
    if any(pair != (len(results), sp_size) for pair in seen):
        raise RunFailed(
            f"the ranks reported (world size, sp size) {seen}, not ({len(results)}, {sp_size}):"
            f" the Trainer did not set up the intended process groups; see {log_file}"
        )


def logged_losses(result: dict, steps: int) -> list[float]:
    """The per-step losses a rank logged; refuses a run that did not log every step."""
    logged = result["logged"]
    missing = [step for step in range(1, steps + 1) if str(step) not in logged]
    if missing:
        raise RunFailed(f"the Trainer logged no loss at step(s) {missing}: the run is incomplete")
    return [logged[str(step)]["loss"] for step in range(1, steps + 1)]


def compare_losses(layout: Layout, tree: Tree, steps: int = 2,
                   timeout: float = DEFAULT_TIMEOUT_S, device: str = "auto") -> dict:  # fmt: skip
    """Per-step Trainer loss with Ulysses SP (2 ranks) against the same training without SP.

    The reference is a single-process DeepSpeed run, not a 2-rank data-parallel one: with SP the
    two ranks share one sample per step (dp size 1), so only a run with one sample per step sees
    the same data, the same optimizer updates and the same loss at every step. Same engine, same
    ZeRO config, same seed, sequential sampling. Step 1 checks the forward and the loss
    aggregation; later steps also check the backward and the update.

    Gradient clipping is off: DeepSpeed sums SP gradients over the SP group (sp_size times the
    plain gradients, deepspeed#5248); AdamW's update is blind to that scale, clipping to a fixed
    norm is not. The logged grad norms are returned to show the factor.
    """
    no_clipping = ["--max-grad-norm", "0"]
    sp_ranks = run_trainer(layout, tree, sp=True, steps=steps, worker_args=no_clipping,
                           timeout=timeout, device=device)  # fmt: skip
    (reference,) = run_trainer(layout, tree, sp=False, steps=steps, worker_args=no_clipping,
                               timeout=timeout, device=device)  # fmt: skip
    sp_losses = [logged_losses(result, steps) for result in sp_ranks]
    nosp_losses = logged_losses(reference, steps)
    diffs = [abs(a - b) for a, b in zip(sp_losses[0], nosp_losses, strict=True)]
    return {
        "tree": tree.label,
        "steps": steps,
        "sp_size": SP_SIZE,
        "device": sp_ranks[0]["device"],
        "sp": sp_losses[0],
        "sp_ranks_agree": all(losses == sp_losses[0] for losses in sp_losses),
        "no_sp": nosp_losses,
        "abs_diff": diffs,
        "max_abs_diff": max(diffs),
        "grad_norm": {
            "sp": [sp_ranks[0]["logged"][str(s)].get("grad_norm") for s in range(1, steps + 1)],
            "no_sp": [reference["logged"][str(s)].get("grad_norm") for s in range(1, steps + 1)],
        },
    }


def hunt_plan(steps: int, logging_steps: int) -> dict[str, int]:
    """Which steps the detector watches and which one the profiler watches, and its twin.

    The detector watches steps 1..`steps`. The profiler watches the next logging step alone (the
    detector's own re-dispatch would show in its trace); its `twin` is the watched step one
    common period earlier, in the same phase of both the logging cycle and the SP data refill
    (every `SP_SIZE` steps), so the two see the same kinds of work.
    """
    period = math.lcm(logging_steps, SP_SIZE)
    profile = (steps // logging_steps + 1) * logging_steps
    twin = profile - period
    if twin < 2:
        fewest = math.ceil((period + 2) / logging_steps) * logging_steps - logging_steps
        raise WorkspaceError(
            f"--steps {steps} is too few: the profiled step {profile} needs a watched twin"
            f" {period} steps earlier, after the warm-up step; use --steps {fewest} or more"
        )
    return {"steps": steps, "logging_steps": logging_steps, "profile": profile, "twin": twin}


def hunt_run(layout: Layout, tree: Tree, steps: int, logging_steps: int = 3,
             timeout: float = DEFAULT_TIMEOUT_S,
             setup: Setup = DEFAULT_SETUP) -> tuple[dict[str, int], list[dict]]:  # fmt: skip
    """The SP Trainer run under the sync detector and the profiler: the plan, each rank's record.

    Logging every 3 steps while SP refills data every 2: a site tied to either cycle shows as such.
    """
    plan = hunt_plan(steps, logging_steps)
    results = run_trainer(
        layout, tree, sp=True, steps=plan["profile"], logging_steps=logging_steps,
        worker_args=["--detect-steps", str(steps), "--profile-step", str(plan["profile"])],
        timeout=timeout, setup=setup,
    )  # fmt: skip
    context = ("device", "backend", "model")
    return plan, [
        result["hunt"] | {"rank": rank} | {key: result[key] for key in context}
        for rank, result in enumerate(results)
    ]
