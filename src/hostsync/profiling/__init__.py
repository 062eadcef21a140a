"""`python -m hostsync profile`: before/after profiles of a case's measured code, tree by tree.

- `capture`: runs the case's profile script on each tree (nsys where it can, the PyTorch
  profiler everywhere);
- `traces`: reads the traces and nsys's tables into per-step figures;
- `records`: a profile's captures and result, and the GPU evidence's;
- `report`: the summary table, `summary.md` and the timeline PNG;
- `run`: a case's profile, its trees captured one by one and the result published.

Its command line is `hostsync.commands.profile`.

`profiles/<case>/profile-<stamp>.json` holds the summary (`records.ProfileResult`); the folder
beside it the traces (`<tree>-<backend>-ws<N>-rank<R>.trace.json.gz`, open in ui.perfetto.dev),
`summary.md` and the timeline PNG.
"""
