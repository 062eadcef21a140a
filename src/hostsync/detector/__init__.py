"""The host-sync detector, what other projects install: it imports nothing else of hostsync.

`from hostsync.detector import SyncScope` is the API. The names resolve on first use, so that
the codec and the site records below it load without torch.
"""

from __future__ import annotations

import importlib

_HOMES = {
    "Cost": "records",
    "SyncScope": "scope",
    "HostTracking": "scope",
    "SyncScopeError": "events",
    "CompiledInScope": "events",
    "package_path": "frames",
    "AllowRule": "sites",
    "Site": "sites",
    "SiteCount": "sites",
}

__all__ = sorted(_HOMES)


def __getattr__(name: str) -> object:
    if name not in _HOMES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_HOMES[name]}"), name)
