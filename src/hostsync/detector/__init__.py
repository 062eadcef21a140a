"""The host-sync detector, what other projects install: it imports nothing else of hostsync.

`from hostsync.detector import SyncScope` is the API. The names resolve on first use, so that
the codec and the site records below it load without torch.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the names of _HOMES, as the type checker sees them
    from hostsync.detector.events import CompiledInScope as CompiledInScope
    from hostsync.detector.events import SyncScopeError as SyncScopeError
    from hostsync.detector.frames import package_path as package_path
    from hostsync.detector.patches import prepare as prepare
    from hostsync.detector.records import Cost as Cost
    from hostsync.detector.scope import HostTracking as HostTracking
    from hostsync.detector.scope import SyncScope as SyncScope
    from hostsync.detector.sites import AllowRule as AllowRule
    from hostsync.detector.sites import Site as Site
    from hostsync.detector.sites import SiteCount as SiteCount

_HOMES = {
    "Cost": "records",
    "SyncScope": "scope",
    "HostTracking": "scope",
    "SyncScopeError": "events",
    "CompiledInScope": "events",
    "package_path": "frames",
    "prepare": "patches",
    "AllowRule": "sites",
    "Site": "sites",
    "SiteCount": "sites",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
