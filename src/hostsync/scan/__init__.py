"""`python -m hostsync scan SCRIPT [ARGS...]`: the host syncs of a user's own training script.

- `runner`: the rank side, `python -m hostsync.scan.runner SCRIPT ARGS` (like `python -m
  cProfile`): the script run unchanged, its steps found without touching it (optimizer step
  hooks, or `--step-fn`), each step under `hostsync.detector` with accounting;
- `measure`: the command's side: the script started as its users start it (`python`, torchrun,
  `accelerate launch`, `deepspeed`), the runner in its place on every rank, the ranks' records
  read back (the last snapshot of a rank that died or hung) and summed up with the hunt's
  machinery, each site with its disposition (a case's `[[carries]]`, known_sites.toml);
- `report`: the one-screen summary, Markdown and a heat map like the census's, a Chrome trace
  per rank;
- `gate`: a baseline of what a run saw, and the checks a CI run fails on.

Writes profiles/scan/scan-<stamp>.json (`measure.records.ScanResult`, never overwritten; marked
partial when the run did not end cleanly) with scan-<stamp>.md, scan-<stamp>.svg and a folder of
traces beside it, and regenerates profiles/scan/scan.md from the newest.
"""
