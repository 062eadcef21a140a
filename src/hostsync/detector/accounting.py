"""Which host reads stall a GPU, and the device work each stall waits for.

A read costs a GPU only when device work was queued since the host last waited for it (the
previous read, a blocking copy): then the host stalls until that work is done. A read right
after another read costs nothing, the stream is already drained. The detector's scopes turn
this on with `SyncScope(account=True)`; the gate (a plain scope, the pytest plugin) never pays
for it.

Device work is what a GPU would run on its streams, counted below autograd (a dispatch mode):
each operator that makes or writes tensors launches a kernel, except views, allocations and
computations on host memory; collectives (c10d's operators: gloo's block the host here) are
counted as the kernels NCCL's would be. Each kernel's bytes are those of the tensors it reads
and writes, its FLOPs torch.utils.flop_counter's formula for the operator (0 where it has none).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from typing import Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from hostsync.detector.ops import OpCall
from hostsync.detector.records import DeviceWork

_aten = torch.ops.aten
# Operators that make or describe tensors without running a kernel on a device.
_NO_KERNEL = {
    _aten.empty.memory_format,
    _aten.empty_strided.default,
    _aten.empty_like.default,
    _aten.new_empty.default,
    _aten.new_empty_strided.default,
    _aten.lift_fresh.default,
    _aten.detach.default,
    _aten.alias.default,
    _aten.set_.source_Storage_storage_offset,
    _aten.resize_.default,
}
# Operators that return a Python value, not a tensor, after running kernels of their own.
_READS_AFTER_KERNELS = {_aten.equal.default}


class HostMemory(Protocol):
    """What the accounting asks the detector: which tensors live in host memory."""

    def holds(self, tensor: object) -> bool: ...


class Accounting(TorchDispatchMode):
    """Device work in total and since the host last waited, counted per aten call.

    A higher-order operator (vmap's `custom_function_call`, `invoke_subgraph`) launches no
    kernel of its own: it runs as it would without the mode, which torch pops for the call, so
    the work of its body is not counted (its reads still are: the detector's kernels judge them).
    """

    supports_higher_order_operators = True

    def __init__(self, host: HostMemory) -> None:
        super().__init__()
        self.host = host
        self.total = DeviceWork()
        self._queued = DeviceWork()
        self._last: tuple[int, DeviceWork] | None = None
        self._lock = threading.Lock()

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Sequence[type],
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        if isinstance(func, torch._ops.HigherOrderOperator):
            return result
        work = self.work_of(func, OpCall(args, kwargs), result)
        if work.queued:
            with self._lock:
                self.total += work
                self._queued += work
                self._last = (id(result), work)
        return result

    def work_of(self, func: torch._ops.OpOverload, call: OpCall, result: object) -> DeviceWork:
        """The device work one call launches (nothing for views, allocations, host memory)."""
        inputs = list(_tensors(call.args, call.kwargs))
        outputs = list(_tensors(result)) or list(_written(func, call))
        if func.namespace == "c10d":
            return DeviceWork(1, 1, _bytes(inputs), 0)
        if func in _NO_KERNEL or func.is_view:
            return DeviceWork()
        if not outputs and func not in _READS_AFTER_KERNELS:
            return DeviceWork()
        if inputs and all(self.host.holds(tensor) for tensor in inputs):
            return DeviceWork()
        formula = flop_registry.get(func._overloadpacket)
        flops = formula(*call.args, **call.kwargs, out_val=result) if formula else 0
        moved = {id(tensor): tensor for tensor in (*inputs, *outputs)}
        return DeviceWork(1, 0, _bytes(moved.values()), int(flops))

    def waited(self) -> DeviceWork:
        """The host waits for the device now: the work it waits for (empty when free)."""
        with self._lock:
            queued, self._queued, self._last = self._queued, DeviceWork(), None
        return queued

    def retract(self, made: torch.Tensor) -> None:
        """`made`, the last call's result, turned out to be host memory: no device ran it."""
        with self._lock:
            if self._last is not None and self._last[0] == id(made):
                self.total -= self._last[1]
                self._queued -= self._last[1]
                self._last = None


def _tensors(*values: object) -> Iterator[torch.Tensor]:
    for value in values:
        if isinstance(value, torch.Tensor):
            yield value
        elif isinstance(value, list | tuple):
            yield from _tensors(*value)
        elif isinstance(value, dict):
            yield from _tensors(*value.values())


def _written(func: torch._ops.OpOverload, call: OpCall) -> Iterator[torch.Tensor]:
    """The tensors a call writes in place: what `_foreach_*_` and the fused optimizers update,
    though they return nothing."""
    for index, argument in enumerate(func._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            yield from _tensors(call.argument(index, argument.name))


def _bytes(tensors: Iterator[torch.Tensor] | Sequence[torch.Tensor]) -> int:
    return sum(tensor.numel() * tensor.element_size() for tensor in tensors)
