"""What a site is to the workspace, below every command that finds sites.

The hunt, the census, the scan and the watch each find sites. They share this layer, and
never import one another:

- `known`: the known-sites file (`known_sites.toml`), read by one loader, and the cases'
  carried sites; both are `SiteRule`s, the one matcher (`hostsync.detector.sites`);
- `summary`: ranks' records summed into sites: steady cost, copies per step, windows;
- `dispositions`: what a site is to us: carried, accepted, not carried, or a candidate;
- `render`: a site in words, why its line waits, and the heat map of sites.
"""
