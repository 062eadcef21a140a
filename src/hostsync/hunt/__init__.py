"""`python -m hostsync hunt`: every host sync of a full SP training step, tree by tree.

- `measure`: runs the real `accelerate launch` + `Trainer` + DeepSpeed Ulysses step once per tree
  and setup, and has the site layer (`hostsync.sites`) sum what the ranks recorded into sites:
  where, how often per step, on which steps, and their disposition (carried by a case, accepted
  in `known_sites.toml`, or a candidate); the reads only the PyTorch profiler sees form a
  separate list;
- `report`: the Markdown report, trees compared site by site (matched on file, function and
  code line, since line numbers move between releases);
- `run`: a case's hunt, its trees prepared (the fixes of `--stack` on them), hunted and written;
  and the sites a newer release adds, which `watch --hunt` is handed.

Its command line is `hostsync.commands.hunt`.

Writes profiles/<case>/hunt-<stamp>.json (`records.HuntResult`, never overwritten) with the
Markdown report beside it, and regenerates profiles/<case>/hunt.md from the newest result.
"""
