"""What exists once per process: torch's own functions, replaced while any scope is open.

Python-level calls never reach the detector's kernels (`.tolist()`, `.cpu()`, a factory that
names host memory, `torch.save`, a DataLoader's batches, `t[i] = value`); each is wrapped here,
judged in a context with an open scope and left alone elsewhere. The last scope to close
anywhere puts every original back.
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from typing import Any, cast

import torch
from torch.utils._device import DeviceContext, _device_constructors

from hostsync.detector import kernels, ops
from hostsync.detector.host import FROM_FILES, HostMemory
from hostsync.detector.kernels import WRAPPED_DTYPES, Scalar
from hostsync.detector.observer import Observer
from hostsync.detector.sites import DEVICE_COPY

_CUDA_SYNC_WARNING = "called a synchronizing CUDA operation"


@functools.cache
def _reading_files(from_file: Callable[..., Any]) -> Callable[..., Any]:
    """`UntypedStorage.from_file`: its storage holds the file in host memory, on any box."""

    @functools.wraps(from_file)
    def from_a_file(*args: Any, **kwargs: Any) -> torch.UntypedStorage:
        storage: torch.UntypedStorage = from_file(*args, **kwargs)
        key, start = id(storage), storage.data_ptr()
        FROM_FILES[key] = (start, start + storage.nbytes())
        weakref.finalize(storage, FROM_FILES.pop, key, None)
        return storage

    return from_a_file


@functools.cache
def _collating(next_batch: Callable[..., object]) -> Callable[..., object]:
    """A DataLoader's batches are collated in host memory (pinned, with `pin_memory`), on any
    box: what the training step copies to the device."""

    @functools.wraps(next_batch)
    def collated(self: object) -> object:
        observer = Observer.current()
        if observer is None or observer.accounting is None:
            batch = next_batch(self)
        else:
            with observer.accounting.hosting():
                batch = next_batch(self)
        if observer is not None:
            HostMemory.made(batch)
        return batch

    return collated


def _names_host_memory(
    destination: torch.device | None, call: ops.OpCall, host: HostMemory
) -> bool:
    """A result in pinned memory, or on a cpu device the statement names."""
    if call.kwargs.get("pin_memory"):
        return True
    return destination is not None and destination.type == "cpu" and host.named()


def _made_on_host(
    name: str, call: ops.OpCall, destination: torch.device | None, host: HostMemory
) -> bool:
    """A torch factory given no device and no tensor to follow, while the default device is the
    CPU: its result is host memory on a GPU box too (`torch.tensor(0.0)`, `torch.zeros(3)`).
    `t.new_zeros(3)` and its kin make it where `t` is."""
    if destination is not None or name.endswith("_like"):
        return False
    if name.startswith("torch.Tensor."):
        return name.startswith("torch.Tensor.new_") and host.holds(call.args[0])
    if any(isinstance(value, torch.Tensor) for value in (*call.args, *call.kwargs.values())):
        return False
    return _default_device_type() == "cpu"


def _default_device_type() -> str:
    """The type of `torch.get_default_device()`, found as it finds it, but without the tensor
    it makes inside `with torch.device(...)` to learn an index: a factory this wrapper would
    judge again, asking the same question without end."""
    for mode in reversed(torch.overrides._get_current_function_mode_stack()):
        if isinstance(mode, DeviceContext):
            return str(torch.device(mode.device).type)
    context = getattr(torch._GLOBAL_DEVICE_CONTEXT, "device_context", None)
    return "cpu" if context is None else str(torch.device(context.device).type)


@functools.cache
def _host_made(make: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`torch.from_numpy`, `torch.frombuffer`: a tensor over host memory, on any box."""

    @functools.wraps(make)
    def made_on_host(*args: Any, **kwargs: Any) -> torch.Tensor:
        tensor = make(*args, **kwargs)
        if Observer.current() is not None:
            HostMemory.made(tensor)
        return tensor

    return made_on_host


# Tensor methods whose result lies where the tensor does: host memory stays host memory.
_KEEPING_PLACE = (
    "bool", "byte", "char", "short", "int", "long", "half", "bfloat16", "float", "double",
    "clone", "contiguous", "type",
)  # fmt: skip


@functools.cache
def _keeping_place(method: Callable[..., object]) -> Callable[..., object]:
    """`t.long()`, `t.clone()`: made where `t` is (a dataset's targets, made in its setup)."""

    @functools.wraps(method)
    def kept(self: torch.Tensor, *args: object, **kwargs: object) -> object:
        result = method(self, *args, **kwargs)
        observer = Observer.current()
        if result is not self and observer is not None and observer.host.holds(self):
            HostMemory.made(result)
        return result

    return kept


@functools.cache
def _legacy(new: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`torch.Tensor(data)`, the legacy constructor: built in host memory while the default
    device is the CPU, as `torch.tensor(data)` is (a tensor given is aliased where it lies).
    Its signature is a wildcard's, which dynamo's polyfill of `Tensor.__new__` accepts."""

    def constructed(*args: object, **kwargs: object) -> torch.Tensor:
        tensor = new(*args, **kwargs)
        observer = Observer.current()
        if (
            observer is not None
            and not any(isinstance(value, torch.Tensor) for value in (*args, *kwargs.values()))
            and _default_device_type() == "cpu"
        ):
            HostMemory.made(tensor)
        return tensor

    return constructed


@functools.cache
def _loading(load: Callable[..., object]) -> Callable[..., object]:
    """`torch.load`: onto the host where the call spells it (`map_location="cpu"`, or a
    function of the storage), else onto the device, where each storage is one blocking copy
    (what a GPU box does with a `map_location` device, or with storages saved from one)."""

    @functools.wraps(load)
    def loading(*args: Any, **kwargs: Any) -> object:
        observer = Observer.current()
        if observer is None or observer.quiet:
            return load(*args, **kwargs)
        with observer.quieted():
            loaded = load(*args, **kwargs)
        if _loads_to_host(ops.OpCall(args, kwargs).argument(1, "map_location"), observer.host):
            HostMemory.made(list(_tensors_loaded(loaded)))
        else:
            count = _device_storages(loaded, observer.host, set())
            if count:
                observer.record(DEVICE_COPY, "torch.load", count)
        return loaded

    return loading


def _loads_to_host(where: object, host: HostMemory) -> bool:
    if callable(where):
        return True
    if isinstance(where, dict):
        return bool(where) and all(_loads_to_host(value, host) for value in where.values())
    if isinstance(where, str | torch.device):
        return torch.device(where).type == "cpu" and host.named()
    return False


def _tensors_loaded(value: object) -> Iterator[torch.Tensor]:
    """The tensors of a loaded object: of its dicts, lists and tuples, as `torch.save` keeps."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _tensors_loaded(item)
    elif isinstance(value, list | tuple):
        for item in value:
            yield from _tensors_loaded(item)


def _host_factories() -> Iterator[str]:
    """Every public torch function and Tensor method whose aten operators take a device or
    pin_memory: the calls that can name host memory (factories, copies). Read from the
    operators' schemas: building their Python packets took tenths of a second in every rank."""
    registered = set(torch._C._dispatch_get_all_op_names())
    for schema in torch._C._jit_get_all_schemas():
        name = schema.name.removeprefix("aten::")
        qualified = f"{schema.name}.{schema.overload_name}".rstrip(".")
        if name == schema.name or name.startswith("_") or qualified not in registered:
            continue
        if {"device", "pin_memory"} & {a.name for a in schema.arguments if a.kwarg_only}:
            for owner in ("torch", "torch.Tensor"):
                if callable(getattr(ops.resolve(owner), name, None)):
                    yield f"{owner}.{name}"


@functools.cache
def _observed_functions() -> dict[str, tuple[ops.FunctionSync, ...]]:
    """The Python-level calls the scopes observe, each with the rules by which it can sync."""
    observed: dict[str, tuple[ops.FunctionSync, ...]] = dict.fromkeys(_host_factories(), ())
    for rule in ops.FUNCTION_SYNCS:
        observed[rule.name] = (*observed.get(rule.name, ()), rule)
    return observed


@functools.cache
def _observing(
    name: str, rules: tuple[ops.FunctionSync, ...], original: Callable[..., object]
) -> Callable[..., object]:
    """`original`, in any context with an open scope: judged by `rules`, and its result kept as
    host memory when the call names it (a factory or a copy to "cpu", pinned memory)."""
    op = name.removeprefix("torch.")
    to_host = name.endswith(".cpu")
    makes = not name.startswith("torch.Tensor.") or name.startswith("torch.Tensor.new_")
    replaces_kernels = any(rule.replaces_kernels for rule in rules)

    @functools.wraps(original)
    def observed(*args: object, **kwargs: object) -> object:
        observer = Observer.current()
        if observer is None or observer.quiet:
            return original(*args, **kwargs)
        entered = time.perf_counter_ns()
        call = ops.OpCall(args, kwargs)
        host, accounting = observer.host, observer.accounting
        judged = rules if observer.scopes else ()
        counts = [(rule.kind, n) for rule in judged if (n := rule.syncs(call, host))]
        where = _CPU if to_host else ops.destination(call)
        named = _names_host_memory(where, call, host)
        by_default = not named and _made_on_host(name, call, where, host)
        with ExitStack() as running:
            if replaces_kernels:
                running.enter_context(observer.quieted())
            if accounting is not None and makes and (named or by_default):
                # A factory of host memory launches nothing on a GPU: no end of a window.
                running.enter_context(accounting.hosting())
            ran = time.perf_counter_ns()
            result = original(*args, **kwargs)
            ran = time.perf_counter_ns() - ran
        source = args[0] if args else None
        if result is source and any(kind == _TO_HOST for kind, _ in counts):
            # The stand-in's `.cpu()` of host memory is the object itself; on a GPU box it is
            # a new host copy, which an alias stands for, so that the source stays the
            # device's.
            result = _alias(result)
        made = result is not source
        if made and named:
            host.add(result)
        elif made and (by_default or (where is None and not makes and host.holds(source))):
            host.made(result)
        elif where is not None and not named and isinstance(result, torch.Tensor):
            host.moved(result)
        if accounting is not None:
            if made and (named or by_default):
                accounting.retract(cast(torch.Tensor, result))
            accounting.own(time.perf_counter_ns() - entered - ran)
        for kind, count in counts:
            copy = result if kind == _TO_HOST and isinstance(result, torch.Tensor) else None
            observer.record(kind, op, count, read=source, host_copy=copy)
        return result

    return observed


_CPU = torch.device("cpu")
_TO_HOST = "cpu"


def _alias(value: object) -> object:
    """A new object over the same memory: a view of a tensor, a tuple of aliases (a
    `PackedSequence`)."""
    if isinstance(value, torch.Tensor):
        return value.view_as(value) if value.layout == torch.strided else value
    if isinstance(value, tuple) and hasattr(value, "_make"):
        return value._make(_alias(item) if item is not None else None for item in value)
    return value


def _device_storages(value: object, host: HostMemory, seen: set[int]) -> int:
    """How many distinct storages of device tensors `torch.save(value)` would copy to the host
    (pickling a tensor saves its storage: torch/storage.py `__reduce__`)."""
    if isinstance(value, torch.TypedStorage):
        value = value._untyped_storage
    if isinstance(value, torch.Tensor | torch.UntypedStorage):
        storage = value.untyped_storage() if isinstance(value, torch.Tensor) else value
        if host.holds(value) or storage.data_ptr() in seen:
            return 0
        seen.add(storage.data_ptr())
        return 1
    if isinstance(value, torch.nn.Module):
        value = value.state_dict()
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, list | tuple | set):
        return sum(_device_storages(item, host, seen) for item in value)
    return 0


def prepare() -> list[tuple[object, str, object]]:
    """Build what every scope of this process installs, without installing it: the kernels, and
    each observed function's replacement (owner, name, replacement). A process that forks ranks
    calls it first, so that each fork finds them built.

    `with torch.device(...)` knows torch's factories by a set it caches at first use: built
    here, before any factory is replaced, it holds torch's own (else a model built on the meta
    device gets host buffers, which its loader never fills)."""
    _device_constructors()
    kernels.registered()
    replacements: list[tuple[object, str, object]] = []
    for qualified, rules in _observed_functions().items():
        owner_name, _, name = qualified.rpartition(".")
        owner = ops.resolve(owner_name)
        replacements.append((owner, name, _observing(qualified, rules, getattr(owner, name))))
    return replacements


class _ProcessWide:
    """What only exists once per process, installed while any scope is open anywhere.

    - the Python-level calls of `ops.FUNCTION_SYNCS`, judged in contexts with a scope;
    - `torch.save` and `torch.serialization.save`: each device storage is copied to the host;
    - `torch.UntypedStorage.from_file`: its memory is host memory (`FROM_FILES`);
    - the torch.compile guard (`Observer.meet_compiled`);
    - on CUDA, torch's sync-debug mode, whose warnings are counted for the context they are
      raised in (warnings of autograd's device threads are replayed in the thread that called
      backward), and shown as before elsewhere.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._cuda_users = 0
        self._restore = ExitStack()
        self._cuda_restore = ExitStack()
        self._guarded = False

    @contextmanager
    def installed(self, cuda: bool) -> Iterator[None]:
        with self._lock:
            if self._users == 0:
                self._restore = self._install()
            self._users += 1
            if cuda:
                if self._cuda_users == 0:
                    self._cuda_restore = _counting_cuda_syncs()
                self._cuda_users += 1
        try:
            yield
        finally:
            with self._lock:
                if cuda:
                    self._cuda_users -= 1
                    if self._cuda_users == 0:
                        self._cuda_restore.close()
                self._users -= 1
                if self._users == 0:
                    self._restore.close()

    def _install(self) -> ExitStack:
        restore = ExitStack()
        replacements = prepare()
        save, load = torch.serialization.save, torch.serialization.load
        from_file = torch.UntypedStorage.from_file
        loading = torch.utils.data.dataloader._BaseDataLoaderIter
        replacements += [
            (loading, "__next__", _collating(loading.__next__)),
            (torch.Tensor, "__setitem__", _writing(torch.Tensor.__setitem__)),
            (torch, "save", _saving(save)),
            (torch.serialization, "save", _saving(save)),
            (torch, "load", _loading(load)),
            (torch.serialization, "load", _loading(load)),
            (torch.Tensor, "__new__", staticmethod(_legacy(torch.Tensor.__new__))),
            *(
                (torch.Tensor, name, _keeping_place(getattr(torch.Tensor, name)))
                for name in _KEEPING_PLACE
            ),
            (torch, "from_numpy", _host_made(torch.from_numpy)),
            (torch, "frombuffer", _host_made(torch.frombuffer)),
            (torch.UntypedStorage, "from_file", staticmethod(_reading_files(from_file))),
        ]
        restore.enter_context(_replaced(replacements))
        self._guarded = "torch._dynamo.eval_frame" in sys.modules
        if self._guarded:
            restore.enter_context(_guarding_compiled_calls())
        else:  # no compiled function exists yet; one made while scopes are open gets the guard
            restore.enter_context(_replaced([(torch, "compile", self._guarding(torch.compile))]))
        return restore

    def _guarding(self, compile_: Callable[..., object]) -> Callable[..., object]:
        @functools.wraps(compile_)
        def compile_then_guard(*args: object, **kwargs: object) -> object:
            compiled = compile_(*args, **kwargs)
            with self._lock:
                if self._users and not self._guarded:
                    self._restore.enter_context(_guarding_compiled_calls())
                    self._guarded = True
            return compiled

        return compile_then_guard


_process_wide = _ProcessWide()
installed = _process_wide.installed


_INHERITED = object()


@contextmanager
def _replaced(replacements: Sequence[tuple[object, str, object]]) -> Iterator[None]:
    """Each `owner.name` is its `value` until exit; then what it was, inherited again if it was."""
    saved = [(owner, name, owner.__dict__.get(name, _INHERITED)) for owner, name, _ in replacements]
    for owner, name, value in replacements:
        setattr(owner, name, value)
    try:
        yield
    finally:
        for owner, name, value in reversed(saved):
            if value is _INHERITED:
                delattr(owner, name)
            else:
                setattr(owner, name, value)


@functools.cache
def _writing(setitem: Callable[..., object]) -> Callable[..., object]:
    """`t[index] = value`, as torch/csrc/autograd/python_variable_indexing.cpp THPVariable_setitem
    does it on CUDA. A Python number becomes a CPU tensor of t's dtype, also for a CUDA `t`: made
    here the same way, as host memory, so that the write is judged with it. A device tensor
    written into host memory through basic indexing (no tensor in the index) is one blocking
    copy (`copy_to`: copy_, or fill_ for a 0-d CPU value); tensor indices reach index_put_."""

    @functools.wraps(setitem)
    def setting(self: torch.Tensor, index: object, value: object) -> None:
        observer = Observer.current()
        if observer is None or observer.quiet or not observer.scopes:
            setitem(self, index, value)
            return
        if type(value) in WRAPPED_DTYPES and not self.is_quantized:
            value = torch.scalar_tensor(cast(Scalar, value), dtype=self.dtype)
            observer.host.add(value, propagate=False)
        copies = (
            isinstance(value, torch.Tensor)
            and observer.host.holds(self)
            and not observer.host.holds(value)
            and not any(isinstance(part, torch.Tensor | list) for part in _index_parts(index))
        )
        with observer.quieted() if copies else contextlib.nullcontext():
            setitem(self, index, value)
        if copies:
            observer.record("host_copy", "Tensor.__setitem__", read=value)

    return setting


def _index_parts(index: object) -> tuple[object, ...]:
    return index if isinstance(index, tuple) else (index,)


@functools.cache
def _saving(save: Callable[..., object]) -> Callable[..., object]:
    @functools.wraps(save)
    def saving(obj: object, *args: object, **kwargs: object) -> object:
        observer = Observer.current()
        if observer is not None and not observer.quiet and observer.scopes:
            count = _device_storages(obj, observer.host, set())
            if count:
                observer.record("host_copy", "torch.save", count)
        return save(obj, *args, **kwargs)

    return saving


@contextmanager
def _guarding_compiled_calls() -> Iterator[None]:
    """Every compiled-code entry asks dynamo for its callback (`_callback_from_stance`, torch >=
    2.6); inside a scope, where dynamo would silently run the eager code, the scopes refuse or
    record it."""
    from torch._dynamo import eval_frame
    from torch._dynamo.types import DynamoCallback

    from_stance = eval_frame._callback_from_stance

    def refusing_in_scope(callback: DynamoCallback) -> DynamoCallback:
        resolved = from_stance(callback)
        observer = Observer.current()
        if resolved is not None and observer is not None:
            observer.meet_compiled()
        return resolved

    with _replaced([(eval_frame, "_callback_from_stance", refusing_in_scope)]):
        yield


def _counting_cuda_syncs() -> ExitStack:
    """torch's own sync-debug mode as a second opinion, counted per context."""
    restore = ExitStack()
    previous_mode = torch.cuda.get_sync_debug_mode()
    if previous_mode == 0:
        torch.cuda.set_sync_debug_mode("warn")
        restore.callback(torch.cuda.set_sync_debug_mode, previous_mode)
    warnings.filterwarnings("always", message=_CUDA_SYNC_WARNING)
    our_filter = warnings.filters[0]
    restore.callback(_remove_filter, our_filter)
    show_other = warnings.showwarning

    def count_or_show(message: Warning | str, *args: Any, **kwargs: Any) -> None:
        if str(message).startswith(_CUDA_SYNC_WARNING):
            observer = Observer.current()
            if observer is not None:
                observer.count_cuda_sync()
                return
            if previous_mode == 0:
                return
        show_other(message, *args, **kwargs)

    warnings.showwarning = count_or_show
    restore.callback(setattr, warnings, "showwarning", show_other)
    return restore


def _remove_filter(entry: tuple[object, ...]) -> None:
    with contextlib.suppress(ValueError):
        cast("list[object]", warnings.filters).remove(entry)  # a list at run time
