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
GPU box too, while the default device is the CPU), numpy's memory (`torch.from_numpy`, the legacy
`torch.Tensor(array)`), tensors over a storage made from a file, views of host memory, a
factory given a host tensor's device (`device=x.device`), and what is computed from named host
memory: reads of those are free, copies into them (`host[i] = t0`, `host.copy_(t)`) count. Once the
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

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from hostsync.detector import patches
from hostsync.detector.accounting import Window
from hostsync.detector.events import SyncEvent, SyncScopeError
from hostsync.detector.observer import Observer
from hostsync.detector.records import Cost, DeviceWork, Idle, SiteCost, top_lines
from hostsync.detector.sites import AllowRule, Site, SiteCount, require_reason

_Result = TypeVar("_Result")
_NONE = DeviceWork()


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
        self._observer: Observer | None = None

    def __enter__(self) -> SyncScope:
        observer = self._observer = Observer.current() or Observer(patches.installed)
        observer.open(self)
        if observer.accounting is not None:
            self._work_at_open = observer.accounting.total
            self._windows_at_open = (len(observer.accounting.windows), observer.accounting.step)
        return self

    def __exit__(self, *exc_info: object) -> None:
        observer, self._observer = self._observer, None
        if observer is None:
            return
        accounting = observer.accounting
        observer.close(self)
        if self.account and accounting is not None:
            self.work = accounting.total - self._work_at_open
            first, step = self._windows_at_open
            self.windows = [
                dataclasses.replace(window, step=window.step - step)
                for window in accounting.windows[first:]
            ]
            self.optimizer_steps = accounting.step - step

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

    def add(
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
                sum((e.waited_for for e in events if e.waited_for and e.waited_for.queued), _NONE),
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
        allowed = Counter(
            (event.site, event.allowed) for event in self.events if event.allowed is not None
        )
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


class HostTracking:
    """Host memory known as it is made, from here on, in this thread's context, with no scope
    open: what a scan's bootstrap opens before the script's setup runs.

    Tensors made in setup (a dataset's index, a best-loss value, optimizer state made in its
    constructor) are then host or device memory as they were made, whichever optimizer steps.
    It only follows the factories, copies and loads that name where their result lives, views
    of host memory and its dtype copies (`.long()`, `.clone()`); nothing
    is judged or recorded until a scope opens inside it, and its scopes close before it does.
    """

    def __init__(self) -> None:
        self._observer: Observer | None = None

    def __enter__(self) -> HostTracking:
        observer = self._observer = Observer.current() or Observer(patches.installed)
        observer.track()
        return self

    def __exit__(self, *exc_info: object) -> None:
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.untrack()
