"""Hidden host syncs, counted where they are written: a scope, an allow-list, an assertion.

A device-to-host read (`if t > 0`, `max(t, 1)`, `.item()`, `.tolist()`, a boolean mask) makes
the CPU wait for the GPU. The same Python line reaches the same aten operator on CPU tensors, so
a `TorchDispatchMode` counts in CI, without a GPU, the syncs a GPU would stall on, each with the
source line that caused it:

    with SyncScope(allow=[AllowRule("transformers/masking_utils.py", reason="...")]) as scope:
        loss = compute_loss(model, inputs)
    scope.assert_no_unexpected_syncs()

Event kinds: "scalar_read" (aten._local_scalar_dense, which `bool(t)`, `.item()`, `int(t)`
become; also aten.equal and aten.allclose, which read their answer inside the kernel),
"nonzero", "masked_select", "unique", "repeat_interleave" (without `output_size`),
"bool_index" (indexing with a bool/uint8 mask), and "tolist", "cpu", "numpy" (Tensor methods
that never reach the dispatcher on CPU, so they are wrapped while a scope is open).

The model is "every tensor would be on the GPU": on CPU, `cpu_tensor.item()` counts too.
A chained read of a fresh host copy on the same line (`t.cpu().numpy()`) counts once. Not
counted: reads made inside C++ kernels (a dispatch mode cannot see them), `.to("cpu")` and
`.copy_()` into host memory, and `t[mask] = 0`: index_put_ turns it into masked_fill_, which does
not sync on CUDA either (on CPU a one-element tensor value is taken for such a scalar, although
on CUDA a device one would sync). On CUDA, torch's own
sync-debug mode runs alongside as a second opinion (`cuda_syncs`); it flags device-to-host
copies and stream synchronizations, as Python warnings: in Python threads only (not in
autograd's device threads), and not inside code that silences or records warnings itself.
A scope observes the thread that opened it, and the autograd threads torch carries it to.
"""

from __future__ import annotations

import functools
import linecache
import os
import sys
import threading
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, NamedTuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

_TORCH_DIR = str(Path(torch.__file__).parent) + os.sep
_CUDA_SYNC_WARNING = "called a synchronizing CUDA operation"
_MASK_DTYPES = (torch.bool, torch.uint8)


class Site(NamedTuple):
    """A source line that caused host syncs; `file` is relative to its package root."""

    file: str
    line: int
    function: str
    code: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line} in {self.function}"


class SyncEvent(NamedTuple):
    """One device-to-host read; `allowed` is the reason it is accepted, None when unexpected."""

    kind: str
    op: str
    site: Site
    allowed: str | None


@dataclass(frozen=True)
class AllowRule:
    """A known, accepted sync site: a file (a path suffix), optionally one function or line."""

    file: str
    reason: str
    function: str | None = None
    line: int | None = None

    def __post_init__(self) -> None:
        _require_reason(self.reason)

    def matches(self, site: Site) -> bool:
        return (
            (site.file == self.file or site.file.endswith("/" + self.file))
            and self.function in (None, site.function)
            and self.line in (None, site.line)
        )


class SyncScope:
    """Records every host sync made inside it; nested scopes each see their own and the inner."""

    def __init__(self, allow: Iterable[AllowRule] = ()) -> None:
        self.rules = tuple(allow)
        self.events: list[SyncEvent] = []
        self.cuda_syncs: int | None = None
        self._allowing: list[str] = []

    def __enter__(self) -> SyncScope:
        _Observer.of_this_thread().open(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        _Observer.of_this_thread().close(self)

    @contextmanager
    def allow(self, reason: str) -> Iterator[None]:
        """Accept every sync made in this block, for `reason` (the innermost block's wins)."""
        _require_reason(reason)
        self._allowing.append(reason)
        try:
            yield
        finally:
            self._allowing.pop()

    def _add(self, kind: str, op: str, site: Site) -> None:
        """Judge one event against this scope's allow blocks, then its rules, and keep it."""
        reason = self._allowing[-1] if self._allowing else None
        if reason is None:
            reason = next((rule.reason for rule in self.rules if rule.matches(site)), None)
        self.events.append(SyncEvent(kind, op, site, reason))

    @property
    def unexpected(self) -> list[SyncEvent]:
        return [event for event in self.events if event.allowed is None]

    def counts(self) -> dict[Site, int]:
        """Unexpected events per site, most frequent first."""
        return dict(Counter(event.site for event in self.unexpected).most_common())

    def allowed_counts(self) -> dict[tuple[Site, str], int]:
        """Allowed events per (site, reason), most frequent first."""
        allowed = (event for event in self.events if event.allowed is not None)
        return dict(Counter((event.site, event.allowed) for event in allowed).most_common())

    def sync_sites(self) -> list[dict[str, Any]]:
        """The unexpected sites as JSON-ready dicts: file, line, function, code, count, kinds."""
        return [
            {**site._asdict(), "count": count, "kinds": self._kinds_at(site)}
            for site, count in self.counts().items()
        ]

    def allowed_sync_sites(self) -> list[dict[str, Any]]:
        """The allowed sites as JSON-ready dicts, each with its reason."""
        return [
            {**site._asdict(), "count": count, "kinds": self._kinds_at(site), "reason": reason}
            for (site, reason), count in self.allowed_counts().items()
        ]

    def report(self) -> str:
        """The unexpected sites with counts, kinds and code lines, then the allowed ones."""
        unexpected = self.counts()
        lines = [
            f"{sum(unexpected.values())} unexpected host sync(s) at {len(unexpected)} site(s):"
        ]
        for site, count in unexpected.items():
            lines.append(f"  {count}x {site} [{', '.join(self._kinds_at(site))}]")
            lines.append(f"        {site.code}")
        allowed = self.allowed_counts()
        if allowed:
            lines.append(f"allowed: {sum(allowed.values())} at {len(allowed)} site(s):")
            lines.extend(f"  {n}x {site}: {reason}" for (site, reason), n in allowed.items())
        return "\n".join(lines)

    def assert_no_unexpected_syncs(self) -> None:
        if self.unexpected:
            raise AssertionError(
                self.report() + "\nRemove each sync, or accept its site with "
                "AllowRule(file, reason=..., function=..., line=...) or scope.allow(reason)."
            )

    def _kinds_at(self, site: Site) -> list[str]:
        return sorted({event.kind for event in self.events if event.site == site})


def package_path(filename: str, search_path: Sequence[str] | None = None) -> str:
    """`filename` relative to the longest `sys.path` entry holding it, else its basename."""
    path = Path(filename).absolute()
    roots = [
        Path(entry or os.curdir).absolute()
        for entry in (sys.path if search_path is None else search_path)
    ]
    holding = [root for root in roots if path.is_relative_to(root)]
    if not holding:
        return path.name
    return path.relative_to(max(holding, key=lambda root: len(root.parts))).as_posix()


def _require_reason(reason: str) -> None:
    if not reason.strip():
        raise ValueError("an allowed sync needs a reason: say why this sync is accepted")


_NO_PYTHON_CALLER = Site("<no Python frame>", 0, "", "")


def _site(frame: FrameType | None) -> Site:
    if frame is None:
        return _NO_PYTHON_CALLER
    code = frame.f_code
    return Site(package_path(code.co_filename), frame.f_lineno, code.co_name, _source(frame))


_MAX_SOURCE_LINES = 8


def _source(frame: FrameType) -> str:
    """The statement that read the tensor, all of an `if (...)` spread over lines, not its body.

    Python 3.11 locates the instruction (the span may cover a whole `if` with its body); the
    lines are taken from its start until the brackets opened on them are closed again.
    """
    code = frame.f_code
    start, end, *_ = next(islice(code.co_positions(), frame.f_lasti // 2, None), (None, None))
    start = start or frame.f_lineno
    lines, depth = [], 0
    for number in range(start, max(end or start, start) + 1)[:_MAX_SOURCE_LINES]:
        line = linecache.getline(code.co_filename, number, frame.f_globals).strip()
        lines.append(line)
        depth += sum(map(line.count, "([{")) - sum(map(line.count, ")]}"))
        if depth <= 0:
            break
    return " ".join(line for line in lines if line)


def _caller_frame() -> FrameType | None:
    """The innermost frame outside torch and this module (else the innermost outside this one)."""
    here = _caller_frame.__code__.co_filename
    frame, fallback = sys._getframe(1), None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename != here:
            if not filename.startswith(_TORCH_DIR):
                return frame
            fallback = fallback or frame
        frame = frame.f_back
    return fallback


class _Observer:
    """What the open scopes of one thread share: the instrumentation and the events it sees."""

    _local = threading.local()

    def __init__(self) -> None:
        self.scopes: list[SyncScope] = []
        self.counts_cuda_syncs = False
        self._instrumentation = ExitStack()
        # Naming a file walks sys.path: once per line and scope, or a read in a loop costs 50 us.
        self._sites: dict[tuple[CodeType, int] | None, Site] = {}
        # The host copy `.cpu()` made last, and where: reading it once on that line is free.
        self._host_copy: tuple[tuple[int, int], weakref.ref[torch.Tensor]] | None = None

    @classmethod
    def of_this_thread(cls) -> _Observer:
        if not hasattr(cls._local, "observer"):
            cls._local.observer = cls()
        return cls._local.observer

    def open(self, scope: SyncScope) -> None:
        if not self.scopes:
            with ExitStack() as instrumentation:
                instrumentation.enter_context(_host_read_methods)
                instrumentation.enter_context(_SyncRecorder(self))
                self.counts_cuda_syncs = torch.cuda.is_available()
                if self.counts_cuda_syncs:
                    instrumentation.enter_context(_counting_cuda_syncs(self))
                self._instrumentation = instrumentation.pop_all()
        scope.cuda_syncs = 0 if self.counts_cuda_syncs else None
        self.scopes.append(scope)

    def close(self, scope: SyncScope) -> None:
        self.scopes.remove(scope)
        if not self.scopes:
            self._host_copy = None
            self._sites.clear()
            self._instrumentation.close()

    def record(
        self,
        kind: str,
        op: str,
        read: object = None,
        host_copy: torch.Tensor | None = None,
    ) -> None:
        """One host read of `read`; `host_copy` is the host tensor it produced, if any."""
        frame = _caller_frame()
        where = (id(frame), frame.f_lineno if frame else 0)
        if host_copy is not None:
            self._host_copy = (where, weakref.ref(host_copy))
        elif self._host_copy and self._host_copy[0] == where and self._host_copy[1]() is read:
            self._host_copy = None
            return
        key = (frame.f_code, frame.f_lineno) if frame else None
        site = self._sites.get(key)
        if site is None:
            site = self._sites[key] = _site(frame)
        for scope in self.scopes:
            scope._add(kind, op, site)

    def count_cuda_sync(self) -> None:
        for scope in self.scopes:
            scope.cuda_syncs = (scope.cuda_syncs or 0) + 1


def _argument(args: tuple, kwargs: dict, position: int, name: str, default: Any) -> Any:
    return args[position] if len(args) > position else kwargs.get(name, default)


def _indexes_with_mask(args: tuple, kwargs: dict) -> bool:
    return any(index is not None and index.dtype in _MASK_DTYPES for index in args[1])


def _puts_through_mask(args: tuple, kwargs: dict) -> bool:
    """A masked index_put_ syncs, unless it is the masked_fill_ case (canDispatchToMaskedFill)."""
    if not _indexes_with_mask(args, kwargs):
        return False
    target, indices = args[0], args[1]
    values = _argument(args, kwargs, 2, "values", None)
    accumulate = _argument(args, kwargs, 3, "accumulate", False)
    masks = [index for index in indices if index is not None]
    fills_masked = (
        not accumulate
        and values.numel() == 1
        and values.device.type == "cpu"
        and len(masks) == 1
        and masks[0].dtype in _MASK_DTYPES
        and masks[0].device == target.device
    )
    return not fills_masked


def _counts_repeats(args: tuple, kwargs: dict) -> bool:
    return kwargs.get("output_size") is None


def _always(args: tuple, kwargs: dict) -> bool:
    return True


_Condition = Callable[[tuple, dict], bool]

# Which aten overloads read the device, as what kind, and under which condition on the arguments.
_SYNCING_OPS: list[tuple[str, tuple[str, ...], tuple[str, ...], _Condition]] = [
    ("scalar_read", ("_local_scalar_dense", "equal", "allclose"), (), _always),
    ("nonzero", ("nonzero",), (), _always),
    ("masked_select", ("masked_select",), (), _always),
    (
        "unique",
        ("_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive"),
        (),
        _always,
    ),
    ("repeat_interleave", ("repeat_interleave",), ("Tensor", "Tensor_out"), _counts_repeats),
    ("bool_index", ("index",), ("Tensor", "Tensor_out", "Tensor_hacked_twin"), _indexes_with_mask),
    ("bool_index", ("index_put", "index_put_", "_index_put_impl_"), (), _puts_through_mask),
]

_SYNC_OF_OP: dict[torch._ops.OpOverload, tuple[str, _Condition]] = {
    getattr(packet, overload): (kind, condition)
    for kind, packet_names, overloads, condition in _SYNCING_OPS
    for packet in (getattr(torch.ops.aten, name) for name in packet_names)
    for overload in overloads or packet.overloads()
}


class _SyncRecorder(TorchDispatchMode):
    """Sees every aten call below autograd and reports those that read the device."""

    def __init__(self, observer: _Observer) -> None:
        super().__init__()
        self._observer = observer

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Sequence[type],
        args: tuple = (),
        kwargs: dict | None = None,
    ) -> Any:
        kwargs = kwargs or {}
        kind, condition = _SYNC_OF_OP.get(func, (None, None))
        syncs = condition is not None and condition(args, kwargs)
        result = func(*args, **kwargs)
        if syncs:
            self._observer.record(kind, str(func), read=args[0] if args else None)
        return result


class _HostReadMethods:
    """Wraps Tensor.tolist/.cpu/.numpy while any scope is open, in any thread; then restores."""

    _NAMES = ("tolist", "cpu", "numpy")
    _INHERITED = object()

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._users = 0
        self._saved: dict[str, object] = {}

    def __enter__(self) -> None:
        with self._lock:
            if self._users == 0:
                for name in self._NAMES:
                    self._saved[name] = torch.Tensor.__dict__.get(name, self._INHERITED)
                    setattr(torch.Tensor, name, _reporting(name, getattr(torch.Tensor, name)))
            self._users += 1

    def __exit__(self, *exc_info: object) -> None:
        with self._lock:
            self._users -= 1
            if self._users == 0:
                for name, saved in self._saved.items():
                    if saved is self._INHERITED:
                        delattr(torch.Tensor, name)
                    else:
                        setattr(torch.Tensor, name, saved)


_host_read_methods = _HostReadMethods()


def _reporting(kind: str, method: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(method)
    def host_read(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        result = method(tensor, *args, **kwargs)
        observer = _Observer.of_this_thread()
        if observer.scopes:
            host_copy = result if kind == "cpu" else None
            observer.record(kind, f"Tensor.{kind}", read=tensor, host_copy=host_copy)
        return result

    return host_read


@contextmanager
def _counting_cuda_syncs(observer: _Observer) -> Iterator[None]:
    """torch's own sync-debug mode as a second opinion: count the syncs it warns about."""
    previous_mode = torch.cuda.get_sync_debug_mode()
    with warnings.catch_warnings():
        warnings.filterwarnings("always", message=_CUDA_SYNC_WARNING)
        show_other = warnings.showwarning

        def count_or_show(message: Warning | str, *args: Any, **kwargs: Any) -> None:
            if str(message).startswith(_CUDA_SYNC_WARNING):
                observer.count_cuda_sync()
            else:
                show_other(message, *args, **kwargs)

        warnings.showwarning = count_or_show
        torch.cuda.set_sync_debug_mode("warn")
        try:
            yield
        finally:
            torch.cuda.set_sync_debug_mode(previous_mode)
