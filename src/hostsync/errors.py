"""Errors a user can act on: each message is one line naming the cause and the fix."""


class WorkspaceError(Exception):
    """Bad input or state; the CLI and the nox sessions print it as a one-line error."""
