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


# A budget for the local profile's tier: a dev box's disk, with the collector's 10% free floor beside it.
LOCAL_BUDGET_GB = 50


def _settle(profile_vars: dict, group_vars: pathlib.Path) -> None:
    """What a new inventory gets beyond its profile, so that validate has nothing to say about the profile's own
    content (the shipped profiles reproduce their source documents flag for flag, and those leave these out):
    a served name that does not move with the weights (SGLang keys every L3 page with it: rule served-name-stable),
    and for a file tier without a bound, a budget its collector keeps (rule file-backend-unbounded)."""
    added = []
    if profile_vars.get("hicache_storage_backend") and profile_vars.get("hicache_served_model_name") is None:
        model = str(profile_vars.get("hicache_model_repo") or profile_vars.get("hicache_model_path") or "model")
        name = re.sub(r"[^A-Za-z0-9._-]", "-", model.rstrip("/").rsplit("/", 1)[-1]) or "model"
        added += ["# SGLang keys every L3 page with the served name; unset, it is the model path, and moving the weights",
                  "# would invalidate the whole cache. Keep it when the weights move; change it when the model does.",
                  f"hicache_served_model_name: {name}"]
    extra = profile_vars.get("hicache_extra_config") or {}
    if (profile_vars.get("hicache_storage_backend") == "file" and profile_vars.get("hicache_l3_budget_gb") is None
            and not extra.get("max_size") and not extra.get("min_free_space")):
        added += ["# The file tier's budget: one collector keeps every namespace on it within this many GB (docs/operations.md).",
                  "# Set it to what the tier's disk can hold.",
                  f"hicache_l3_budget_gb: {LOCAL_BUDGET_GB}"]
    if added:
        text = group_vars.read_text().rstrip("\n")
        group_vars.write_text(text + "\n\n# Added by `hicachectl init`:\n" + "\n".join(added) + "\n")


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
    _settle(yaml.safe_load((source / "group_vars" / "all.yml").read_text()) or {}, out / "group_vars" / "all.yml")
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
