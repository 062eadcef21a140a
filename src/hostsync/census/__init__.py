"""`python -m hostsync census`: every host sync of the training steps users run, setup by setup.

- `setups`: `census.toml`, one table per setup (trainer, ranks, ZeRO stage, precision, SP,
  accumulation, checkpointing, packing, LoRA, logging and evaluation), read and checked;
- `run`: each setup run on the newest release each case pins, as published and with every
  carried fix stacked on one tree per project, its sites summed by the site layer
  (`hostsync.sites`: the known sites, the cases' `[[carries]]`);
- `report`: one report, Markdown, JSON and a heat map (setups x sites, reads per optimizer
  step), every site ranked by its reads per step summed over the setups, with its verdict.

Its command line is `hostsync.commands.census`.

Writes profiles/census/census-<stamp>.json (`records.CensusResult`) with census-<stamp>.md and
census-<stamp>.png beside it, and regenerates profiles/census/census.md from the newest.
"""
