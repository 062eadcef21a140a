"""Values a user writes in an option, read the same way by every layer that takes them."""

from __future__ import annotations

from hostsync.workspace.errors import WorkspaceError


def comma_list(text: str, option: str) -> list[str]:
    """`--trees pinned,patched` and the like: the items, refusing an empty list."""
    items = [item.strip() for item in text.split(",") if item.strip()]
    if not items:
        raise WorkspaceError(f"empty {option} list: give comma-separated values")
    return items
