"""`python -m hostsync hunt`: every host sync of a full SP training step, tree by tree.

A reproducer shows one read; the hunt shows every wait of the step users run.

- `measure`: runs the real `accelerate launch` + `Trainer` + DeepSpeed Ulysses step once per
  tree and setup. The site layer (`hostsync.sites`) sums what the ranks recorded into sites.
  The reads only the PyTorch profiler sees form a list apart.
- `records`: the hunt's result. Each tree's record sits on the site layer.
- `report`: the Markdown report. Trees are compared site by site, matched on file, function
  and code line, since line numbers move between releases.
- `run`: a case's hunt, its trees prepared (the fixes of `--stack` on them), hunted and
  written. Also the sites a newer release adds, which `watch --hunt` is handed.

Its command line is `hostsync.commands.hunt`.

Writes profiles/<case>/hunt-<stamp>.json (`records.HuntResult`, never overwritten) with the
Markdown report beside it, and regenerates profiles/<case>/hunt.md from the newest result.
"""
