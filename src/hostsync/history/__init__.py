"""Since when a site is upstream, and what the newest releases change."""
