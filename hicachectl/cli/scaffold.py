"""`hicachectl init`: a new inventory from a shipped profile."""

from __future__ import annotations

import pathlib
import re
import shutil

import yaml

from hicachectl.config.inventory import INVENTORIES

PROFILES = ("vast", "netapp", "adp", "local")
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")  # the only hosts `init` reaches without SSH
_HOST_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class ScaffoldError(Exception):
    pass


def init(profile: str, hosts: list[str], out: pathlib.Path) -> list[pathlib.Path]:
    if profile not in PROFILES:
        raise ScaffoldError(f"unknown profile {profile!r}; choose one of {', '.join(PROFILES)}.")
    if not hosts:
        raise ScaffoldError("--hosts names no host.")
    bad = [h for h in hosts if not _HOST_NAME.match(h)]
    if bad:
        raise ScaffoldError(f"not a host name: {', '.join(map(repr, bad))}.")
    if out.exists() and any(out.iterdir()):
        raise ScaffoldError(f"{out} exists and is not empty; nothing was written.")
    source = INVENTORIES / profile
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(source / "group_vars", out / "group_vars")
    (out / "host_vars").mkdir(exist_ok=True)
    template = yaml.safe_load((source / "hosts.yml").read_text())
    first_group_hosts = next(iter(template["all"]["children"].values()))["hosts"]
    local = next(iter(first_group_hosts.values())) or None  # e.g. ansible_connection: local, for this machine only
    inventory = {"all": {"children": {"hicache_servers": {"hosts": {h: local if h in LOCAL_NAMES else None for h in hosts}}}}}
    hosts_file = out / "hosts.yml"
    remote = [h for h in hosts if h not in LOCAL_NAMES]
    hosts_file.write_text(f"---\n# Made by `hicachectl init --profile {profile}`."
                          + ("\n# Reached over SSH (known_hosts, your SSH config); set ansible_host, ansible_user or"
                             " ansible_port per host where needed." if remote else "") + "\n"
                          + yaml.safe_dump(inventory, sort_keys=False))
    return [hosts_file] + sorted((out / "group_vars").rglob("*.yml"))
