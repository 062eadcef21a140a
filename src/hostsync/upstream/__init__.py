"""The upstream side of a case: releases as git repositories, the patch queue, the trees.

- `git`: git with a fixed identity, and the bookkeeping kept inside a repository's git dir;
- `sdists`: release sdists from PyPI, verified against a card's size and sha256;
- `releases`: a release as a git repository, from `git clone` or from its sdist;
- `patchqueue`: `patches/<case>/` on the clone's `patched` branch, and back;
- `trees`: the detached worktrees the commands measure, each with its environment.
"""
