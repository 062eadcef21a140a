"""`python -m hostsync census`: every host sync of the training steps users run, setup by setup.

A case shows one bug; the census shows what users' setups pay for all of them.

- `records`: a setup, a column's trees, and the census's result.
- `setups`: `census.toml`, one table per setup, read and checked. Trainer, ranks, ZeRO stage,
  precision, SP, accumulation, checkpointing, packing, LoRA, logging and evaluation.
- `run`: each setup on the newest release each case pins, as published and with every carried
  fix. The site layer (`hostsync.sites`) sums its sites.
- `report`: Markdown and a heat map of setups x sites, waits per optimizer step. Every site is
  ranked by its waits per step summed over the setups, with its disposition.

Its command line is `hostsync.commands.census`.

Writes profiles/census/census-<stamp>.json (`records.CensusResult`) with census-<stamp>.md and
census-<stamp>.png beside it, and regenerates profiles/census/census.md from the newest.
"""
