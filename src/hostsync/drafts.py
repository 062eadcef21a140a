"""What a draft sent upstream must be: short, in the project's form, about what was measured.

Busy maintainers close what reads machine-written, so `review` checks every draft before it
writes it, and refuses in one line:
- over its length: an issue or a PR description at most 40 lines (a PR's own text: the project's
  template, after the `TEMPLATE_MARK` comment, does not count), a comment at most 30;
- prose lines over `MAX_PROSE` characters (tables and code blocks are what they are);
- a word of this workspace: its commands, folders and paths mean nothing upstream;
- a figure typed into the template instead of taken from a result, or one no result holds.
The identity a patch is sent with is checked by `outbox`, with `placeholder_identity`.
"""

from __future__ import annotations

import re
from pathlib import Path

from hostsync.errors import WorkspaceError

# The line of a PR template where the project's own template begins (left out of the count).
TEMPLATE_MARK = "<!-- the project's template -->"
LIMITS = {"issue": 40, "pr": 40, "comment": 30, "review-comment": 30}
MAX_PROSE = 100
NOT_MEASURED = "not measured"
WORKSPACE = re.compile(
    r"hostsync|\bnox\b|issue_drafts|\bprofiles/|\bwork/|\brepro/|\bpatches/|/tmp/|/root/"
    r"|\bworkspace\b"
)
# A number standing as a word: not part of an identifier, a version, a path, a date or a ref.
HAND_TYPED = re.compile(r"(?<![\w.#/+\-:])\d+(?:\.\d+)?(?![\w./%+\-:])")
# What may hold digits in a template's prose: placeholders, code, links, HTML comments,
# project names with numbers in them (ZeRO stages).
_NOT_PROSE = re.compile(
    r"\{\{.*?\}\}|```.*?```|`[^`\n]*`|\]\([^)]*\)|<!--.*?-->|\bZeRO[ -]\d", re.DOTALL
)
_PLACEHOLDER_IDENTITY = re.compile(
    r"@example\.(?:com|org|net)\b|@localhost\b|^hostsync\b|\bcontributor@", re.IGNORECASE
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
            f"cases/.../{template.name} types the figure(s) {', '.join(typed)} by hand: take each"
            " from a result with a placeholder, or write it as a word"
        )


def check_draft(name: str, draft_kind: str, text: str) -> None:
    """Refuse a filled draft that upstream should not get: see the module's docstring."""
    own = text.split(TEMPLATE_MARK, 1)[0]
    lines = own.rstrip("\n").splitlines()
    if len(lines) > LIMITS[draft_kind]:
        raise WorkspaceError(
            f"{name} has {len(lines)} lines, over the {LIMITS[draft_kind]} of a {draft_kind}:"
            " cut it to what a maintainer needs to act"
        )
    if NOT_MEASURED in text:
        raise WorkspaceError(
            f"{name} would say '{NOT_MEASURED}': a figure it cites is in no result; run the"
            " command that measures it, or drop the figure from the template"
        )
    found = WORKSPACE.search(_without_code(text))
    if found:
        raise WorkspaceError(
            f"{name} says {found[0]!r}, a word of this workspace: upstream reads the project's"
            " words only"
        )
    long = [n for n, line in enumerate(_prose_lines(own), start=1) if len(line) > MAX_PROSE]
    if long:
        raise WorkspaceError(
            f"{name} has prose lines over {MAX_PROSE} characters (line {long[0]} of its prose):"
            " wrap the template's paragraphs"
        )


def placeholder_identity(identity: str) -> bool:
    """A name or address that stands for nobody (the workspace's own, example domains)."""
    return bool(_PLACEHOLDER_IDENTITY.search(identity))


def _without_code(text: str) -> str:
    return re.sub(r"```.*?```", " ", text, flags=re.DOTALL)


def _prose_lines(text: str) -> list[str]:
    """The lines of `text` outside code blocks, tables and HTML comments, inline code counted
    as one word (a quoted message or name is as long as it is)."""
    text = re.sub(r"```.*?```|<!--.*?-->", "", text, flags=re.DOTALL)
    text = re.sub(r"`[^`\n]*`", "`code`", text)
    return [line for line in text.splitlines() if not line.lstrip().startswith("|")]
