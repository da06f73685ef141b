"""The commands (typer), by family: offline (validate, render, init, size, monitoring), change (deploy, upgrade,
rollback, restart), observe (plan, doctor, status, verify), bench, l3; common: the options, the one inventory guard,
the one run report; runner: ansible-runner's events as per-host records. The top layer: imports any layer below."""
