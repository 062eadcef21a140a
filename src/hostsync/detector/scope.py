"""Hidden host syncs, counted where they are written: a scope, an allow-list, an assertion.

A device-to-host read (`if t > 0`, `max(t, 1)`, `.item()`, `.tolist()`, a boolean mask) makes
the CPU wait for the GPU. The same Python line reaches the same torch calls on CPU tensors, so
CI counts, without a GPU, the syncs a GPU would stall on, each with the source line that caused
it, one event per wait:

    with SyncScope(allow=[AllowRule("transformers/masking_utils.py", reason="...")]) as scope:
        loss = compute_loss(model, inputs)
    scope.assert_no_unexpected_syncs()

What a call costs on CUDA is decided by `hostsync.detector.ops`, the table of operators and torch
functions whose CUDA path reads the device, each with its source in PyTorch. Kernels registered
at a dispatch key no torch feature uses judge the aten calls of the table
(`_local_scalar_dense`, which `bool(t)` and `.item()` become, nonzero, unique, masks, bincount,
fills with a tensor value, linalg error checks, ...); every other operator falls through that
key in C++, and so do higher-order operators, which torch dispatches in Python (vmap's
`custom_function_call`), so code that cannot sync runs at its own speed. The key sits above
autograd: it sees what Python code calls, also inside torch's own Python (printing a tensor) and
the bodies of higher-order operators, and not what an operator's kernel calls below autograd
(CPU-only validations). Wrappers, in place while any scope is open, judge the Python-level
calls that never reach a CPU kernel (`.tolist()`, `.cpu()`, `.to("cpu")`, `.numpy()`,
`torch.tensor([t0, t1])`) and leave out CPU-only validations (`one_hot` reads its input on CPU
only); `torch.save` and pickling count one copy per device storage. Event kinds are the table's.

The model is "every tensor would be on the GPU", except host memory the code names as such
(`device="cpu"` spelled in the statement, `pin_memory=True`, a Python number written with
`t[i] = 0.0`), what a factory makes when it names no device (`torch.tensor(0.0)`: the CPU on a
GPU box too, while the default device is the CPU), tensors over a storage made from a file, and
what is computed from named host memory:
reads of those are free, copies into them (`host[i] = t0`, `host.copy_(t)`) count. Once the
code names host memory, a dispatch mode follows what is computed from it (every aten call goes
through Python from then on, in the thread that opened the scope). A chained read of a fresh
host copy on the same line (`t.cpu().numpy()`) counts once.

A scope observes its context: the thread that opened it, autograd's device threads (torch carries
the thread-local state there) and functions wrapped with `scope.carry`. torch.compile'd functions
raise `SyncScopeError` inside a scope: their graphs run fused kernels the scope cannot judge, and
under the mode that follows host memory dynamo would run eager code instead. A survey must not
change what it observes: a scope made with `refuse_compiled=False` records such a call at its
call site instead (kind `COMPILED`: compiled, not judged) and lets it run. On CUDA, torch's own
sync-debug mode runs alongside as a second opinion (`cuda_syncs`), counted per context; it only
sees warnings outside code that silences or records warnings itself. A scope opened with
`account=True` also tells stalls from free reads and counts the device work
(`hostsync.detector.accounting`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import linecache
import os
import re
import sys
import threading
import time
import warnings
import weakref
from collections import Counter
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from itertools import islice
from pathlib import Path
from types import CodeType, FrameType
from typing import Any, NamedTuple, TypeVar

import torch
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _pop_mode,
    _push_mode,
)

from hostsync.detector import ops
from hostsync.detector.accounting import Accounting, Window
from hostsync.detector.records import Cost, DeviceWork, Idle, SiteCost, top_lines
from hostsync.detector.sites import COMPILED, AllowRule, Site, SiteCount, require_reason

__all__ = [
    "COMPILED",
    "AllowRule",
    "CompiledInScope",
    "Site",
    "SiteCount",
    "SyncEvent",
    "SyncScope",
    "SyncScopeError",
    "package_path",
]

_TORCH_DIR = str(Path(torch.__file__).parent) + os.sep
_CUDA_SYNC_WARNING = "called a synchronizing CUDA operation"
_Result = TypeVar("_Result")


class SyncEvent(NamedTuple):
    """One device-to-host read; `allowed` is the reason it is accepted, None when unexpected.
    `caller` is the function that called the site's own (`file:function`): a read inside a
    shared helper is paid for by its caller. `waited_for` is the device work queued since the
    host last waited, in a scope that accounts for it (`account=True`): a stall when there was
    any, a free read when none; None in a scope that does not account."""

    kind: str
    op: str
    site: Site
    allowed: str | None
    caller: str = ""
    waited_for: DeviceWork | None = None

    @property
    def stall(self) -> bool:
        return self.waited_for is not None and self.waited_for.queued


class SyncScope:
    """Records every host sync made inside it; nested scopes each see their own and the inner.

    With `account=True` (what measuring commands ask for) each read is also judged a stall or
    free, and the device work inside the scope is counted (`hostsync.detector.accounting`): every
    aten call then goes through Python, which the gate does not pay for. `refuse_compiled=False`
    records a compiled function's call (kind `COMPILED`) instead of raising `CompiledInScope`: for
    surveys, which must not change a test's outcome."""

    def __init__(
        self, allow: Iterable[AllowRule] = (), account: bool = False, refuse_compiled: bool = True
    ) -> None:
        self.rules = tuple(allow)
        self.account = account
        self.refuse_compiled = refuse_compiled
        self.events: list[SyncEvent] = []
        self.cuda_syncs: int | None = None
        # Scalar reads of host memory (`.item()`, an op's 0-d value): no wait on a GPU, so no
        # event; a CPU profiler sees them all the same (`aten::_local_scalar_dense`), which a
        # cross-check with one must add back.
        self.host_reads = 0
        self.work: DeviceWork | None = None
        # The idle windows after this scope's stalls, and the optimizer steps it saw.
        self.windows: list[Window] = []
        self.optimizer_steps = 0
        self._work_at_open = DeviceWork()
        self._windows_at_open = (0, 0)
        self._allowing: list[str] = []
        self._observer: _Observer | None = None

    def __enter__(self) -> SyncScope:
        self._observer = _Observer.current() or _Observer()
        self._observer.open(self)
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self._observer is not None:
            self._observer.close(self)
            self._observer = None

    def carry(self, function: Callable[..., _Result]) -> Callable[..., _Result]:
        """`function`, to run in another thread and be observed by this scope's context there.

        Autograd does the same for its device threads: it copies the mode stacks they run with.
        """
        observer = self._observer
        if observer is None:
            raise SyncScopeError("carry() needs an open scope: call it inside `with scope:`")

        @functools.wraps(function)
        def carried(*args: object, **kwargs: object) -> _Result:
            with observer.carried():
                return function(*args, **kwargs)

        return carried

    @contextmanager
    def allow(self, reason: str) -> Iterator[None]:
        """Accept every sync made in this block, for `reason` (the innermost block's wins)."""
        require_reason(reason)
        self._allowing.append(reason)
        try:
            yield
        finally:
            self._allowing.pop()

    def _add(
        self, kind: str, op: str, site: Site, caller: str, waited_for: DeviceWork | None
    ) -> None:
        """Judge one event against this scope's allow blocks, then its rules, and keep it."""
        reason = self._allowing[-1] if self._allowing else None
        if reason is None:
            matching = (rule.reason for rule in self.rules if rule.matches(site, caller))
            reason = next(matching, None)
        waited = waited_for if self.account else None
        self.events.append(SyncEvent(kind, op, site, reason, caller, waited))

    def step(self) -> None:
        """Mark the end of a step for the idle time per step, where the steps are no optimizer's
        (whose steps are marked by themselves)."""
        accounting = self._observer.accounting if self._observer is not None else None
        if accounting is None:
            raise SyncScopeError("step() needs an open scope opened with account=True")
        accounting.stepped()

    def reads_host_memory(self, site: Site, caller: str) -> bool:
        """Whether a rule of this scope says `site` reads host memory (no wait, no read)."""
        return any(rule.host_memory and rule.matches(site, caller) for rule in self.rules)

    def cost(self, steps: int = 1) -> Cost:
        """Every wait of the scope (allowed ones too: they cost the same), its stalls, the device
        work inside it and the idle windows after the stalls, over `steps` steps; by site, most
        waits first. Idle time is summed per step the scope saw (an optimizer's, or one marked
        with `step()`; a window counts in the step it opened in, one after the last step in the
        last), at most `steps` figures, else one for the scope."""
        if self.work is None:
            raise SyncScopeError("cost() needs a closed scope opened with account=True")
        by_site: dict[Site, list[SyncEvent]] = {}
        for event in self.events:
            by_site.setdefault(event.site, []).append(event)
        windows: dict[Site, list[Window]] = {}
        for window in self.windows:
            windows.setdefault(window.site, []).append(window)
        sites = [
            SiteCost(
                site,
                len(events),
                sum(event.stall for event in events),
                sum(
                    (e.waited_for for e in events if e.stall and e.waited_for is not None),
                    DeviceWork(),
                ),
                Idle(
                    tuple(window.us for window in windows.get(site, ())),
                    top_lines(span for window in windows.get(site, ()) for span in window.spans),
                ),
            )
            for site, events in by_site.items()
        ]
        sites.sort(key=lambda cost: (-cost.reads, cost.site.file, cost.site.line))
        stalls = sum(event.stall for event in self.events)
        # No more figures than the steps the caller says the scope covers: an optimizer's step
        # inside a one-step scope splits nothing.
        per_step = [0.0] * max(1, min(self.optimizer_steps, steps))
        for window in self.windows:
            per_step[min(window.step, len(per_step) - 1)] += window.us
        idle = tuple(round(us, 1) for us in per_step)
        return Cost(steps, len(self.events), stalls, self.work, tuple(sites), idle)

    @property
    def unexpected(self) -> list[SyncEvent]:
        return [event for event in self.events if event.allowed is None]

    def counts(self) -> dict[Site, int]:
        """Unexpected events per site, most frequent first."""
        return dict(Counter(event.site for event in self.unexpected).most_common())

    def allowed_counts(self) -> dict[tuple[Site, str], int]:
        """Allowed events per (site, reason), most frequent first."""
        allowed = Counter((e.site, e.allowed) for e in self.events if e.allowed is not None)
        return dict(allowed.most_common())

    def sync_sites(self, by_caller: bool = False) -> list[SiteCount]:
        """The unexpected sites, each with its count and kinds, most frequent first; `by_caller`
        gives one per (site, caller), each with its `caller`."""
        if not by_caller:
            return [
                SiteCount(site, count, self._kinds_at(site))
                for site, count in self.counts().items()
            ]
        per_caller = Counter((event.site, event.caller) for event in self.unexpected)
        return [
            SiteCount(site, count, self._kinds_at(site), caller=caller)
            for (site, caller), count in per_caller.most_common()
        ]

    def allowed_sync_sites(self) -> list[SiteCount]:
        """The allowed sites, each with its count, kinds and reason, most frequent first."""
        return [
            SiteCount(site, count, self._kinds_at(site), reason=reason)
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

    def _kinds_at(self, site: Site) -> tuple[str, ...]:
        return tuple(sorted({event.kind for event in self.events if event.site == site}))


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
    """The innermost frame outside torch and the detector (else the innermost outside it)."""
    frame: FrameType | None = sys._getframe(1)
    fallback = None
    while frame is not None:
        filename = frame.f_code.co_filename
        if filename not in _DETECTOR_FILES:
            if not filename.startswith(_TORCH_DIR):
                return frame
            fallback = fallback or frame
        frame = frame.f_back
    return fallback


_DETECTOR_FILES = (
    _caller_frame.__code__.co_filename,
    ops.__file__,
    sys.modules[Accounting.__module__].__file__,
)


class SyncScopeError(RuntimeError):
    """The scope cannot measure what is asked of it (raised instead of measuring other code)."""


class CompiledInScope(SyncScopeError):
    """A torch.compile'd function ran inside a scope: a survey reports it as not judged."""


_ACCOUNT_OUTERMOST = (
    "SyncScope(account=True) inside a scope that does not account: open the outermost scope"
    " with account=True"
)
_NO_WORK = DeviceWork()

_COMPILED_IN_SCOPE = (
    "a torch.compile'd function was called inside a SyncScope: its graphs run fused kernels the"
    " scope cannot judge (or, under a dispatch mode, eager code instead); call the function"
    " uncompiled inside the scope (e.g. under torch.compiler.set_stance('force_eager'))"
)

_NAMES_HOST = re.compile(r"\bcpu\b|pin_memory")


class _Names:
    """Sites and callers by code object, kept across scopes while sys.path is unchanged: naming
    a file walks sys.path (50 us), and a scope is often opened once per training step."""

    def __init__(self) -> None:
        self.sites: dict[tuple[CodeType, int] | None, Site] = {}
        self.callers: dict[CodeType, str] = {}
        self._search_path: list[str] = []

    def follow(self, search_path: list[str]) -> None:
        if search_path != self._search_path:
            self.sites.clear()
            self.callers.clear()
            self._search_path = list(search_path)


_names = _Names()


def _named_site(frame: FrameType | None) -> Site:
    key = (frame.f_code, frame.f_lineno) if frame else None
    site = _names.sites.get(key)
    if site is None:
        site = _names.sites[key] = _site(frame)
    return site


class _Observer:
    """What the open scopes of one context share: the instrumentation and the events it sees.

    A context is the thread that opened the first scope, plus the threads its thread-local state
    is carried to: autograd's device threads (torch copies it into each backward task) and those
    started with `SyncScope.carry`. The observer itself travels in that state
    (`torch._C._stash_obj_in_tls`), with the dispatch key its kernels listen on.
    """

    def __init__(self) -> None:
        self.scopes: list[SyncScope] = []
        self.counts_cuda_syncs = False
        self.host = _HostMemory(self)
        self._lock = threading.RLock()
        self._local = threading.local()
        self._instrumentation = ExitStack()
        self._opened_in: int | None = None
        self._propagation: _HostPropagation | None = None
        self.accounting: Accounting | None = None
        # The host copy `.cpu()` made last, and where: reading it once on that line is free.
        self._host_copy: tuple[tuple[int, int], weakref.ref[torch.Tensor]] | None = None

    @staticmethod
    def current() -> _Observer | None:
        """The observer of this thread's context, if a scope is open in it."""
        return torch._C._get_obj_in_tls(_TLS_NAME) if torch._C._is_key_in_tls(_TLS_NAME) else None

    def open(self, scope: SyncScope) -> None:
        with self._lock:
            if scope.account and self.scopes and self.accounting is None:
                raise SyncScopeError(_ACCOUNT_OUTERMOST)
            if not self.scopes:
                with ExitStack() as instrumentation:
                    self.counts_cuda_syncs = torch.cuda.is_available()
                    instrumentation.enter_context(_process_wide.installed(self.counts_cuda_syncs))
                    instrumentation.enter_context(self._observing_this_thread())
                    self._instrumentation = instrumentation.pop_all()
                self._opened_in = threading.get_ident()
                _names.follow(sys.path)
                if scope.account:
                    self.accounting = Accounting(self.host, self.statement_at)
                    _push_mode(self.accounting)
            scope.cuda_syncs = 0 if self.counts_cuda_syncs else None
            if self.accounting is not None:
                scope._work_at_open = self.accounting.total
                scope._windows_at_open = (len(self.accounting.windows), self.accounting.step)
            self.scopes.append(scope)

    def close(self, scope: SyncScope) -> None:
        with self._lock:
            self.scopes.remove(scope)
            accounting = self.accounting
            if not self.scopes and accounting is not None:
                accounting.close()
            if scope.account and accounting is not None:
                scope.work = accounting.total - scope._work_at_open
                first, step = scope._windows_at_open
                scope.windows = [
                    dataclasses.replace(window, step=window.step - step)
                    for window in accounting.windows[first:]
                ]
                scope.optimizer_steps = accounting.step - step
            if not self.scopes:
                if self._propagation is not None:
                    _pop_mode()
                    self._propagation = None
                if accounting is not None:
                    _pop_mode()
                    self.accounting = None
                self._host_copy = None
                self.host.clear()
                self._instrumentation.close()

    @contextmanager
    def _observing_this_thread(self) -> Iterator[None]:
        """This context's observer and dispatch key in the current thread's local state."""
        included = torch._C._dispatch_tls_is_dispatch_key_included(_KEY)
        torch._C._stash_obj_in_tls(_TLS_NAME, self)
        torch._C._dispatch_tls_set_dispatch_key_included(_KEY, True)
        try:
            yield
        finally:
            torch._C._dispatch_tls_set_dispatch_key_included(_KEY, included)
            torch._C._remove_obj_from_tls(_TLS_NAME)

    @contextmanager
    def carried(self) -> Iterator[None]:
        """This context observed in another thread, as autograd does for its threads."""
        if not self.scopes:
            yield
            return
        with self._observing_this_thread():
            yield

    def propagate_host_memory(self) -> None:
        """From now on, results computed from host memory only are host memory too: every aten
        call is seen (a dispatch mode), in the thread that opened the scope."""
        if self._propagation is None and threading.get_ident() == self._opened_in:
            self._propagation = _HostPropagation(self.host)
            _push_mode(self._propagation)
            if self.accounting is not None:
                self.accounting.modes += 1

    @property
    def quiet(self) -> bool:
        """Inside a call whose CUDA truth is already judged (its nested calls are not)."""
        return getattr(self._local, "quiet", 0) > 0

    @contextmanager
    def quieted(self) -> Iterator[None]:
        self._local.quiet = getattr(self._local, "quiet", 0) + 1
        try:
            yield
        finally:
            self._local.quiet -= 1

    def judge_kernel(
        self,
        op: torch._ops.OpOverload,
        rules: Sequence[ops.OpSync],
        run: Callable[[], object],
        call: ops.OpCall,
    ) -> object:
        """One aten call made by Python code in this context, and its reads on CUDA."""
        syncs = [(rule.kind, n) for rule in rules if (n := rule.syncs(call, self.host))]
        with self.quieted():
            result = run()
        # What the CPU still reads where the tensor lives in host memory (a GPU would not wait).
        host_reads = sum(
            rule.syncs(call, _NOTHING_ON_HOST) for rule in rules if rule.kind == _READ
        ) - sum(count for kind, count in syncs if kind == _READ)
        if host_reads:
            with self._lock:
                for scope in self.scopes:
                    scope.host_reads += host_reads
        for kind, count in syncs:
            self.record(kind, str(op), count, read=call.args[0] if call.args else None)
        return result

    def site(self) -> tuple[FrameType | None, Site]:
        frame = _caller_frame()
        return frame, _named_site(frame)

    def statement_at(self) -> str:
        """`file:line` of the statement the host is at, outside torch and the detector."""
        site = self.site()[1]
        return f"{site.file}:{site.line}"

    def statement(self) -> Site:
        """The innermost statement outside the detector, inside torch or not."""
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_code.co_filename in _DETECTOR_FILES:
            frame = frame.f_back
        return _named_site(frame)

    def caller(self, frame: FrameType | None) -> str:
        """`file:function` of the frame that called `frame`'s function ("" for none)."""
        calling = frame.f_back if frame else None
        if calling is None:
            return ""
        code = calling.f_code
        found = _names.callers.get(code)
        if found is None:
            found = _names.callers[code] = f"{package_path(code.co_filename)}:{code.co_name}"
        return found

    def record(
        self,
        kind: str,
        op: str,
        count: int = 1,
        read: object = None,
        host_copy: torch.Tensor | None = None,
    ) -> None:
        """`count` host reads of `read`; `host_copy` is the host tensor it produced, if any."""
        accounting = self.accounting
        own = accounting.own_begins() if accounting is not None else None
        try:
            frame, site = self.site()
            caller = self.caller(frame)
            where = (id(frame), frame.f_lineno if frame else 0)
            with self._lock:
                if host_copy is not None:
                    self._host_copy = (where, weakref.ref(host_copy))
                elif (
                    self._host_copy and self._host_copy[0] == where and self._host_copy[1]() is read
                ):
                    self._host_copy = None
                    return
                if any(scope.reads_host_memory(site, caller) for scope in self.scopes):
                    for scope in self.scopes:
                        scope.host_reads += count
                    return
                # The first of the reads waits for what was queued; the others find the stream
                # idle.
                waited = accounting.waited() if accounting is not None else None
                for scope in self.scopes:
                    for index in range(count):
                        scope._add(kind, op, site, caller, waited if index == 0 else _NO_WORK)
        finally:
            if accounting is not None:
                accounting.own_ends(own)
        if accounting is not None and waited is not None and waited.queued:
            accounting.drained(site)

    def meet_compiled(self) -> None:
        """A compiled function called in this context: refused if one of its scopes refuses
        compiled code, else recorded at its call site and let run."""
        if any(scope.refuse_compiled for scope in self.scopes):
            raise CompiledInScope(_COMPILED_IN_SCOPE)
        if not self.quiet:
            self.record(COMPILED, "torch.compile")

    def count_cuda_sync(self) -> None:
        with self._lock:
            for scope in self.scopes:
                scope.cuda_syncs = (scope.cuda_syncs or 0) + 1


class _HostMemory:
    """Tensors known to live in host memory even on a GPU box: what the code put there by name.

    On CPU every tensor is in host memory, so the model is "every tensor would be on the GPU",
    except those created with a named host destination (`device="cpu"`, `pin_memory=True`,
    `.to("cpu", dtype)` when it makes a new tensor) and their views and results. A device value
    is ambiguous here (`args.device` is cpu on CPU, cuda on the GPU box), so a destination counts
    as host only when the statement spells it.

    A factory call that names no device and takes no tensor (`torch.tensor(0.0)`,
    `torch.zeros(())`) makes host memory on a GPU box too, while the default device is the CPU,
    and so does a file: a storage `UntypedStorage.from_file` made (safetensors loads so) is host
    memory, as is every tensor over it while the storage lives. What is known to be host memory
    stays known across scopes (optimizer state outlives the step that made it: AdamW's `step`
    counters when neither capturable nor fused); what is computed from it is followed only in the
    scope that named it, and not from a factory's result alone (that would put every later aten
    call of the gate through Python).
    """

    def __init__(self, observer: _Observer) -> None:
        self._observer = observer
        # Named in this context's scopes, by id: a WeakSet compares tensors with ==, which is
        # elementwise.
        self._tensors: dict[int, weakref.ref[torch.Tensor]] = {}

    def __bool__(self) -> bool:
        return bool(self._tensors)

    def holds(self, tensor: object) -> bool:
        held = _ON_HOST.get(id(tensor)) if _ON_HOST else None
        if held is not None and held() is tensor:
            return True
        return bool(_FROM_FILES) and _over_a_file(tensor)

    @staticmethod
    def made(values: object) -> None:
        """`values` live in host memory, from now on and in every scope."""
        for value in _tensors_in(values):
            key = id(value)
            _ON_HOST[key] = weakref.ref(value, _forget(_ON_HOST, key))

    @staticmethod
    def moved(tensor: torch.Tensor) -> None:
        """`tensor.to(device)` returned `tensor` itself: on a GPU box it is a copy on the device
        (the stand-in's device is the host), which is what the code goes on to use."""
        _ON_HOST.pop(id(tensor), None)

    def named(self) -> bool:
        """Whether the statement making the call, or the one its reads are counted at, spells
        host memory (torch's AdamW spells `device="cpu"` for its step counters)."""
        statements = (self._observer.statement(), self._observer.site()[1])
        return any(_NAMES_HOST.search(statement.code) for statement in statements)

    def add(self, values: object, propagate: bool = True) -> None:
        """`values` live in host memory; with `propagate`, so will what is computed from them."""
        self.made(values)
        for value in _tensors_in(values):
            key = id(value)
            self._tensors[key] = weakref.ref(value, _forget(self._tensors, key))
        if propagate and self._tensors:
            self._observer.propagate_host_memory()

    def clear(self) -> None:
        self._tensors.clear()


# Tensors known to live in host memory, by id, process-wide (see _HostMemory).
_ON_HOST: dict[int, weakref.ref[torch.Tensor]] = {}


def _forget(table: dict[int, weakref.ref[torch.Tensor]], key: int) -> Callable[[object], object]:
    """A weak reference's callback: its tensor died, `key` leaves `table`."""
    return lambda _: table.pop(key, None)


# The memory of each storage made from a file, by the id of the storage while it lives (no other
# storage can be given its addresses before): first address and the one past its end.
_FROM_FILES: dict[int, tuple[int, int]] = {}


def _over_a_file(value: object) -> bool:
    """Whether a tensor's (or a storage's) memory lies in a storage made from a file."""
    if isinstance(value, torch.Tensor) and torch._C._has_storage(value):
        value = value.untyped_storage()
    if not isinstance(value, torch.UntypedStorage):
        return False
    address = value.data_ptr()
    return any(start <= address < end for start, end in list(_FROM_FILES.values()))


@functools.cache
def _reading_files(from_file: Callable[..., Any]) -> Callable[..., Any]:
    """`UntypedStorage.from_file`: its storage holds the file in host memory, on any box."""

    @functools.wraps(from_file)
    def from_a_file(*args: Any, **kwargs: Any) -> torch.UntypedStorage:
        storage: torch.UntypedStorage = from_file(*args, **kwargs)
        key, start = id(storage), storage.data_ptr()
        _FROM_FILES[key] = (start, start + storage.nbytes())
        weakref.finalize(storage, _FROM_FILES.pop, key, None)
        return storage

    return from_a_file


def _tensors_in(values: object) -> Iterator[torch.Tensor]:
    if isinstance(values, torch.Tensor):
        yield values
    elif isinstance(values, list | tuple):
        for value in values:
            yield from _tensors_in(value)
    elif isinstance(values, Mapping):
        yield from _tensors_in(list(values.values()))


@functools.cache
def _collating(next_batch: Callable[..., object]) -> Callable[..., object]:
    """A DataLoader's batches are collated in host memory (pinned, with `pin_memory`), on any
    box: what the training step copies to the device."""

    @functools.wraps(next_batch)
    def collated(self: object) -> object:
        observer = _Observer.current()
        if observer is None or observer.accounting is None:
            batch = next_batch(self)
        else:
            with observer.accounting.hosting():
                batch = next_batch(self)
        if observer is not None:
            _HostMemory.made(batch)
        return batch

    return collated


def _names_host_memory(
    destination: torch.device | None, call: ops.OpCall, host: _HostMemory
) -> bool:
    """A result in pinned memory, or on a cpu device the statement names."""
    if call.kwargs.get("pin_memory"):
        return True
    return destination is not None and destination.type == "cpu" and host.named()


def _made_on_host(
    name: str, call: ops.OpCall, destination: torch.device | None, observer: _Observer
) -> bool:
    """A torch factory given no device and no tensor to follow, while the default device is the
    CPU: its result is host memory on a GPU box too (`torch.tensor(0.0)`, `torch.zeros(3)`).

    Inside `with torch.device(...)` torch finds the default device by making a tensor, which the
    scope must not observe again: it would ask the same question without end."""
    if destination is not None or name.startswith("torch.Tensor.") or name.endswith("_like"):
        return False
    if any(isinstance(value, torch.Tensor) for value in (*call.args, *call.kwargs.values())):
        return False
    with observer.quieted():
        return torch.get_default_device().type == "cpu"


class _HostPropagation(TorchDispatchMode):
    """Results of aten calls whose tensor inputs all live in host memory live there too.

    A higher-order operator is judged by the same rule on its inputs and results, its body
    unobserved by the mode (torch pops it for the call)."""

    supports_higher_order_operators = True

    def __init__(self, host: _HostMemory) -> None:
        super().__init__()  # type: ignore[no-untyped-call]  # torch's, unannotated
        self.host = host

    def __torch_dispatch__(
        self,
        func: torch._ops.OpOverload,
        types: Sequence[type],
        args: tuple[object, ...] = (),
        kwargs: dict[str, object] | None = None,
    ) -> object:
        kwargs = kwargs or {}
        result = func(*args, **kwargs)
        inputs = [*_tensors_in(args), *_tensors_in(list(kwargs.values()))]
        if inputs and all(self.host.holds(tensor) for tensor in inputs):
            self.host.add(result)
        return result


# The aten calls judged in C++ dispatch, without a Python call for any other operator: kernels
# registered at a dispatch key no torch feature uses (its fallback falls through), enabled in
# the thread-local state of a context with an open scope. The key sits above autograd, so it
# sees what Python code calls; what an operator's own kernel calls below autograd (CPU-only
# validations, `nonzero` inside a mask index) runs with ADInplaceOrView excluded, and passes.
_KEY_NAME = "TESTING_ONLY_GenericMode"
_KEY = torch._C._dispatch_key_parse(_KEY_NAME)
_BELOW_KEY = torch._C._dispatch_keyset_full_after(_KEY)
_NESTED = torch._C.DispatchKey.ADInplaceOrView
_TLS_NAME = "hostsync.detector"
# A kernel receives a wrapped number (the tensor C++ makes of `t * 2.0`) as a Python number.
_WRAPPED_DTYPES = {
    bool: torch.bool,
    int: torch.int64,
    float: torch.float64,
    complex: torch.complex128,
}

_KERNEL_RULES: dict[torch._ops.OpOverload, list[ops.OpSync]] = {}
for _entry in ops.KERNEL_SYNCS:
    for _overload in ops.overloads(_entry):
        _KERNEL_RULES.setdefault(_overload, []).append(_entry)


def _seen_in_dispatch(op: torch._ops.OpOverload) -> bool:
    """CompositeImplicitAutograd operators decompose before any kernel: their parts are seen."""
    try:
        return not torch._C._dispatch_has_kernel_for_dispatch_key(
            op.name(), "CompositeImplicitAutograd"
        )
    except RuntimeError:  # an overload the dispatcher does not know (`Tensor_hacked_twin`)
        return False


def _host_factories() -> Iterator[str]:
    """Every public torch function and Tensor method whose aten operators take a device or
    pin_memory: the calls that can name host memory (factories, copies)."""
    for qualified in torch._C._dispatch_get_all_op_names():
        name, _, overload = qualified.removeprefix("aten::").partition(".")
        packet = getattr(torch.ops.aten, name, None) if qualified.startswith("aten::") else None
        op = getattr(packet, overload or "default", None) if packet is not None else None
        if name.startswith("_") or op is None:
            continue
        if {"device", "pin_memory"} & {a.name for a in op._schema.arguments if a.kwarg_only}:
            for owner in ("torch", "torch.Tensor"):
                if callable(getattr(ops.resolve(owner), name, None)):
                    yield f"{owner}.{name}"


def _judging_kernel(
    op: torch._ops.OpOverload, rules: Sequence[ops.OpSync]
) -> Callable[..., object]:
    handle = op._handle
    tensors = [
        position
        for position, argument in enumerate(op._schema.arguments)
        if not argument.kwarg_only and argument.type == torch._C.TensorType.get()
    ]

    def judged(keyset: torch._C.DispatchKeySet, *args: Any, **kwargs: Any) -> object:
        if tensors and any(type(args[i]) in _WRAPPED_DTYPES for i in tensors if i < len(args)):
            args = tuple(
                torch.scalar_tensor(value, dtype=_WRAPPED_DTYPES[type(value)])
                if position in tensors and type(value) in _WRAPPED_DTYPES
                else value
                for position, value in enumerate(args)
            )
        below = keyset & _BELOW_KEY
        observer = None
        if not torch._C._dispatch_tls_is_dispatch_key_excluded(_NESTED):
            observer = _Observer.current()
        if observer is None or observer.quiet:
            return handle.redispatch_boxed(below, *args, **kwargs)
        return observer.judge_kernel(
            op,
            rules,
            lambda: handle.redispatch_boxed(below, *args, **kwargs),
            ops.OpCall(args, kwargs),
        )

    return judged


@functools.cache
def _kernels() -> tuple[torch.library.Library, ...]:
    """The kernels, registered once per process; idle wherever no scope enables the key."""
    fallback = torch.library.Library("_", "IMPL")
    fallback.fallback(torch.library.fallthrough_kernel, _KEY_NAME)
    library = torch.library.Library("aten", "IMPL")
    for op, rules in _KERNEL_RULES.items():
        if _seen_in_dispatch(op):
            library.impl(op, _judging_kernel(op, rules), _KEY_NAME, with_keyset=True)
    _higher_order_operators_fall_through()
    return fallback, library


def _higher_order_operators_fall_through() -> None:
    """Every higher-order operator passes the key, as the fallback lets every other operator.

    torch dispatches them in Python (`HigherOrderOperator.dispatch`): a key in the thread's state
    with no kernel of theirs raises "could not find kernel" (vmap's `custom_function_call`,
    which transformers' masks run, and `invoke_subgraph`). A fall-through key leaves the state
    as it is, so the aten calls of their bodies still meet the judging kernels. Those made
    later take it from torch's list of keys every new one falls through.
    """
    torch._ops._HIGHER_ORDER_OP_DEFAULT_FALLTHROUGH_DISPATCH_KEYS.append(_KEY)
    for operator in torch._ops._higher_order_ops.values():
        operator.fallthrough(_KEY)


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
    to_host = name == "torch.Tensor.cpu"
    replaces_kernels = any(rule.replaces_kernels for rule in rules)

    @functools.wraps(original)
    def observed(*args: Any, **kwargs: Any) -> object:
        observer = _Observer.current()
        if observer is None or observer.quiet:
            return original(*args, **kwargs)
        entered = time.perf_counter_ns()
        call = ops.OpCall(args, kwargs)
        counts = [(rule.kind, n) for rule in rules if (n := rule.syncs(call, observer.host))]
        with observer.quieted() if replaces_kernels else contextlib.nullcontext():
            ran = time.perf_counter_ns()
            result: Any = original(*args, **kwargs)
            ran = time.perf_counter_ns() - ran
        source: Any = args[0] if args else None
        copied_to_host = any(kind == _TO_HOST for kind, _ in counts)
        if copied_to_host and result is source and result.layout == torch.strided:
            # The stand-in's `.cpu()` of a host tensor is the tensor itself; on a GPU box it is
            # a new host tensor, which an alias stands for, so that the source stays the
            # device's.
            result = result.view_as(result)
        where = _CPU if to_host else ops.destination(call)
        made = result is not source
        on_host = made and _names_host_memory(where, call, observer.host)
        if on_host:
            observer.host.add(result)
        elif made and _made_on_host(name, call, where, observer):
            on_host = True
            observer.host.made(result)
        elif not made and where is not None and not _names_host_memory(where, call, observer.host):
            observer.host.moved(result)
        if observer.accounting is not None:
            if on_host:
                observer.accounting.retract(result)
            observer.accounting.own(time.perf_counter_ns() - entered - ran)
        for kind, count in counts:
            copy = result if kind == _TO_HOST else None
            observer.record(kind, op, count, read=source, host_copy=copy)
        return result

    return observed


_CPU = torch.device("cpu")
_READ = "scalar_read"
_TO_HOST = "cpu"


class _NothingOnHost:
    """A host model that holds no tensor: what a rule counts when every tensor is the device's."""

    @staticmethod
    def holds(tensor: object) -> bool:
        return False

    @staticmethod
    def named() -> bool:
        return False


_NOTHING_ON_HOST = _NothingOnHost()


def _device_storages(value: object, host: _HostMemory, seen: set[int]) -> int:
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


class _ProcessWide:
    """What only exists once per process, installed while any scope is open anywhere.

    - the Python-level calls of `ops.FUNCTION_SYNCS`, judged in contexts with a scope;
    - `torch.save` and `torch.serialization.save`: each device storage is copied to the host;
    - `torch.UntypedStorage.from_file`: its memory is host memory (`_FROM_FILES`);
    - the torch.compile guard (`_COMPILED_IN_SCOPE`);
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
        _kernels()
        restore = ExitStack()
        replacements = []
        for qualified, rules in _observed_functions().items():
            owner_name, _, name = qualified.rpartition(".")
            owner = ops.resolve(owner_name)
            replacements.append((owner, name, _observing(qualified, rules, getattr(owner, name))))
        save, from_file = torch.serialization.save, torch.UntypedStorage.from_file
        loading = torch.utils.data.dataloader._BaseDataLoaderIter
        replacements += [
            (loading, "__next__", _collating(loading.__next__)),
            (torch.Tensor, "__setitem__", _writing(torch.Tensor.__setitem__)),
            (torch, "save", _saving(save)),
            (torch.serialization, "save", _saving(save)),
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
    def setting(self: torch.Tensor, index: object, value: Any) -> None:
        observer = _Observer.current()
        if observer is None or observer.quiet:
            setitem(self, index, value)
            return
        if type(value) in _WRAPPED_DTYPES and not self.is_quantized:
            value = torch.scalar_tensor(value, dtype=self.dtype)
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
        observer = _Observer.current()
        if observer is not None and not observer.quiet:
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
        observer = _Observer.current()
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
            observer = _Observer.current()
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
        warnings.filters.remove(entry)  # type: ignore[attr-defined]  # a list at run time
