"""What a draft sent upstream must be: short, in the project's form, about what was measured.

Busy maintainers close what reads machine-written, so `review` rewraps the paragraphs filled
placeholders left ragged (`reflow`, at `MAX_PROSE` columns), checks every draft before it writes
it, and refuses in one line:
- over its length: an issue or a PR description at most 40 lines of text (a PR's own text: the
  project's template, after the `TEMPLATE_MARK` comment, does not count), a comment at most 30,
  also with every figure `MARGIN` characters wider, so that a rerun's noise cannot tip it over;
  a code block, the reproducer a maintainer runs, at most `MAX_CODE_LINES` lines;
- a word of this workspace: its commands, folders and paths mean nothing upstream;
- the platform of the machine it was measured on: system info is the contributor's to give;
- a figure typed into the template instead of taken from a result (one no result holds is
  refused by `review`, naming the session that measures it);
- a thread (`#8614`) its card's `[[upstream.threads]]` lacks: a draft cites only threads read in
  the public record, and says what one does with the card's line for it.
The identity a patch is sent with is checked by `outbox`, with `placeholder_identity`.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Collection
from pathlib import Path

from hostsync.detector.words import counted
from hostsync.workspace.errors import WorkspaceError

# The line of a PR template where the project's own template begins (left out of the count).
TEMPLATE_MARK = "<!-- the project's template -->"
LIMITS = {"issue": 40, "pr": 40, "comment": 30, "review-comment": 30}
COMMENTS = frozenset({"comment", "review-comment"})
MAX_PROSE = 100
MAX_CODE_LINES = 30
# How much wider a figure may come out of a rerun (an idle time, a range of kernels): a draft
# whose shape hangs on it is refused (`check_length`).
MARGIN = 2
NOT_MEASURED = "not measured"
# This workspace's words and folders, and a machine's absolute paths (home, temporary, /root).
WORKSPACE = re.compile(
    r"hostsync|\bnox\b|issue_drafts|\bprofiles/|\bwork/|\brepro/|\bpatches/"
    r"|/(?:tmp|root|home)/|\bworkspace\b"
)
# A machine's platform string (`platform.platform()`): Linux-6.1.0-...-x86_64-with-glibc2.36.
MACHINE = re.compile(r"\b(?:Linux|Darwin|Windows|macOS)-\d(?:[\w.+\-]*\w)?")
# A number standing as a word: not part of an identifier, a version, a path, a date or a ref.
HAND_TYPED = re.compile(r"(?<![\w.#/+\-:])\d+(?:\.\d+)?(?![\w./%+\-:])")
# What may hold digits in a template's prose: placeholders, code, links, HTML comments,
# project names with numbers in them (ZeRO stages).
_NOT_PROSE = re.compile(
    r"\{\{.*?\}\}|```.*?```|`[^`\n]*`|\]\([^)]*\)|<!--.*?-->|\bZeRO[ -]\d", re.DOTALL
)
_CODE = re.compile(r"```.*?```", re.DOTALL)
# A thread cited by number, alone or after its repository (`#8614`, `owner/name#8614`); not an
# HTML character reference (`&#38;`).
THREAD = re.compile(r"(?<!&)#(\d+)\b")
_LIST_ITEM = re.compile(r"\s*(?:[-*]|\d+\.) ")
# Addresses no mail reaches: the domains reserved for examples and tests (RFC 2606, RFC 6761).
_PLACEHOLDER_IDENTITY = re.compile(
    r"@(?:[\w-]+\.)*(?:example\.(?:com|org|net)|example|test|invalid|localhost)$"
    r"|^hostsync\b|\bcontributor@",
    re.IGNORECASE,
)


def kind(template: Path) -> str:
    """What a template drafts, from its name: issue, pr, comment or review-comment."""
    if template.stem not in LIMITS:
        raise WorkspaceError(
            f"{template.name}: name a draft template after what it drafts:"
            f" {', '.join(f'{name}.md' for name in LIMITS)}"
        )
    return template.stem


def check_template(template: Path, text: str) -> None:
    """Refuse figures typed into a template's prose: each comes from a result."""
    prose = _NOT_PROSE.sub(" ", text)
    typed = sorted(set(HAND_TYPED.findall(prose)))
    if typed:
        raise WorkspaceError(
            f"cases/.../{template.name} types {counted(len(typed), 'figure')} by hand"
            f" ({', '.join(typed)}): take each"
            " from a result with a placeholder, or write it as a word"
        )


def check_length(name: str, draft_kind: str, text: str, widened: bool = False) -> None:
    """Refuse a filled draft over its kind's length; `widened`: filled with every figure
    `MARGIN` characters wider, as the next run's may be."""
    own = text.split(TEMPLATE_MARK, 1)[0]
    lines = _without_code(own).rstrip("\n").splitlines()
    if len(lines) > LIMITS[draft_kind]:
        wider = f" with every figure {MARGIN} characters wider, as a rerun's may be" * widened
        raise WorkspaceError(
            f"{name} has {len(lines)} lines besides its code{wider}, over the"
            f" {LIMITS[draft_kind]} of a {draft_kind}: cut it to what a maintainer needs to act"
        )


def check_draft(name: str, draft_kind: str, text: str) -> None:
    """Refuse a filled draft that upstream should not get: see the module's docstring."""
    check_length(name, draft_kind, text)
    own = text.split(TEMPLATE_MARK, 1)[0]
    longest = max((block.count("\n") - 1 for block in _CODE.findall(own)), default=0)
    if longest > MAX_CODE_LINES:
        raise WorkspaceError(
            f"{name} has a code block of {longest} lines, over {MAX_CODE_LINES}: cut the"
            " reproducer to what shows the read"
        )
    machine = MACHINE.search(text)
    if machine:
        raise WorkspaceError(
            f"{name} gives the platform {machine[0]!r}, the machine it was measured on: cite"
            " releases only; system info is the contributor's own to paste"
        )
    found = WORKSPACE.search(_without_code(text))
    if found:
        raise WorkspaceError(
            f"{name} says {found[0]!r}, a word of this workspace: upstream reads the project's"
            " words only"
        )


def check_threads(name: str, text: str, known: Collection[int]) -> None:
    """Refuse a filled draft citing a thread that is not among `known`, its card's threads."""
    unknown = sorted({int(number) for number in THREAD.findall(text)} - set(known))
    if unknown:
        raise WorkspaceError(
            f"{name} cites {', '.join(f'#{number}' for number in unknown)}, which the card's"
            " [[upstream.threads]] lacks: read the thread in the public record and add it there,"
            " or drop the citation"
        )


def reflow(text: str) -> str:
    """Rewrap the paragraphs and list items that filled placeholders left ragged, at
    `MAX_PROSE` columns. Front matter, headings, code, tables, comments and the project's own
    template (after `TEMPLATE_MARK`) stay as written."""
    own, mark, rest = text.partition(TEMPLATE_MARK)
    out: list[str] = []
    block: list[str] = []
    verbatim_until = "---" if own.startswith("---\n") else None

    def flush() -> None:
        if block:
            item = _LIST_ITEM.match(block[0])
            indent = " " * (item.end() if item else 0)
            words = " ".join(line.strip() for line in block)
            out.extend(
                textwrap.wrap(
                    words,
                    MAX_PROSE,
                    subsequent_indent=indent,
                    break_long_words=False,
                    break_on_hyphens=False,
                )
            )
            block.clear()

    for n, line in enumerate(own.splitlines()):
        stripped = line.strip()
        if verbatim_until is not None:
            out.append(line)
            if n > 0 and stripped.endswith(verbatim_until):
                verbatim_until = None
            continue
        if stripped.startswith("```") or (stripped.startswith("<!--") and "-->" not in stripped):
            flush()
            out.append(line)
            verbatim_until = "```" if stripped.startswith("```") else "-->"
            continue
        if not stripped or stripped.startswith(("#", "|", ">", "<!--")):
            flush()
            out.append(line)
            continue
        if _LIST_ITEM.match(line):
            flush()
        block.append(line)
    flush()
    return "\n".join(out) + "\n" + mark + rest if mark else "\n".join(out) + "\n"


def number(value: object) -> str:
    """A figure as drafts cite it: a float (a mean per step) to the hundredth, no trailing 0."""
    if isinstance(value, float):
        return f"{value:.2f}".rstrip("0").rstrip(".")
    return str(value)


def placeholder_identity(identity: str) -> bool:
    """A name or address that stands for nobody (the workspace's own, reserved domains)."""
    return bool(_PLACEHOLDER_IDENTITY.search(identity))


def _without_code(text: str) -> str:
    return _CODE.sub(" ", text)
