"""What the commands do across a deployed fleet, pure where they can be (the playbooks gather): verify, status, rolling,
l3, monitoring, bench, and the /metrics text they read. Imports plans, rules, config and formats."""
