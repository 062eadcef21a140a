"""`python -m hostsync hunt`: every host sync of a full SP training step, tree by tree.

- `measure`: runs the real `accelerate launch` + `Trainer` + DeepSpeed Ulysses step once per tree
  and setup, and sums up what the ranks recorded into sites: where (package, file, line,
  function, code), how often per step, and on which steps (every step, logging steps, SP data
  refills, the warm-up only); the reads only the PyTorch profiler sees form a separate list;
- `allowlist`: the sites accepted by design (`hunt_allowlist.toml`, each with its reason) and
  the sites a case's fix removes (its card's `[[carries]]`), set apart from the candidates;
- `report`: the Markdown report, trees compared site by site (matched on file, function and
  code line, since line numbers move between releases);
- `run`: a case's hunt, its trees prepared (the fixes of `--stack` on them), hunted and written.

Its command line is `hostsync.commands.hunt`.

Writes profiles/<case>/hunt-<stamp>.json (`records.HuntResult`, never overwritten) with the
Markdown report beside it, and regenerates profiles/<case>/hunt.md from the newest result.
"""
