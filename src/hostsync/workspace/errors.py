"""Errors a user can act on: each message is one line naming the cause and the fix."""


class WorkspaceError(Exception):
    """Bad input or state; the CLI and the nox sessions print it as a one-line error."""


def last_line(output: str) -> str:
    """The last non-blank line of a tool's output: what a one-line error quotes of it."""
    lines = [line.strip() for line in output.strip().splitlines() if line.strip()]
    return lines[-1] if lines else "no output"
