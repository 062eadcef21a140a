"""Launches the engine's own Trainer step: the launcher that sets DeepSpeed and Ulysses SP up
(`accelerate launch`, as users run it) + `Trainer`.

The worker `rank/workers/trainer.py` trains a tiny Llama with the Trainer, started through the
registry's launcher that sets SP up (DeepSpeed ZeRO as `DeepSpeedSetup` says; Ulysses SP over
both ranks). Two uses: the full-fidelity loss check of `repro --trainer` (`compare_losses`),
and the host-sync hunt (`hostsync.hunt.measure`).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from pathlib import Path

from hostsync.launch import devices, launchers
from hostsync.launch.launchers import LaunchPlan, World
from hostsync.launch.nodes import SINGLE, NodeLayout
from hostsync.launch.processes import DEFAULT_TIMEOUT_S, RankResults, Run, RunFailed, read_ranks
from hostsync.launch.records import TrainerComparison
from hostsync.sites.records import TrainerRank
from hostsync.upstream.trees import Tree
from hostsync.workspace.layout import Layout
from hostsync.workspace.projects import DEFAULT_SETUP, DeepSpeedSetup

SP_SIZE = 2
WORKER = Path(__file__).parents[1] / "rank" / "workers" / "trainer.py"


def run_trainer(
    layout: Layout,
    tree: Tree,
    *,
    sp: bool,
    steps: int,
    logging_steps: int = 1,
    worker_args: Sequence[str] = (),
    timeout: float = DEFAULT_TIMEOUT_S,
    device: str = "auto",
    setup: DeepSpeedSetup = DEFAULT_SETUP,
    nodes: NodeLayout = SINGLE,
) -> RankResults:
    """One `accelerate launch` of the engine's Trainer worker; each rank's result, by rank.

    With SP: two ranks forming one SP group of two (across `nodes`, one share each). Without:
    one rank, same engine and config. The run folder is removed after a success and kept, with
    its launcher log, after a failure.
    """
    mode = f"sp{SP_SIZE}" if sp else "nosp"
    run = Run(layout.new_run_dir(f"trainer-{tree.label}-{mode}"), tree, layout)
    nprocs = SP_SIZE if sp else 1
    # NCCL when every rank gets a GPU of its own; else gloo with GPUs hidden: with one GPU
    # visible accelerate would still place rank 1 on a `cuda:1` that does not exist.
    used = devices.resolve_device(device, nodes.ranks_here(SP_SIZE), tree.python)
    args = ("--steps", str(steps), "--logging-steps", str(logging_steps), *worker_args)
    what = LaunchPlan(WORKER, (World(nprocs, args),), used, timeout, deepspeed=setup, nodes=nodes)
    (results,) = launchers.run_worlds(launchers.with_capability(sets_up_sp=True), run, what)
    check_layout(read_ranks(results, TrainerRank), sp_size=nprocs, log_file=run.log_file)
    shutil.rmtree(run.run_dir)
    return results


def check_layout(results: Sequence[TrainerRank], sp_size: int, log_file: Path) -> None:
    """Refuse a run whose ranks did not form the intended groups (e.g. each rank alone, which
    accelerate does silently on CPU when the backend is missing)."""
    seen = [(result.world_size, result.sp_size) for result in results]
    if any(pair != (len(results), sp_size) for pair in seen):
        raise RunFailed(
            f"the ranks reported (world size, sp size) {seen}, not ({len(results)}, {sp_size}):"
            f" the Trainer did not set up the intended process groups; see {log_file}"
        )


def logged_losses(result: TrainerRank, steps: int) -> list[float]:
    """The per-step losses a rank logged; refuses a run that did not log every step."""
    logged = result.logged
    missing = [step for step in range(1, steps + 1) if str(step) not in logged]
    if missing:
        raise RunFailed(f"the Trainer logged no loss at steps {missing}: the run is incomplete")
    return [logged[str(step)].loss for step in range(1, steps + 1)]


def compare_losses(
    layout: Layout,
    tree: Tree,
    steps: int = 2,
    timeout: float = DEFAULT_TIMEOUT_S,
    device: str = "auto",
) -> TrainerComparison:
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
    sp_run = run_trainer(
        layout, tree, sp=True, steps=steps, worker_args=no_clipping, timeout=timeout, device=device
    )
    no_sp_run = run_trainer(
        layout, tree, sp=False, steps=steps, worker_args=no_clipping, timeout=timeout, device=device
    )
    sp_ranks, (reference,) = read_ranks(sp_run, TrainerRank), read_ranks(no_sp_run, TrainerRank)
    sp_losses = [logged_losses(result, steps) for result in sp_ranks]
    nosp_losses = logged_losses(reference, steps)
    diffs = [abs(a - b) for a, b in zip(sp_losses[0], nosp_losses, strict=True)]
    return TrainerComparison(
        tree=tree.label,
        steps=steps,
        sp_size=SP_SIZE,
        device=sp_ranks[0].device,
        sp=tuple(sp_losses[0]),
        sp_ranks_agree=all(losses == sp_losses[0] for losses in sp_losses),
        no_sp=tuple(nosp_losses),
        abs_diff=tuple(diffs),
        max_abs_diff=max(diffs),
        grad_norm={
            "sp": tuple(sp_ranks[0].logged[str(s)].grad_norm for s in range(1, steps + 1)),
            "no_sp": tuple(reference.logged[str(s)].grad_norm for s in range(1, steps + 1)),
        },
    )
