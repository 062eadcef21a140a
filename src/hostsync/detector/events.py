"""What a scope records and what it raises.

Apart from the scope, so that the observer, which records them, sits below it.
"""

from __future__ import annotations

from typing import NamedTuple

from hostsync.detector.records import DeviceWork
from hostsync.detector.sites import Site


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


class SyncScopeError(RuntimeError):
    """The scope cannot measure what is asked of it (raised instead of measuring other code)."""


class CompiledInScope(SyncScopeError):
    """A torch.compile'd function ran inside a scope: a survey reports it as not judged."""
