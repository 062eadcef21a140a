"""The upstream side of a case: releases as git repositories, the patch queue, the trees.

- `git`: git with a fixed identity, and the bookkeeping kept inside a repository's git dir;
- `sdists`: release sdists from PyPI, verified against a card's size and sha256;
- `envs`: one Python environment per dependency set, fitted to each release;
- `releases`: a release as a git repository, from `git clone` or from its sdist;
- `patchqueue`: `patches/<case>/` on the clone's `patched` branch, and back;
- `trees`: the detached worktrees the commands measure (`Tree`), each with its environment;
- `presence`: whether a release's source carries a site, and where;
- `records`: the side files they leave, and a site's finding in a release;
- `command`: `clone`, `export-patches` and `env`, the commands that need no torch.
"""
