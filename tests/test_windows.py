"""What a GPU pays for a wait: the idle window after it, and blocking copies to the device.

Labelled cases: after a stall the device has nothing to run until the host launches its next
kernel; that window is host time, measured here, and a free read inside it does not end it. A
blocking copy of host memory to the device is a wait of its own kind, and a read of a copy to
the host is no read. Windows are compared by their order of size, never against a clock.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from torch.utils.data import DataLoader

from hostsync.detector import AllowRule, SyncScope, SyncScopeError
from hostsync.detector.records import Cost, DeviceWork, HostSpan, Idle
from hostsync.detector.sites import DEVICE_COPY

HERE = "test_windows.py"


def matrix() -> torch.Tensor:
    return torch.arange(16.0).reshape(4, 4)


def host_work() -> int:
    """Pure Python work of some milliseconds: what a host does in a window (logging, collating)."""
    return sum(i * i for i in range(200_000))


def stall_then_host_work(t: torch.Tensor) -> None:
    """A read that stalls, host work, then the next kernel: one idle window."""
    (t @ t).sum().item()
    host_work()
    t + 1


def marking_steps() -> torch.optim.Optimizer:
    """An optimizer whose step changes nothing: it only marks a step."""
    return torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.0)


def test_the_window_after_a_stall_holds_the_host_work_before_the_next_kernel():
    t = matrix()
    with SyncScope(account=True) as idle:
        (t @ t).sum().item()
        host_work()
        t + 1
    with SyncScope(account=True) as busy:
        (t @ t).sum().item()
        t + 1
        host_work()
    (long,) = idle.windows
    (short,) = busy.windows
    assert long.us > 20 * max(short.us, 1.0), (long, short)


def test_a_free_read_inside_a_window_does_not_end_it_and_the_time_goes_to_the_next_call():
    t = matrix()
    with SyncScope(account=True) as scope:
        total = (t @ t).sum()
        total.item()  # stalls: opens the window
        host_work()
        total.item()  # free: the window goes on
        host_work()
        after = t + 1  # the next kernel: ends it
    first, second = scope.events
    assert (first.stall, second.stall) == (True, False)
    (window,) = scope.windows
    assert window.site == first.site
    statements = [span.statement for span in window.spans]
    read, kernel = second.site.line, second.site.line + 2
    assert statements[:2] in (
        [f"{HERE}:{read}", f"{HERE}:{kernel}"],
        [f"{HERE}:{kernel}", f"{HERE}:{read}"],
    )
    assert after is not None


DEVICE = torch.device("cpu")  # a device the statements do not spell: the GPU's on a GPU box
HOST_FACTORIES = {
    "zeros": lambda: torch.zeros(3),
    "ones": lambda: torch.ones(3),
    "arange": lambda: torch.arange(3),
    "randn": lambda: torch.randn(3),
    "full": lambda: torch.full((3,), 2.0),
}


@pytest.mark.parametrize("factory", HOST_FACTORIES.values(), ids=HOST_FACTORIES)
def test_a_host_memory_factory_inside_a_window_launches_nothing_and_does_not_end_it(factory):
    t = matrix()
    with SyncScope(account=True) as scope:
        (t @ t).sum().item()  # stalls: opens the window
        factory()
        host_work()
        t + 1  # the next kernel: ends it
    (window,) = scope.windows
    assert window.spans[0].statement == f"{HERE}:{_line_of('t + 1  # the next kernel')}"
    assert scope.work is not None and scope.work.kernels == 3  # mm, sum, add: no fill


def test_a_factory_on_the_device_ends_the_window():
    t = matrix()
    windows = []
    # The least of three: on a loaded machine the host may be preempted inside one window.
    for _ in range(3):
        with SyncScope(account=True) as scope:
            (t @ t).sum().item()
            torch.zeros(3, device=DEVICE)  # a fill kernel: ends the window
            host_work()
            t + 1
        (window,) = scope.windows
        windows.append(window)
    assert min(window.us for window in windows) * 20 < _host_work_us(), windows


def _line_of(code: str) -> int:
    lines = Path(__file__).read_text().splitlines()
    return next(number for number, line in enumerate(lines, 1) if line.strip().startswith(code))


def _host_work_us() -> float:
    started = time.perf_counter()
    host_work()
    return (time.perf_counter() - started) * 1e6


def test_idle_time_is_summed_per_optimizer_step():
    t, optimizer = matrix(), marking_steps()
    with SyncScope(account=True) as scope:
        for _ in range(3):
            stall_then_host_work(t)
            optimizer.step()
    cost = scope.cost(steps=3)
    assert len(cost.idle_us) == 3
    assert all(us > 0 for us in cost.idle_us)
    (site,) = cost.sites
    assert len(site.idle.windows_us) == 3


def test_a_blocking_copy_to_the_device_is_a_wait_of_its_own_kind_and_non_blocking_is_none():
    t = matrix()
    with SyncScope(account=True) as scope:
        host = torch.ones(4)  # made on the host: no device named
        t @ t
        host.to(t.device)  # waits for the matmul
        host.to(t.device, non_blocking=True)
        torch.tensor([1.0, 2.0], device=t.device)  # built on the host, then copied
    kinds = [(event.kind, event.stall) for event in scope.events]
    assert kinds == [(DEVICE_COPY, True), (DEVICE_COPY, False)]
    assert [event.site.line for event in scope.events] == [
        scope.events[0].site.line,
        scope.events[0].site.line + 2,
    ]


def test_what_a_dataloader_yields_is_host_memory_copied_to_the_device_once_per_tensor():
    data = [{"ids": torch.arange(4), "labels": torch.arange(4)} for _ in range(4)]
    device = matrix().device  # the training device (cuda on a GPU box)
    with SyncScope(account=True) as scope:
        for batch in DataLoader(data, batch_size=2):
            on_device = {key: value.to(device) for key, value in batch.items()}
            on_device["ids"].sum()
    assert [event.kind for event in scope.events] == [DEVICE_COPY] * 4


def test_a_read_of_a_copy_to_the_host_is_no_read():
    t = matrix()
    with SyncScope(account=True) as scope:
        host = (t * 2).cpu()
        host.sum().item()
        host.tolist()
    assert [event.kind for event in scope.events] == ["cpu"]
    assert scope.host_reads == 1


def test_an_allow_rule_naming_host_memory_makes_its_reads_no_waits():
    t = matrix()
    reading_host = AllowRule(HERE, reason="C++ state in host memory", host_memory=True)
    with SyncScope(allow=[reading_host], account=True) as scope:
        total = (t @ t).sum()
        total.item()
    assert scope.events == [] and scope.host_reads == 1
    with SyncScope(account=True) as unruled:
        total = (t @ t).sum()
        total.item()
    assert [event.stall for event in unruled.events] == [True]


def test_costs_measured_one_after_another_keep_their_idle_time_step_by_step():
    one = Cost(1, 2, 1, DeviceWork(3), idle_us=(10.0,))
    two = Cost(1, 1, 1, DeviceWork(1), idle_us=(30.0,))
    in_turn = Cost.in_sequence([one, two])
    assert (in_turn.steps, in_turn.reads, in_turn.idle_us) == (2, 3, (10.0, 30.0))
    ranks = in_turn + in_turn
    assert (ranks.steps, ranks.reads, ranks.idle_us) == (2, 6, (20.0, 60.0))


def test_an_idle_record_keeps_its_three_longest_statements():
    spans = [HostSpan("a.py:1", 5.0), HostSpan("b.py:2", 1.0), HostSpan("a.py:1", 5.0)]
    idle = Idle((4.0, 2.0, 9.0), ()) + Idle((), tuple(spans))
    assert (idle.median_us, idle.spread_us) == (4.0, (2.0, 9.0))
    assert idle.lines == (HostSpan("a.py:1", 10.0), HostSpan("b.py:2", 1.0))


def test_steps_no_optimizer_marks_are_marked_by_the_caller():
    t = matrix()
    with SyncScope(account=True) as scope:
        for _ in range(2):
            stall_then_host_work(t)
            scope.step()
    assert len(scope.cost(steps=2).idle_us) == 2
    with SyncScope() as gate, pytest.raises(SyncScopeError, match="account=True"):
        gate.step()


def test_a_wrapper_optimizers_step_right_after_the_real_one_is_the_same_step():
    t, inner, wrapper = matrix(), marking_steps(), marking_steps()
    with SyncScope(account=True) as scope:
        for _ in range(2):
            stall_then_host_work(t)
            inner.step()
            wrapper.step()  # no device work since the inner step: the same step
    assert len(scope.cost(steps=2).idle_us) == 2


def test_an_optimizer_step_inside_a_one_step_scope_splits_nothing():
    t, optimizer = matrix(), marking_steps()
    with SyncScope(account=True) as scope:
        stall_then_host_work(t)
        optimizer.step()
        stall_then_host_work(t)
    assert len(scope.cost().idle_us) == 1
