"""Where the pinned bug sits in a tree: found in the tree's source, never assumed."""

from __future__ import annotations

from hostsync.upstream.trees import Tree

DEEPSPEED_PY = "transformers/integrations/deepspeed.py"
IF_PER_RANK = "if good_tokens_per_rank[rank] > 0"
MAX_OF_TOTAL = "max(total_good_tokens, 1)"


def source_line(tree: Tree, text: str) -> int:
    """The one line of `text` in the tree's integrations/deepspeed.py."""
    lines = (tree.src / DEEPSPEED_PY).read_text().splitlines()
    (number,) = [n for n, line in enumerate(lines, start=1) if text in line]
    return number
