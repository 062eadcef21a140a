"""What the open scopes of one context share: the instrumentation and the events it sees.

Kernels and wrappers find the observer in the thread's local state and hand it each sync; it
names the site, asks the accounting what the wait waited for, and gives the event to every
open scope. The process-wide instrumentation is handed in by the scope, above it.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from typing import Protocol

import torch
from torch.utils._python_dispatch import _pop_mode, _push_mode

from hostsync.detector import frames, ops
from hostsync.detector.accounting import Accounting
from hostsync.detector.events import CompiledInScope, SyncScopeError
from hostsync.detector.host import NOTHING_ON_HOST, HostMemory, HostPropagation
from hostsync.detector.records import DeviceWork
from hostsync.detector.sites import COMPILED, Site

# A dispatch key no torch feature uses: the detector's kernels listen on it, enabled in the
# thread-local state of a context with an open scope.
KEY_NAME = "TESTING_ONLY_GenericMode"
KEY = torch._C._dispatch_key_parse(KEY_NAME)
_TLS_NAME = "hostsync.detector"
READ = "scalar_read"

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

Instrument = Callable[[bool], AbstractContextManager[None]]


class OpenScope(Protocol):
    """What the observer asks of a scope it gives events to (`SyncScope`)."""

    account: bool
    refuse_compiled: bool
    cuda_syncs: int | None
    host_reads: int

    def reads_host_memory(self, site: Site, caller: str) -> bool: ...

    def add(
        self, kind: str, op: str, site: Site, caller: str, waited_for: DeviceWork | None
    ) -> None: ...


class Observer:
    """What the open scopes of one context share: the instrumentation and the events it sees.

    A context is the thread that opened the first scope, plus the threads its thread-local state
    is carried to: autograd's device threads (torch copies it into each backward task) and those
    started with `SyncScope.carry`. The observer itself travels in that state
    (`torch._C._stash_obj_in_tls`), with the dispatch key its kernels listen on. `instrument`
    installs what exists once per process (given whether CUDA syncs are counted).
    """

    def __init__(self, instrument: Instrument) -> None:
        self.scopes: list[OpenScope] = []
        self.counts_cuda_syncs = False
        self.host = HostMemory(self.propagate_host_memory)
        self._instrument = instrument
        self._lock = threading.RLock()
        self._local = threading.local()
        self._instrumentation = ExitStack()
        self._tracking: ExitStack | None = None
        self._opened_in: int | None = None
        self._propagation: HostPropagation | None = None
        self.accounting: Accounting | None = None
        # The host copy `.cpu()` made last, and where: reading it once on that line is free.
        self._host_copy: tuple[tuple[int, int], weakref.ref[torch.Tensor]] | None = None

    @staticmethod
    def current() -> Observer | None:
        """The observer of this thread's context, if a scope is open in it."""
        if not torch._C._is_key_in_tls(_TLS_NAME):
            return None
        observer: Observer = torch._C._get_obj_in_tls(_TLS_NAME)
        return observer

    def open(self, scope: OpenScope) -> None:
        with self._lock:
            if scope.account and self.scopes and self.accounting is None:
                raise SyncScopeError(_ACCOUNT_OUTERMOST)
            if not self.scopes:
                with ExitStack() as instrumentation:
                    self.counts_cuda_syncs = torch.cuda.is_available()
                    instrumentation.enter_context(self._instrument(self.counts_cuda_syncs))
                    instrumentation.enter_context(self._observing_this_thread(judging=True))
                    self._instrumentation = instrumentation.pop_all()
                self._opened_in = threading.get_ident()
                frames.follow_search_path()
                if scope.account:
                    self.accounting = Accounting(self.host, self.statement_at, KEY)
                    _push_mode(self.accounting)
            scope.cuda_syncs = 0 if self.counts_cuda_syncs else None
            self.scopes.append(scope)

    def close(self, scope: OpenScope) -> None:
        with self._lock:
            self.scopes.remove(scope)
            accounting = self.accounting
            if not self.scopes and accounting is not None:
                accounting.close()
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

    def track(self) -> None:
        """Host memory known as it is made from now on, in this thread, with no scope open:
        the wrappers run, no kernel judges, nothing is recorded until a scope opens."""
        with self._lock:
            if self._tracking is not None:
                raise SyncScopeError("host memory is already tracked in this context")
            with ExitStack() as tracking:
                tracking.enter_context(self._instrument(False))
                tracking.enter_context(self._observing_this_thread(judging=False))
                self._tracking = tracking.pop_all()

    def untrack(self) -> None:
        """Tracking ends; the scopes opened inside it are closed first."""
        with self._lock:
            if self.scopes:
                raise SyncScopeError("close the scopes opened inside the tracking first")
            if self._tracking is not None:
                self._tracking.close()
                self._tracking = None

    @contextmanager
    def _observing_this_thread(self, judging: bool) -> Iterator[None]:
        """This context's observer in the current thread's local state, with the dispatch key
        its kernels judge on when `judging`; what was there before, after."""
        previous = Observer.current()
        included = torch._C._dispatch_tls_is_dispatch_key_included(KEY)
        torch._C._stash_obj_in_tls(_TLS_NAME, self)
        if judging:
            torch._C._dispatch_tls_set_dispatch_key_included(KEY, True)
        try:
            yield
        finally:
            torch._C._dispatch_tls_set_dispatch_key_included(KEY, included)
            if previous is None:
                torch._C._remove_obj_from_tls(_TLS_NAME)
            else:
                torch._C._stash_obj_in_tls(_TLS_NAME, previous)

    @contextmanager
    def carried(self) -> Iterator[None]:
        """This context observed in another thread, as autograd does for its threads."""
        if not self.scopes:
            yield
            return
        with self._observing_this_thread(judging=True):
            yield

    def propagate_host_memory(self) -> None:
        """From now on, results computed from host memory only are host memory too: every aten
        call is seen (a dispatch mode), in the thread that opened the scope. The accounting
        follows host memory itself, and nothing is followed while no scope is open."""
        if (
            self._propagation is None
            and self.scopes
            and self.accounting is None
            and threading.get_ident() == self._opened_in
        ):
            self._propagation = HostPropagation(self.host, KEY)
            _push_mode(self._propagation)

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
            rule.syncs(call, NOTHING_ON_HOST) for rule in rules if rule.kind == READ
        ) - sum(count for kind, count in syncs if kind == READ)
        if host_reads:
            with self._lock:
                for scope in self.scopes:
                    scope.host_reads += host_reads
        for kind, count in syncs:
            self.record(kind, str(op), count, read=call.args[0] if call.args else None)
        return result

    @staticmethod
    def statement_at() -> str:
        """`file:line` of the statement the host is at, outside torch and the detector."""
        site = frames.caller_site()[1]
        return f"{site.file}:{site.line}"

    def record(
        self,
        kind: str,
        op: str,
        count: int = 1,
        read: object = None,
        host_copy: torch.Tensor | None = None,
    ) -> None:
        """`count` host reads of `read`; `host_copy` is the host tensor it produced, if any."""
        if not self.scopes:
            return
        accounting = self.accounting
        own = accounting.own_begins() if accounting is not None else None
        waited = None
        try:
            frame, site = frames.caller_site()
            caller = frames.caller(frame)
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
                        scope.add(kind, op, site, caller, waited if index == 0 else _NO_WORK)
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
