"""What a site is to the workspace, below every command that finds sites.

The hunt, the census, the scan and the watch each find sites. They share this layer. None of
them imports another.

- `records`: what ranks record of a step's sites, and a tree's sites. The finders share them.
- `known`: the known-sites file, read by one loader, and the cases' carried sites. Both are
  `SiteRule`s, the one matcher (`hostsync.detector.sites`).
- `summary`: ranks' records summed into sites. Steady cost, copies per step, windows.
- `dispositions`: what a site is to us. Carried, accepted, not carried, or a candidate.
- `render`: a site in words, why its line waits, and the heat map of sites.
- `remedies`: what to change at a site, from remedies.toml. Every report reads one table.
"""
