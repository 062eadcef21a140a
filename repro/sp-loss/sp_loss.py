"""One rank of the reproducer: the real `deepspeed_sp_compute_loss` on real Ulysses SP groups.

Started by `python -m hostsync repro` (forked from one import of this script, as the case card
says; torchrun works the same), one process per sequence-parallel rank (gloo on CPU, NCCL with
one GPU per rank). Every rank builds the same tiny Llama from a config, computes a single-process
reference over the whole sequence for each scenario, then registers Ulysses, builds the engine
once, and for each scenario calls the transformers function of the tree under test unchanged.
The host syncs inside its loss aggregation are counted with the model forward allowed (and
reported apart), the loss is compared with the reference, and the gradients after
`engine.backward` with the reference gradients; then one more call, untimed, accounts for the
call's reads, stalls and device work (`cost`). Each rank returns one row per scenario, with the
problems it saw (see `hostsync.measure.repro` for the contract)."""

from __future__ import annotations

import contextlib
import math
import os
import time
import types
from collections.abc import Callable, Iterator

import deepspeed
import torch
from accelerate.parallelism_config import ParallelismConfig
from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF

# The tiny model's modeling code (about 950 modules, which transformers imports lazily) imported
# here, once, before the fork launcher forks the ranks, rather than by every rank.
from transformers import LlamaForCausalLM  # noqa: F401
from transformers.integrations.deepspeed import deepspeed_sp_compute_loss

from hostsync.detector import Cost, SiteCount, SyncScope
from hostsync.rank.protocol import RankRow, ReproRank, rank_entry, repro_parser
from hostsync.rank.rankkit import VOCAB, tiny_llama

MICRO_BATCH = 1
TOKENS_PER_RANK = 8
GRAD_ATOL = 1e-6
GRAD_RTOL = 1e-4
LOSS_TOLERANCE = 1e-5


# --- the batches ---------------------------------------------------------------------------------


def label_tokens(scenario: str, sp_size: int) -> list[int]:
    """How many positions of each rank's shard carry a label (the rest are -100)."""
    full = TOKENS_PER_RANK
    return {
        "all_tokens": [full] * sp_size,
        # SFT: rank 0 holds only prompt tokens, so its local loss is a mean over nothing (NaN).
        "prompt_only_rank": [0] + [full] * (sp_size - 1),
        "all_masked": [0] * sp_size,
        "uneven": [min(2 * rank + 1, full) for rank in range(sp_size)],
    }[scenario]


def full_batch(scenario: str, sp_size: int, device: torch.device) -> dict[str, torch.Tensor]:
    """One sequence, identical on every rank, with `labels` as a data collator would give them.

    The label counts hold for the shifted labels each rank sees (the last position of the last
    shard has no next token, so it never carries a label).
    """
    seq_len = TOKENS_PER_RANK * sp_size
    generator = torch.Generator().manual_seed(1234)
    input_ids = torch.randint(0, VOCAB, (MICRO_BATCH, seq_len), generator=generator)
    keep = torch.zeros(seq_len, dtype=torch.bool)  # keep[i]: shifted position i has a label
    for rank, count in enumerate(label_tokens(scenario, sp_size)):
        keep[rank * TOKENS_PER_RANK : rank * TOKENS_PER_RANK + count] = True
    keep[-1] = False
    labels = torch.full_like(input_ids, -100)
    labels[:, 1:] = torch.where(keep[:-1], input_ids[:, 1:], -100)
    position_ids = torch.arange(seq_len).unsqueeze(0)
    batch = {"input_ids": input_ids, "labels": labels, "position_ids": position_ids}
    return {name: tensor.to(device) for name, tensor in batch.items()}


def shard(batch: dict[str, torch.Tensor], rank: int, sp_size: int) -> dict[str, torch.Tensor]:
    """This rank's slice, as DeepSpeed's `UlyssesSPDataLoaderAdapter` cuts it: shift, then slice."""
    shift_labels = torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:]
    unsharded = {
        "input_ids": batch["input_ids"],
        "position_ids": batch["position_ids"],
        "shift_labels": shift_labels,
    }
    chunk = batch["input_ids"].shape[1] // sp_size
    return {
        name: tensor[:, rank * chunk : (rank + 1) * chunk].contiguous()
        for name, tensor in unsharded.items()
    }


# --- the model -----------------------------------------------------------------------------------


def sp_llama(device: torch.device) -> torch.nn.Module:
    """The tiny Llama, in training mode and without a KV cache, as under the Trainer; its 4
    attention heads split over sp_size 2 or 4."""
    return tiny_llama(hidden=64, intermediate=128, use_cache=False).to(device).train()


def reference(
    model: torch.nn.Module, batch: dict[str, torch.Tensor]
) -> tuple[float, dict[str, torch.Tensor]]:
    """Loss and gradients of one process over the whole sequence, before Ulysses is registered."""
    model.zero_grad(set_to_none=True)
    loss = model(**batch).loss
    loss.backward()
    grads = {name: p.grad.detach().clone() for name, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    return loss.item(), grads


def sp_engine(model: torch.nn.Module, sp_size: int, seq_len: int):
    """Ulysses attention plus an engine that knows the mpu: the only way the SP group exists."""
    mpu = UlyssesSPAttentionHF.register_with_transformers(
        model, "sdpa", sp_size, MICRO_BATCH, seq_length=seq_len
    )
    # lr=0: `engine.backward` needs an optimizer, and the weights must not move between scenarios.
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    config = {"train_micro_batch_size_per_gpu": MICRO_BATCH, "zero_optimization": {"stage": 0}}
    engine, *_ = deepspeed.initialize(model=model, optimizer=optimizer, config=config, mpu=mpu)
    return engine


# --- one scenario --------------------------------------------------------------------------------


@contextlib.contextmanager
def around_forward(
    engine, block: Callable[[], contextlib.AbstractContextManager]
) -> Iterator[None]:
    """Run each forward of the engine inside a fresh `block()`, entered and left from hooks.

    Hooks, so that the function under test runs unchanged while its model call is set apart.
    """
    opened: list[contextlib.AbstractContextManager] = []

    def enter(*_: object) -> None:
        opened.append(block())
        opened[-1].__enter__()

    def leave(*_: object) -> None:
        opened.pop().__exit__(None, None, None)

    hooks = [engine.register_forward_pre_hook(enter), engine.register_forward_hook(leave)]
    try:
        yield
    finally:
        for hook in hooks:
            hook.remove()


def loss_under_test(engine, inputs: dict[str, torch.Tensor], pc) -> object:
    """The transformers function of the tree under test, called unchanged."""
    # The deepspeed branch (sp_backend "deepspeed", sp_size > 1) never reads the accelerator; an
    # `Accelerator` would need accelerate's own launcher state. This stand-in carries the one
    # attribute the other branch would read, set so that branch would refuse.
    accelerator = types.SimpleNamespace(torch_device_mesh=None)
    return deepspeed_sp_compute_loss(accelerator, engine, inputs, False, pc)


def compute_loss(
    engine, inputs: dict[str, torch.Tensor], pc, detect: bool
) -> tuple[object, SyncScope | None]:
    """Call the function under test; with `detect`, in the scope that counts the syncs of its
    aggregation, those of the forward allowed and so apart."""
    if not detect:
        return loss_under_test(engine, inputs, pc), None

    with SyncScope() as scope, around_forward(engine, lambda: scope.allow("model forward")):
        loss = loss_under_test(engine, inputs, pc)
    return loss, scope


def call_cost(engine, inputs: dict[str, torch.Tensor], pc) -> Cost:
    """The reads, stalls and device work of one call, the model forward included, measured in a
    call of its own: accounting sees every aten call, which the timed call under the gate (what
    bench times) must not pay for."""
    with SyncScope(account=True) as scope:
        loss_under_test(engine, inputs, pc)
    return scope.cost()


def run_scenario(
    engine,
    pc,
    name: str,
    setup: dict[str, int | str],
    batch: dict[str, torch.Tensor],
    reference: tuple[float, dict[str, torch.Tensor]],
    detect: bool,
) -> RankRow:
    """One scenario's row: its syncs, loss and gradients against the `reference` of one
    process, beside the `setup` every scenario shares."""
    ref_loss, ref_grads = reference
    rank, sp_size = torch.distributed.get_rank(), torch.distributed.get_world_size()
    inputs = shard(batch, rank, sp_size)
    engine.zero_grad()
    wait_for_device()
    started = time.perf_counter()
    loss, scope = compute_loss(engine, inputs, pc, detect)
    wait_for_device()
    call_seconds = time.perf_counter() - started
    is_graph_tensor = isinstance(loss, torch.Tensor) and loss.grad_fn is not None
    value = float(loss.detach()) if isinstance(loss, torch.Tensor) else float(loss)
    result = {
        **setup,
        "label_tokens": int((inputs["shift_labels"] != -100).sum()),
        "call_seconds": call_seconds,
        **({"cuda_syncs": scope.cuda_syncs} if scope else {}),
        "loss": finite_or_none(value),
        "loss_type": type(loss).__name__,
        "loss_is_graph_tensor": is_graph_tensor,
        "reference_loss": finite_or_none(ref_loss),
        "loss_abs_diff": finite_or_none(abs(value - ref_loss)),
        "backward_error": None,
        "grads_ok": None,
        "grad_max_abs_diff": None,
    }
    diff = result["loss_abs_diff"]
    result["loss_ok"] = None if diff is None else diff <= LOSS_TOLERANCE
    try:
        engine.backward(loss)
    except Exception as error:  # what the pinned tree does with a loss that is not a tensor
        result["backward_error"] = f"{type(error).__name__}: {error}"
    else:
        result.update(compare_grads(engine.module, ref_grads, sp_size))
    return RankRow(
        scenario=name,
        host_syncs=len(scope.unexpected) if scope else None,
        problems=problems(result),
        cost=call_cost(engine, inputs, pc) if detect else None,
        site_lists=site_lists(scope),
        figures=result,
    )


def site_lists(scope: SyncScope | None) -> dict[str, tuple[SiteCount, ...]]:
    """The aggregation's sites, and apart the forward's (allowed); none without a scope."""
    if scope is None:
        return {}
    return {
        "sync_sites": tuple(scope.sync_sites()),
        "forward_syncs": tuple(scope.allowed_sync_sites()),
    }


def problems(result: dict) -> tuple[str, ...]:
    """What this rank saw go wrong, in words, for the report."""
    found = []
    if result["loss_ok"] is False:
        found.append(f"loss differs from the reference by {result['loss_abs_diff']:.3g}")
    if result["grads_ok"] is False:
        found.append(f"gradients differ by up to {result['grad_max_abs_diff']:.3g}")
    if result["backward_error"]:
        found.append(f"backward failed ({result['backward_error']})")
    return tuple(found)


def compare_grads(
    model: torch.nn.Module, ref_grads: dict[str, torch.Tensor], sp_size: int
) -> dict[str, bool | float | None]:
    """The engine's gradients, divided by sp_size, against the single-process ones.

    DeepSpeed averages gradients over data parallel but sums them over SP (DeepSpeed issue
    #5248), so after `engine.backward` they are sp_size times the reference, on every tree.
    """
    worst, ok = 0.0, True
    for name, param in model.named_parameters():
        grad = param.grad / sp_size if param.grad is not None else torch.zeros_like(param)
        expected = ref_grads[name]
        worst = max(worst, (grad - expected).abs().max().item())
        ok = ok and torch.allclose(grad, expected, atol=GRAD_ATOL, rtol=GRAD_RTOL)
    return {"grads_ok": ok, "grad_max_abs_diff": finite_or_none(worst), "grad_scale": sp_size}


def wait_for_device() -> None:
    """On a GPU the call returns before its kernels finish: time it to the end of its work."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def finite_or_none(value: float) -> float | None:
    """JSON has no NaN: a loss over zero label tokens is reported as null (undefined)."""
    return value if math.isfinite(value) else None


# --- the rank ------------------------------------------------------------------------------------


def setup_distributed(device_kind: str) -> torch.device:
    if device_kind == "cuda":
        local_rank = int(os.environ["LOCAL_RANK"])
        torch.cuda.set_device(local_rank)
        deepspeed.init_distributed(dist_backend="nccl")
        return torch.device("cuda", local_rank)
    deepspeed.init_distributed(dist_backend="gloo")
    return torch.device("cpu")


@rank_entry
def main() -> ReproRank:
    """One SP group spanning every rank (data-parallel size 1): all ranks share one sample."""
    args = repro_parser(__doc__.splitlines()[0]).parse_args()
    device = setup_distributed(args.device)
    sp_size = torch.distributed.get_world_size()
    model = sp_llama(device)
    batches = {name: full_batch(name, sp_size, device) for name in args.scenarios}
    references = {name: reference(model, batch) for name, batch in batches.items()}
    engine = sp_engine(model, sp_size, seq_len=TOKENS_PER_RANK * sp_size)
    pc = ParallelismConfig(sp_size=sp_size, sp_backend="deepspeed")
    setup = {
        "sp_size": sp_size,
        "backend": torch.distributed.get_backend(),
        "device": device.type,
    }
    return ReproRank(
        tuple(
            run_scenario(
                engine, pc, name, setup, batches[name], references[name], not args.no_detector
            )
            for name in args.scenarios
        )
    )


if __name__ == "__main__":
    main()
