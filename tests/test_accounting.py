"""Cost, not counts: each read judged a stall or free, and the device work it waits for.

Labelled cases: a read stalls when device work was queued since the host last waited, and is
free when nothing was. Host tensors no code names as host (factory calls without a device, the
optimizers' step counters) are read for free, or not at all on a GPU.
"""

from __future__ import annotations

import io
import os
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file, save_file

from hostsync.detector import HostTracking, SyncScope, SyncScopeError
from hostsync.detector.records import Cost, DeviceWork
from hostsync.rank.protocol import free_port


def matrix() -> torch.Tensor:
    return torch.arange(16.0).reshape(4, 4)


def stalls(scope: SyncScope) -> list[bool]:
    return [event.stall for event in scope.events]


def test_a_read_right_after_a_read_is_free():
    t = matrix()
    with SyncScope(account=True) as scope:
        total = t.sum()
        total.item()
        total.item()
    assert stalls(scope) == [True, False]


def test_a_read_after_queued_work_stalls_and_names_that_work():
    a, b = matrix(), matrix()
    with SyncScope(account=True) as scope:
        product = a @ b
        product.sum().item()
    (event,) = scope.events
    # the matmul and the sum: two kernels, torch.utils.flop_counter's 2*4*4*4 for the matmul
    assert event.waited_for == DeviceWork(kernels=2, bytes=3 * 64 + 64 + 4, flops=128)


def test_a_read_of_a_host_copy_is_free_and_the_copy_itself_is_the_wait():
    t = matrix()
    with SyncScope(account=True) as scope:
        doubled = t * 2
        host = doubled.to("cpu", torch.float64)  # the blocking copy: waits for the multiply
        host.sum().item()  # host memory: no read at all
        host[0, 0].item()
    assert stalls(scope) == [True]


def test_reads_in_a_loop_stall_each_time_only_with_work_between_them():
    t = matrix()
    with SyncScope(account=True) as idle:
        total = t.sum()
        for _ in range(3):
            total.item()
    with SyncScope(account=True) as working:
        for row in t:
            (row * 2).sum().item()
    assert stalls(idle) == [True, False, False]
    assert stalls(working) == [True] * 4


def test_a_read_after_an_in_place_update_that_returns_nothing_stalls():
    params = [torch.nn.Parameter(matrix()) for _ in range(2)]
    for param in params:
        param.grad = torch.ones(4, 4)
    fused = torch.optim.AdamW(params, fused=True)
    norm = matrix().sum()
    with SyncScope(account=True) as scope:
        norm.item()  # nothing queued in the scope yet: free
        fused.step()  # aten._fused_adamw_ writes the parameters and returns ()
        norm.item()
        torch._foreach_mul_([param.grad for param in params], 0.5)  # returns () too
        norm.item()
    assert stalls(scope) == [False, True, True]


def test_views_and_allocations_queue_nothing():
    t = matrix()
    with SyncScope(account=True) as scope:
        t.sum().item()
        t.view(-1).t().unsqueeze(0)
        torch.empty(3, device=t.device)
        t.sum().item()
    assert stalls(scope) == [True, True]
    assert scope.cost().work.kernels == 2


def test_work_queued_over_thousands_of_calls_is_all_waited_for():
    t = matrix()
    calls = 2500  # more than the accounting keeps before adding them up
    with SyncScope(account=True) as scope:
        total = t.clone()
        for _ in range(calls):
            total.add_(t)  # reads both, writes `total`: 64 bytes each, counted once
        total.sum().item()
    (event,) = scope.events
    work = DeviceWork(kernels=calls + 2, bytes=128 + calls * 128 + 68)
    assert (event.waited_for, scope.work) == (work, work)


def test_the_flops_counted_are_torchs_flop_counter_s():
    torch.manual_seed(0)
    conv, linear = torch.nn.Conv2d(3, 4, 3), torch.nn.Linear(36, 8)
    images, a, b = torch.randn(2, 3, 8, 8), torch.randn(2, 4, 5), torch.randn(2, 5, 3)

    def work() -> None:
        features = conv(images).flatten(1)[:, :36]
        linear(features).sum().backward()
        torch.baddbmm(torch.zeros(2, 4, 3), a, b)
        torch.nn.functional.scaled_dot_product_attention(a, a, a)

    with torch.utils.flop_counter.FlopCounterMode(display=False) as counter:
        work()
    with SyncScope(account=True) as scope:
        work()
    assert scope.work is not None
    assert scope.work.flops == counter.get_total_flops() > 0


def test_the_cost_sums_reads_stalls_and_work_by_site():
    t = matrix()
    with SyncScope(account=True) as scope:
        for _ in range(2):
            total = t.sum()
            total.item(), total.item()
    cost = scope.cost(steps=2)
    assert (cost.steps, cost.reads, cost.stalls, cost.work.kernels) == (2, 4, 2, 2)
    (site,) = cost.sites
    assert (site.reads, site.stalls, site.waited_for.kernels) == (4, 2, 2)
    assert Cost.from_json(cost.to_json()) == cost


def test_a_gate_scope_does_not_account():
    t = matrix()
    with SyncScope() as scope:
        t.sum().item()
    (event,) = scope.events
    assert event.waited_for is None and not event.stall
    with pytest.raises(SyncScopeError, match="account=True"):
        scope.cost()


def test_an_accounting_scope_inside_a_gate_scope_is_refused_naming_the_fix():
    refused = pytest.raises(SyncScopeError, match="outermost scope with account=True")
    with SyncScope(), refused, SyncScope(account=True):
        pass


# --- host memory no code names -------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor")
def test_factories_without_a_device_make_host_memory():
    t = matrix()
    with SyncScope() as scope:
        torch.tensor(0.0).item()
        torch.zeros(()).item()
        torch.full((), 2.0).item()
        torch.zeros(3, device=t.device).sum().item()  # sync: the device is named
        torch.zeros_like(t).sum().item()  # sync: follows t
        torch.tensor(t).sum().item()  # sync: follows t
        torch.tensor([t[0, 0], t[0, 1]])  # sync 2: the host list reads each element
    assert sorted(scope.counts().values()) == [1, 1, 1, 2]


def test_a_file_loaded_with_safetensors_is_host_memory(tmp_path):
    """safetensors maps the file (`UntypedStorage.from_file`) and makes each tensor with
    `torch.asarray` of a slice of that storage, which reads the slice's first byte on the host:
    host memory on a GPU box too (`device="cuda"` moves the tensors only after)."""
    path = tmp_path / "weights.safetensors"
    save_file({"a": torch.ones(3), "b": torch.zeros(2, 2)}, path)
    with SyncScope() as scope:
        loaded = load_file(path)
        torch.asarray(torch.UntypedStorage(4), dtype=torch.uint8)  # sync: memory of no file
    assert list(scope.counts().values()) == [1]
    assert sorted(loaded) == ["a", "b"]


@pytest.mark.parametrize(
    "optimizer",
    [
        pytest.param(lambda p: torch.optim.AdamW(p), id="AdamW"),
        pytest.param(lambda p: torch.optim.Adam(p, foreach=False), id="Adam-single-tensor"),
        pytest.param(lambda p: torch.optim.Adam(p, foreach=True), id="Adam-foreach"),
        pytest.param(lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), id="SGD"),
    ],
)
def test_optimizer_steps_read_nothing_on_a_gpu_in_the_step_that_makes_state_and_after(optimizer):
    """Their step counters live on the host unless capturable or fused (torch/optim/adam.py)."""
    model = torch.nn.Linear(4, 2)
    opt = optimizer(model.parameters())
    for _ in range(2):
        model(torch.randn(3, 4)).sum().backward()
        with SyncScope() as scope:
            opt.step()
        assert not scope.events, scope.report()


# --- memory known from the script's start --------------------------------------------------------

DEVICE = torch.device("cpu")  # a device the statements do not spell: the GPU's on a GPU box


def test_tensors_made_before_the_first_step_are_host_or_device_as_they_were_made():
    """A dataset's index and a best-loss value made in setup are host memory; what is computed
    from them too; a tensor made on the device stays the device's."""
    with HostTracking():
        index = torch.arange(8)
        best = torch.tensor(float("inf"))
        weights = torch.ones(3, device=DEVICE)
        with SyncScope(account=True) as scope:
            index[2].item()
            if best > 1.0:
                best = torch.tensor(1.0)
            weights.sum().item()  # the one read
    assert [event.site.code for event in scope.events] == ["weights.sum().item()  # the one read"]


class _Images(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """torchvision's MNIST in small: its tensors are views of a buffer made in setup, its
    samples go through numpy and come back normalized on the device of their own tensor."""

    def __init__(self) -> None:
        self.data = torch.frombuffer(bytearray(32), dtype=torch.uint8).view(2, 4, 4)
        self.targets = torch.frombuffer(bytearray(2), dtype=torch.uint8).view(2).long()

    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image, target = self.data[index], int(self.targets[index])
        tensor = torch.from_numpy(image.numpy().copy()).unsqueeze(0).float().div(255)
        mean = torch.as_tensor([0.5], dtype=tensor.dtype, device=tensor.device)
        if (mean == 0).any():
            raise ValueError("a zero mean")
        return tensor.sub(mean.view(-1, 1, 1)), target


def test_a_datasets_setup_views_and_its_numpy_samples_are_host_memory():
    with HostTracking():
        loader = torch.utils.data.DataLoader(_Images(), batch_size=2)
        with SyncScope(account=True) as scope:
            for images, targets in loader:
                images.to(DEVICE)  # the one wait of each batch
                targets.to(DEVICE, non_blocking=True)
    assert [event.kind for event in scope.events] == ["device_copy"]


def test_a_read_under_inference_mode_is_a_read_under_the_accounting_too():
    """A tensor made under inference_mode has no autograd key: `item` reaches the mode whole."""
    weights = torch.ones(3, device=DEVICE)
    with SyncScope(account=True) as scope, torch.inference_mode():
        (weights * 2).sum().item()
    assert [event.site.code for event in scope.events] == ["(weights * 2).sum().item()"]


@pytest.mark.parametrize(
    "optimizer",
    [
        pytest.param(lambda p: torch.optim.Adagrad(p), id="Adagrad-state-made-in-setup"),
        pytest.param(lambda p: torch.optim.AdamW(p), id="AdamW-state-made-in-the-first-step"),
    ],
)
def test_an_optimizer_reads_nothing_whether_it_made_its_state_in_setup_or_in_a_step(optimizer):
    with HostTracking():
        model = torch.nn.Linear(4, 2)
        opt = optimizer(model.parameters())
        for _ in range(2):
            with SyncScope(account=True) as scope:
                model(torch.randn(3, 4)).sum().backward()
                opt.step()
            assert not scope.events, scope.report()


def test_a_factory_inside_a_device_context_is_where_the_context_puts_it():
    """torch finds the default device of `with torch.device(...)` by making a tensor: the
    detector asks without making one, so that it does not judge its own question again."""
    with HostTracking():
        with torch.device("cpu"):
            host = torch.zeros(2)
        with torch.device("meta"):
            meta = torch.zeros(2)
        with SyncScope(account=True) as scope:
            host.tolist()
            meta.sum()
    assert scope.events == []
    assert scope.work.kernels == 1


def test_a_numpy_array_copied_to_the_device_is_a_blocking_copy_as_a_list_is():
    array = np.ones(3, dtype=np.float32)
    with SyncScope(account=True) as scope:
        torch.from_numpy(array).to(DEVICE)
        torch.tensor(array.tolist()).to(DEVICE)
        torch.from_numpy(array).sum().item()  # host memory: free
    assert [event.kind for event in scope.events] == ["device_copy", "device_copy"]


def test_a_checkpoint_loaded_onto_the_device_copies_each_storage_and_onto_the_host_none():
    saved = io.BytesIO()
    weights = torch.ones(4, device=DEVICE)
    torch.save({"a": weights, "view": weights[:2], "b": torch.zeros(2, device=DEVICE)}, saved)
    with SyncScope(account=True) as scope:
        saved.seek(0)
        torch.load(saved, map_location=DEVICE)
        saved.seek(0)
        on_host = torch.load(saved, map_location="cpu")
        on_host["a"].tolist()  # host memory: free
    assert [(event.kind, event.op) for event in scope.events] == [("device_copy", "torch.load")] * 2


# --- collectives, across real processes ----------------------------------------------------------


def _read_after_collective(rank: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    try:
        device_total = torch.ones(1) * (rank + 1)  # made outside a scope: device memory
        with SyncScope(account=True) as scope:
            device_total.item()  # nothing queued: free
            dist.all_reduce(device_total)
            value = device_total.item()  # waits for the collective
        waited = [event.waited_for.collectives for event in scope.events]
        (Path(out) / f"rank-{rank}").write_text(f"{stalls(scope)} {waited} {value}")
    finally:
        dist.destroy_process_group()


@pytest.mark.distributed
def test_a_read_after_a_collective_stalls(tmp_path):
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.spawn(_read_after_collective, args=(free_port(), str(tmp_path)), nprocs=2)
    for rank in range(2):
        assert (tmp_path / f"rank-{rank}").read_text() == "[False, True] [0, 1] 3.0"
