"""The rank side: what a rank process imports, apart from the launcher's git, download and
environment code (`protocol`, `records`, `prefork`, `rankkit`, and the engine's own rank
script)."""
