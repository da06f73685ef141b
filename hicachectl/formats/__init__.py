"""Text formats read and written, knowing nothing of a deployment: quoting for line-oriented files, TOML, tables
and JSON for output, prompts, vastnfs' port lists. Imports nothing of hicachectl."""
