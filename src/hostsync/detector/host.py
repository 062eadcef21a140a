"""Which tensors would live in host memory on a GPU box, where every tensor here is the host's.

Reads of host memory are free and copies into it count, so the detector must know it. The
model is "every tensor would be on the GPU", except what the code names as host memory, what a
factory makes with no device while the default is the CPU, storages over a file, and what is
computed from host memory alone.
"""

from __future__ import annotations

import functools
import re
import weakref
from collections.abc import Callable, Iterator, Mapping
from types import FrameType

import torch

from hostsync.detector import frames
from hostsync.detector.accounting import DetectorMode, Op
from hostsync.detector.sites import Site

# Tensors known to live in host memory, by id, process-wide (see HostMemory).
ON_HOST: dict[int, weakref.ref[torch.Tensor]] = {}
# Views over host memory that stand for device memory: a view `.to(device)` returned as itself
# (on a GPU box, a copy on the device), and the views made from those.
ON_DEVICE: dict[int, weakref.ref[torch.Tensor]] = {}
# The memory of each storage made from a file, by the id of the storage while it lives (no other
# storage can be given its addresses before): first address and the one past its end.
FROM_FILES: dict[int, tuple[int, int]] = {}

_NAMES_HOST = re.compile(r"\bcpu\b|pin_memory")
# A device taken from a tensor (`device=tensor.device`): the host's where that is host memory.
_DEVICE_OF = re.compile(r"\b([A-Za-z_]\w*)\.device\b")


class HostMemory:
    """Tensors known to live in host memory even on a GPU box: what the code put there by name.

    On CPU every tensor is in host memory, so the model is "every tensor would be on the GPU",
    except those created with a named host destination (`device="cpu"`, `pin_memory=True`,
    `.to("cpu", dtype)` when it makes a new tensor) and their views and results. A device value
    is ambiguous here (`args.device` is cpu on CPU, cuda on the GPU box), so a destination counts
    as host only when the statement spells it, or takes it from host memory (`x.device`).
    A view of host memory is host memory (its `_base` is), unless it stood for a device copy.

    A factory call that names no device and takes no tensor (`torch.tensor(0.0)`,
    `torch.zeros(())`) makes host memory on a GPU box too, while the default device is the CPU,
    and so does a file: a storage `UntypedStorage.from_file` made (safetensors loads so) is host
    memory, as is every tensor over it while the storage lives. What is known to be host memory
    stays known across scopes (optimizer state outlives the step that made it: AdamW's `step`
    counters when neither capturable nor fused); what is computed from it is followed only in the
    scope that named it, and not from a factory's result alone (that would put every later aten
    call of the gate through Python). `propagate` starts that following.
    """

    def __init__(self, propagate: Callable[[], None]) -> None:
        self._propagate = propagate
        # Named in this context's scopes, by id: a WeakSet compares tensors with ==, which is
        # elementwise.
        self._tensors: dict[int, weakref.ref[torch.Tensor]] = {}

    def __bool__(self) -> bool:
        return bool(self._tensors)

    def holds(self, tensor: object) -> bool:
        if ON_HOST:
            if _known(ON_HOST, tensor):
                return True
            base = getattr(tensor, "_base", None)
            if base is not None and _known(ON_HOST, base) and not _known(ON_DEVICE, tensor):
                return True
        return bool(FROM_FILES) and over_a_file(tensor)

    @staticmethod
    def made(values: object) -> None:
        """`values` live in host memory, from now on and in every scope."""
        for value in tensors_in(values):
            _keep(ON_HOST, value)

    def moved(self, tensor: torch.Tensor) -> None:
        """`tensor` is what a call to a device returned (`.to(device)`): device memory on a GPU
        box. On CPU it is the source itself, or a copy (`.to("cpu:0")`) made from host memory,
        and is what the code goes on to use. A view's own views are followed from then on:
        their base is still host memory."""
        ON_HOST.pop(id(tensor), None)
        if tensor._base is not None and self.holds(tensor):
            _keep(ON_DEVICE, tensor)
            self._propagate()

    @staticmethod
    def viewed(source: object, view: object) -> None:
        """`view` was made from `source`, device memory: a view that stands for a device copy
        stays device memory, though its base is the host's (a dispatch mode sees the view
        before autograd gives it its base)."""
        if ON_DEVICE and _known(ON_DEVICE, source) and isinstance(view, torch.Tensor):
            _keep(ON_DEVICE, view)

    def named(self) -> bool:
        """Whether the statement making the call, or the one its reads are counted at, spells
        host memory (torch's AdamW spells `device="cpu"` for its step counters), or takes the
        device of a host tensor (torchvision's `device=tensor.device`)."""
        return any(self._names_host(*frame) for frame in (frames.statement(), frames.caller_site()))

    def _names_host(self, frame: FrameType | None, statement: Site) -> bool:
        if _NAMES_HOST.search(statement.code):
            return True
        names = _DEVICE_OF.findall(statement.code) if frame is not None else ()
        return any(self.holds(frame.f_locals.get(name)) for name in names if frame is not None)

    def add(self, values: object, propagate: bool = True) -> None:
        """`values` live in host memory; with `propagate`, so will what is computed from them."""
        self.made(values)
        for value in tensors_in(values):
            _keep(self._tensors, value)
        if propagate and self._tensors:
            self._propagate()

    def clear(self) -> None:
        self._tensors.clear()


def _keep(table: dict[int, weakref.ref[torch.Tensor]], tensor: torch.Tensor) -> None:
    """`tensor` in `table`, by id, while it lives."""
    key = id(tensor)
    table[key] = weakref.ref(tensor, functools.partial(_forget, table, key))


def _known(table: dict[int, weakref.ref[torch.Tensor]], tensor: object) -> bool:
    held = table.get(id(tensor))
    return held is not None and held() is tensor


def _forget(table: dict[int, weakref.ref[torch.Tensor]], key: int, _: object) -> None:
    """A tensor of `table` is gone: its id may be given to another."""
    table.pop(key, None)


class NothingOnHost:
    """A host model that holds no tensor: what a rule counts when every tensor is the device's."""

    @staticmethod
    def holds(tensor: object) -> bool:
        return False

    @staticmethod
    def named() -> bool:
        return False


NOTHING_ON_HOST = NothingOnHost()


def over_a_file(value: object) -> bool:
    """Whether a tensor's (or a storage's) memory lies in a storage made from a file."""
    if isinstance(value, torch.Tensor) and torch._C._has_storage(value):
        value = value.untyped_storage()
    if not isinstance(value, torch.UntypedStorage):
        return False
    address = value.data_ptr()
    return any(start <= address < end for start, end in list(FROM_FILES.values()))


def tensors_in(values: object) -> Iterator[torch.Tensor]:
    if isinstance(values, torch.Tensor):
        yield values
    elif isinstance(values, list | tuple):
        for value in values:
            yield from tensors_in(value)
    elif isinstance(values, Mapping):
        yield from tensors_in(list(values.values()))


class HostPropagation(DetectorMode):
    """Results of aten calls whose tensor inputs all live in host memory live there too.

    A higher-order operator is judged by the same rule on its inputs and results, its body
    unobserved by the mode (torch pops it for the call)."""

    supports_higher_order_operators = True

    def __init__(self, host: HostMemory, judging: torch._C.DispatchKey) -> None:
        super().__init__(judging)
        self.host = host

    def dispatch(self, op: Op, args: tuple[object, ...], kwargs: dict[str, object]) -> object:
        result = op.call(*args, **kwargs)
        inputs = [*tensors_in(args), *tensors_in(list(kwargs.values()))]
        if inputs and all(self.host.holds(tensor) for tensor in inputs):
            self.host.add(result)
        elif inputs and op.view:
            self.host.viewed(inputs[0], result)
        return result
