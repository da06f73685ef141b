"""The L3 tier's collector, part of the sglang_server role's plan: which server of a tier runs it, and the files it
installs there (the program roles/sglang_server/files/hicache-l3-collect, its config, a service and a timer).

A tier is the storage the servers giving one hicache_l3_share write to (a server alone is its own tier). When its
servers give it a budget (hicache_l3_budget_gb), exactly one of them collects: the first of the tier's servers in
the inventory's order, whatever --limit says, so every run of every inventory subset names the same host; on the
others the collector is removed if present. The program takes the tier's lock on the tier itself for each run, so a
second collector (an older inventory, one started by hand) waits instead of racing it.

Beside it, SGLang's own evictors see only their own instance: the toolkit turns NIXL's cleaner off on a tier with a
budget (plans/launch.py extra_config) and warns when the file backend's LRU is set there too (rules/tiers.py).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Mapping
from typing import Any

from hicachectl.config import namespace
from hicachectl.config.deployment import Deployment
from hicachectl.config.paths import ROLES
from hicachectl.config.sizing import GB

PROGRAM = "/usr/local/sbin/hicache-l3-collect"
CONFIG_FILE = "/etc/hicache/l3-collector.json"
STATE_FILE = "/var/lib/hicache/l3-collector.json"
SERVICE = "hicache-l3-collector.service"
TIMER = "hicache-l3-collector.timer"
UNIT_DIR = "/etc/systemd/system"
# Debian's prometheus-node-exporter reads *.prom there (its README.textfile); written only where the directory exists.
TEXTFILE_DIR = "/var/lib/prometheus/node-exporter"
# A page written or read this recently is never evicted: NIXL writes its files in place (no temporary name).
GRACE_SECONDS = 120
NO_NAMESPACE = ""  # the servers writing into the tier's directory itself (hicache_l3_namespace: off)
LOCK_NAME = ".hicache-l3-collector.lock"  # on the tier, beside the namespaces (the program's own LOCK_NAME)


def budgeted(d: Deployment) -> bool:
    """Whether the server's pages are files on a tier with a budget (the file and nixl backends)."""
    return d is not None and d.l3_budget_gb is not None and namespace.host_dir(d) is not None


def tier_name(host: str, d: Deployment) -> str:
    return d.l3_share or host


@dataclasses.dataclass(frozen=True, kw_only=True)
class CollectorPlan:
    tier: str | None  # None: no budget on this server's tier, no collector anywhere for it
    collector: str | None  # the server of the tier that runs it
    here: bool  # this host runs it
    servers: tuple[str, ...] = ()
    config: dict[str, Any] | None = None
    files: tuple[dict[str, str], ...] = ()  # what the collector host installs (path, content, mode)
    absent: tuple[str, ...] = ()  # what every other host removes
    config_file: str = CONFIG_FILE  # the host facts read it: present, a collector runs here
    text: str = ""

    def as_fact(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def members(host: str, deployments: Mapping[str, Any]) -> list[str]:
    """The servers of `host`'s tier that give it a budget, in the inventory's order (`deployments` is ordered so)."""
    d = deployments[host]
    return [name for name, other in deployments.items() if budgeted(other) and tier_name(name, other) == tier_name(host, d)]


def config(host: str, deployments: Mapping[str, Any]) -> dict[str, Any]:
    """The collector's config (the program reads it): the tier, its budget and floor, and each namespace its servers
    write to with the share one of them gives it (None: an equal part of what the given shares leave)."""
    d = deployments[host]
    servers = members(host, deployments)
    spaces: dict[str, dict[str, Any]] = {}
    for name in servers:
        other = deployments[name]
        entry = spaces.setdefault(namespace.of(other) or NO_NAMESPACE, {"share_pct": None, "servers": []})
        entry["servers"].append(name)
        if other.l3_namespace_share_pct is not None:
            entry["share_pct"] = other.l3_namespace_share_pct
    return {"tier": tier_name(host, d), "root": d.cache_dir, "budget_bytes": int(d.l3_budget_gb * GB), "free_floor_pct": d.l3_free_floor_pct,
            "grace_seconds": GRACE_SECONDS, "namespaces": dict(sorted(spaces.items())), "state_file": STATE_FILE, "textfile_dir": TEXTFILE_DIR}


PROGRAM_SOURCE = ROLES / "sglang_server" / "files" / "hicache-l3-collect"


def program_text() -> str:
    return PROGRAM_SOURCE.read_text()


@functools.cache
def program():
    """The collector program as a module, so its rules (quotas, plan_eviction) are used here, not written twice;
    loaded once per process (`l3` asks it for each tier)."""
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.SourceFileLoader("hicache_l3_collect", str(PROGRAM_SOURCE))
    module = importlib.util.module_from_spec(importlib.util.spec_from_loader(loader.name, loader))
    loader.exec_module(module)
    return module


def service_text(d: Deployment) -> str:
    """One run, after the tier is mounted (RequiresMountsFor: the mount unit of hicache_cache_dir, when it is one)."""
    return f"""# Managed by hicache-deploy: keeps the L3 tier's pages within its budget (hicache_l3_budget_gb).
[Unit]
Description=hicache-deploy L3 tier collector
RequiresMountsFor={d.cache_dir}

[Service]
Type=oneshot
Nice=10
IOSchedulingClass=idle
ExecStart={PROGRAM} --config {CONFIG_FILE}
"""


def timer_text(d: Deployment) -> str:
    return f"""# Managed by hicache-deploy: runs the L3 tier collector every hicache_l3_collect_interval_min minutes.
[Unit]
Description=hicache-deploy L3 tier collector, every {d.l3_collect_interval_min} min

[Timer]
OnBootSec=5min
OnUnitInactiveSec={d.l3_collect_interval_min}min
RandomizedDelaySec=30

[Install]
WantedBy=timers.target
"""


def plan(host: str, deployments: Mapping[str, Any]) -> CollectorPlan:
    """The collector's plan on `host`, given every server of the inventory (inventory order)."""
    from hicachectl.rules.output import compact_hosts

    unit_files = (f"{UNIT_DIR}/{SERVICE}", f"{UNIT_DIR}/{TIMER}")
    everything = (PROGRAM, CONFIG_FILE, *unit_files)
    d = deployments[host]
    if not budgeted(d):
        return CollectorPlan(tier=None, collector=None, here=False, absent=everything, text="no L3 budget: no collector")
    servers = members(host, deployments)
    collector = servers[0]
    if host != collector:
        return CollectorPlan(tier=tier_name(host, d), collector=collector, here=False, servers=tuple(servers), absent=everything,
                             text=f"the L3 tier {tier_name(host, d)} is collected on {collector}")
    conf = config(host, deployments)
    files = ({"path": PROGRAM, "content": program_text(), "mode": "0755"},
             {"path": CONFIG_FILE, "content": json.dumps(conf, indent=2, sort_keys=True) + "\n", "mode": "0644"},
             {"path": unit_files[0], "content": service_text(d), "mode": "0644"},
             {"path": unit_files[1], "content": timer_text(d), "mode": "0644"})
    text = (f"collects the L3 tier {conf['tier']} ({d.cache_dir}) for {compact_hosts(servers)}: {d.l3_budget_gb} GB budget, "
            f"{d.l3_free_floor_pct}% free floor, {len(conf['namespaces'])} namespace(s), every {d.l3_collect_interval_min} min")
    return CollectorPlan(tier=conf["tier"], collector=host, here=True, servers=tuple(servers), config=conf, files=files, text=text)
