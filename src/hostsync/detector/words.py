"""Counts in words, as a person writes them: `1 wait`, `3 waits`, `0.5 waits`. Every report's
plurals come from here; the pytest plugin's messages need it too, so it lives in the detector."""

from __future__ import annotations


def counted(number: float, noun: str) -> str:
    """`number` then `noun`, plural unless the number is one (a float as `%g` writes it)."""
    shown = f"{number:g}" if isinstance(number, float) else str(number)
    return f"{shown} {noun}{'' if number == 1 else 's'}"
