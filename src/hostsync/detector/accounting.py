"""Which host waits stall a GPU, the device work each stall waits for, and the idle window after.

A wait (a read, a blocking copy to the device) costs a GPU only when device work was queued
since the host last waited for it: then the host stalls until that work is done. A wait right
after another costs nothing, the stream is already drained. What the GPU pays is the window
after a stall: the queue is empty, and the device idles until the host launches its next
kernel. On a CPU that window is the host's time from the stall's return to the next operator
that would launch a kernel: Python, work on host memory, data loading, logging. A free read
inside it does not end it. It is timed here with the detector's own time taken out (its
bookkeeping, measured; each dispatch through its Python mode, calibrated once per process),
and the time is charged to the statements the host reached, each span to the torch call (or
read) that ended it. A window still open when the outermost scope closes ends there. The
detector's scopes turn this on with `SyncScope(account=True)`; the gate (a plain scope, the
pytest plugin) never pays for it.

Device work is what a GPU would run on its streams, counted below autograd (a dispatch mode):
each operator that makes or writes tensors launches a kernel, except views, allocations and
computations on host memory; collectives (c10d's operators: gloo's block the host here) are
counted as the kernels NCCL's would be. Each kernel's bytes are those of the tensors it reads
and writes, its FLOPs torch.utils.flop_counter's formula for the operator (0 where it has none).
What is computed from host memory alone is host memory too: the accounting tells the detector.

Every aten call pays for this in Python, so a call does little: what an operator is to the
accounting is decided once, by the operator's id; a call's work is appended without a lock and
added up when read; FLOP formulas get their shapes without pytree.
"""

from __future__ import annotations

import functools
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import NamedTuple, Protocol

import torch
from torch._C._dynamo.eval_frame import set_eval_frame as _set_eval_frame
from torch.optim.optimizer import register_optimizer_step_post_hook
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry, shape_wrapper

from hostsync.detector.records import DeviceWork, HostSpan
from hostsync.detector.sites import Site

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
    """What the accounting asks the detector: which tensors live in host memory, and what it
    tells it: what was computed from host memory alone."""

    def holds(self, tensor: object) -> bool: ...

    def made(self, values: object) -> None: ...

    def viewed(self, source: object, view: object) -> None: ...


@dataclass(frozen=True)
class Window:
    """One idle window: the stall that opened it, the optimizer step it opened in (counted from
    the accounting's start), its host time and where that time went (microseconds)."""

    site: Site
    step: int
    us: float
    spans: tuple[HostSpan, ...]


@dataclass
class _Opening:
    site: Site
    step: int
    started: int
    own: int = 0
    last: int = 0
    spans: dict[str, int] = field(default_factory=dict)


class DetectorMode(TorchDispatchMode):
    """A dispatch mode of the detector. Its frames are never compiled: torch wraps every mode's
    in dynamo's `disable`, which costs a fifth of a call; one call each way does the same.

    A mode runs below autograd, with the keys above it excluded. An operator autograd would
    have decomposed (`item` of a tensor made under inference_mode) is run as Python calls it,
    with `judging`, the key of the detector's kernels, and ADInplaceOrView let in: its parts
    are judged as they are without the mode."""

    def __init__(self, judging: torch._C.DispatchKey | None = None) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's, unannotated
        self._judging = judging

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        return False

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Sequence[type],
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        compiling = _set_eval_frame(None)
        try:
            op = _OPS.get(id(func)) or _op(func)
            if op.decomposes and self._judging is not None:
                with _above_autograd(self._judging):
                    return self.dispatch(op, args, kwargs or _NO_KWARGS)
            return self.dispatch(op, args, kwargs or _NO_KWARGS)
        finally:
            _set_eval_frame(compiling)

    def dispatch(self, op: Op, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        """One aten call, which the mode runs (torch pops it for the call)."""
        return op.call(*args, **kwargs)


_BELOW_AUTOGRAD = torch._C.DispatchKey.ADInplaceOrView
# A call's keywords where it has none: read, never written.
_NO_KWARGS: dict[str, object] = {}


@contextmanager
def _above_autograd(judging: torch._C.DispatchKey) -> Iterator[None]:
    """The calls made here reach the `judging` key as Python's calls do, above autograd."""
    keys = (judging, _BELOW_AUTOGRAD)
    excluded = [torch._C._dispatch_tls_is_dispatch_key_excluded(key) for key in keys]
    for key in keys:
        torch._C._dispatch_tls_set_dispatch_key_excluded(key, False)
    try:
        yield
    finally:
        for key, was in zip(keys, excluded, strict=True):
            torch._C._dispatch_tls_set_dispatch_key_excluded(key, was)


class _Tally:
    """Device work added up in place."""

    __slots__ = ("bytes", "collectives", "flops", "kernels")

    def __init__(self) -> None:
        self.kernels = self.collectives = self.bytes = self.flops = 0

    def add(self, kernels: int, collectives: int, moved: int, flops: int) -> None:
        self.kernels += kernels
        self.collectives += collectives
        self.bytes += moved
        self.flops += flops

    @property
    def work(self) -> DeviceWork:
        return DeviceWork(self.kernels, self.collectives, self.bytes, self.flops)


# One call's work: its result's id, kernels, collectives, bytes and FLOPs.
_Call = tuple[int, int, int, int, int]
# Calls whose work waits to be added up, at most.
_FOLDED_AT = 1024


class Op(NamedTuple):
    """What one operator is to the detector's modes, decided once per process from its schema.

    `call` runs it: an OpOverload's C++ callable, without its Python `__call__`. `decomposes`:
    autograd decomposes it before a mode sees it (CompositeImplicitAutograd, `item`); one
    reaches a mode only for tensors with no autograd key (made under inference_mode), and the
    detector's kernels would take its parts for calls below autograd (the mode runs there).
    """

    func: object  # kept alive, so that its id names it in `_OPS`
    call: Callable[..., object]
    decomposes: bool
    higher_order: bool
    collective: bool
    view: bool
    launches: bool
    reads_after_kernels: bool
    written: tuple[tuple[int, str], ...]
    formula: Callable[..., int] | None


# By the operator's id: an operator's own hash is a Python call.
_OPS: dict[int, Op] = {}


def _op(func: torch._ops.OpOverload) -> Op:
    """`func` to the detector's modes, kept in `_OPS`."""
    if isinstance(func, torch._ops.HigherOrderOperator):
        op = _OPS[id(func)] = Op(func, func, False, True, False, False, False, False, (), None)
        return op
    written = tuple(
        (index, argument.name)
        for index, argument in enumerate(func._schema.arguments)
        if argument.alias_info is not None and argument.alias_info.is_write
    )
    op = _OPS[id(func)] = Op(
        func=func,
        call=func._op if type(func) is torch._ops.OpOverload else func,
        decomposes=torch._C._dispatch_has_kernel_for_dispatch_key(
            func.name(), "CompositeImplicitAutograd"
        ),
        higher_order=False,
        collective=func.namespace == "c10d",
        view=func.is_view,
        launches=func not in _NO_KERNEL and not func.is_view,
        reads_after_kernels=func in _READS_AFTER_KERNELS,
        written=written,
        formula=_formula(flop_registry.get(func._overloadpacket)),
    )
    return op


class Accounting(DetectorMode):
    """Device work in total and since the host last waited, counted per aten call, and the idle
    windows after stalls (`windows`, in order; `step`: optimizer steps seen so far).

    A higher-order operator (vmap's `custom_function_call`, `invoke_subgraph`) launches no
    kernel of its own: it runs as it would without the mode, which torch pops for the call, so
    the work of its body is not counted (its reads still are: the detector's kernels judge them).
    `locate` names the statement the host is at (`file:line`), for the spans of a window.
    """

    supports_higher_order_operators = True

    def __init__(
        self, host: HostMemory, locate: Callable[[], str], judging: torch._C.DispatchKey
    ) -> None:
        super().__init__(judging)
        self.host = host
        self.windows: list[Window] = []
        self.step = 0
        # The work up to the host's last wait, and the work queued since: their sum is the total.
        # Each call's work is appended to `_calls` (an append needs no lock), added up into
        # `_queued` when read, or when `_FOLDED_AT` calls wait there.
        self._waited = DeviceWork()
        self._total_at_step = DeviceWork()
        self._locate = locate
        self._queued = _Tally()
        self._calls: deque[_Call] = deque()
        # The last call that launched work.
        self._last: _Call | None = None
        self._opening: _Opening | None = None
        self._hosting = 0
        self._per_dispatch = _dispatch_ns()
        self._lock = threading.Lock()
        self._stepping = register_optimizer_step_post_hook(self.stepped)

    @property
    def total(self) -> DeviceWork:
        """The device work counted so far."""
        with self._lock:
            self._fold()
            return self._waited + self._queued.work

    def dispatch(self, op: Op, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        opening = self._opening
        if opening is not None:
            return self._in_window(opening, op, args, kwargs)
        result = op.call(*args, **kwargs)
        self._launch(op, args, kwargs, result)
        return result

    def _in_window(
        self,
        opening: _Opening,
        op: Op,
        args: tuple[object, ...],
        kwargs: dict[str, object],
    ) -> object:
        """One call while a window is open: the first to launch ends it, the others are the
        host time inside it."""
        entered = time.perf_counter_ns()
        result = op.call(*args, **kwargs)
        if op.higher_order:
            return result
        returned = time.perf_counter_ns()
        if self._launch(op, args, kwargs, result):
            self._close(entered)
        else:
            counted = time.perf_counter_ns()
            opening.own += int(self._per_dispatch) + counted - returned
            self._span(opening, returned)  # the call's own host work is its statement's
            opening.last = time.perf_counter_ns()
        return result

    def _launch(
        self, op: Op, args: tuple[object, ...], kwargs: dict[str, object], result: object
    ) -> bool:
        """Count the device work of one call; whether it launched any. Views, allocations and
        work on host memory launch none (all of it while `hosting`); what is computed from host
        memory alone is host memory too."""
        tensors = _tensor_list(args)  # its inputs, then its outputs
        if kwargs:
            tensors += _tensor_list(kwargs.values())
        if op.collective and not self._hosting:
            kernels, collectives, flops = 1, 1, 0
            moved = sum(tensor.nbytes for tensor in tensors)
        else:
            holds = self.host.holds  # the first tensor, seldom host memory, decides most calls
            if tensors and holds(tensors[0]) and all(map(holds, tensors)):
                self.host.made(result)
                return False
            if op.view and tensors:
                self.host.viewed(tensors[0], result)
            if not op.launches or self._hosting:
                return False
            if type(result) is torch.Tensor:
                tensors.append(result)
            else:
                outputs = _tensor_list((result,))
                if not outputs and op.written:
                    outputs = _written(op, args, kwargs)
                if not outputs and not op.reads_after_kernels:
                    return False
                tensors += outputs
            kernels, collectives = 1, 0
            flops = int(op.formula(*args, **kwargs, out_val=result)) if op.formula else 0
            moved = _bytes(tensors)
        call = self._last = (id(result), kernels, collectives, moved, flops)
        calls = self._calls
        calls.append(call)
        if len(calls) >= _FOLDED_AT:
            with self._lock:
                self._fold()
        return True

    def _fold(self) -> None:
        """The calls appended so far, added up into `_queued` (the lock held)."""
        calls, queued = self._calls, self._queued
        while calls:
            _, kernels, collectives, moved, flops = calls.popleft()
            queued.add(kernels, collectives, moved, flops)

    def drained(self, site: Site) -> None:
        """A stall at `site` has just returned: the device idles from now until the next launch."""
        now = time.perf_counter_ns()
        self._opening = _Opening(site, self.step, now, last=now)

    def own_begins(self) -> tuple[_Opening, int] | None:
        """The detector's own work begins (a read's bookkeeping): not host time of the window it
        falls in; the span before it ends at its statement. Hand the mark to `own_ends`."""
        opening = self._opening
        if opening is None:
            return None
        began = time.perf_counter_ns()
        self._span(opening, began)
        return opening, began

    def own_ends(self, mark: tuple[_Opening, int] | None) -> None:
        if mark is None or self._opening is not mark[0]:
            return
        ended = time.perf_counter_ns()
        mark[0].own += ended - mark[1]
        mark[0].last = ended

    @contextmanager
    def hosting(self) -> Iterator[None]:
        """Every call in this block works on host memory (a DataLoader collating a batch)."""
        self._hosting += 1
        try:
            yield
        finally:
            self._hosting -= 1

    def own(self, ns: int) -> None:
        """`ns` of the detector's own time (a wrapper's), spent in the window now open."""
        if self._opening is not None:
            self._opening.own += ns

    def close(self) -> None:
        """The measurement ends: a window still open ends now, and steps are no longer seen."""
        if self._opening is not None:
            self._close(time.perf_counter_ns())
        self._stepping.remove()

    def _span(self, opening: _Opening, now: int) -> None:
        began = time.perf_counter_ns()
        statement = self._locate()
        opening.spans[statement] = opening.spans.get(statement, 0) + now - opening.last
        opening.own += time.perf_counter_ns() - began

    def _close(self, now: int) -> None:
        opening, self._opening = self._opening, None
        if opening is None:
            return
        host = max(0, now - opening.started - opening.own)
        self._span(opening, now)  # its own time lies past the window's end
        # Spans hold the mode's dispatch time too: scaled to the window's host time.
        spent = sum(opening.spans.values()) or 1
        spans = tuple(
            HostSpan(statement, round(ns * host / spent / 1000, 1))
            for statement, ns in sorted(opening.spans.items(), key=lambda item: -item[1])[:3]
        )
        self.windows.append(Window(opening.site, opening.step, round(host / 1000, 1), spans))

    def stepped(self, *_: object) -> None:
        """A step ended (an optimizer's, or one the caller marks): windows opened from now on
        count in the next. Marks with no device work between them are one: a wrapper's step
        (accelerate's around DeepSpeed's, whose engine steps the optimizer itself) is the same
        step."""
        if self.total != self._total_at_step:
            self.step += 1
            self._total_at_step = self.total

    def waited(self) -> DeviceWork:
        """The host waits for the device now: the work it waits for (empty when free)."""
        with self._lock:
            self._fold()
            queued, self._queued, self._last = self._queued.work, _Tally(), None
            self._waited += queued
        return queued

    def retract(self, made: torch.Tensor) -> None:
        """`made`, the last call's result, turned out to be host memory: no device ran it."""
        with self._lock:
            if self._last is not None and self._last[0] == id(made):
                kernels, collectives, moved, flops = self._last[1:]
                self._queued.add(-kernels, -collectives, -moved, -flops)
                self._last = None


@functools.cache
def _dispatch_ns() -> float:
    """What one aten call pays for passing through a Python dispatch mode that only runs it,
    in nanoseconds on this CPU: the part of the detector's time no clock inside it can see."""
    a, b = torch.ones(1), torch.ones(1)

    def timed(calls: int) -> int:
        began = time.perf_counter_ns()
        for _ in range(calls):
            torch.add(a, b)
        return time.perf_counter_ns() - began

    calls = 400
    timed(calls)
    plain = min(timed(calls) for _ in range(3))
    with DetectorMode():
        passed = min(timed(calls) for _ in range(3))
    return max(0.0, (passed - plain) / calls)


_NESTED = (list, tuple, dict)


def _tensor_list(values: Iterable[object]) -> list[torch.Tensor]:
    """The tensors among `values`, and in their lists, tuples and dicts, in order."""
    found: list[torch.Tensor] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, _NESTED):
            found += _tensor_list(value.values() if isinstance(value, dict) else value)
    return found


def _written(op: Op, args: tuple[object, ...], kwargs: dict[str, object]) -> list[torch.Tensor]:
    """The tensors a call writes in place: what `_foreach_*_` and the fused optimizers update,
    though they return nothing."""
    found: list[torch.Tensor] = []
    for index, name in op.written:
        found += _tensor_list((args[index] if index < len(args) else kwargs.get(name),))
    return found


# torch's wrapper of a formula that takes shapes: pytree's tree_map finds them, slowly.
_TAKES_SHAPES = shape_wrapper(lambda: 0).__code__


def _formula(counts: Callable[..., int] | None) -> Callable[..., int] | None:
    """torch's FLOP formula of an operator, called with shapes for tensors as its wrapper does."""
    if counts is None or getattr(counts, "__code__", None) is not _TAKES_SHAPES:
        return counts
    formula: Callable[..., int] = counts.__wrapped__  # type: ignore[attr-defined]

    def shaped(*args: object, out_val: object = None, **kwargs: object) -> int:
        kwargs = {name: _shapes(value) for name, value in kwargs.items()}
        return formula(*map(_shapes, args), out_shape=_shapes(out_val), **kwargs)

    return shaped


def _shapes(value: object) -> object:
    """`value` with each tensor in it, or in its lists and tuples, replaced by its shape."""
    if isinstance(value, torch.Tensor):
        return value.shape
    if isinstance(value, list):
        return [_shapes(item) for item in value]
    if isinstance(value, tuple):
        return tuple(_shapes(item) for item in value)
    return value


def _bytes(tensors: list[torch.Tensor]) -> int:
    """The bytes of `tensors`, each counted once."""
    seen = set()
    moved = 0
    for tensor in tensors:
        key = id(tensor)
        if key not in seen:
            seen.add(key)
            moved += tensor.nbytes
    return moved
