# Copyright: hicache-deploy developers
# SPDX-License-Identifier: Apache-2.0
"""The L3 namespace filters of playbooks/l3.yml (hicachectl l3): the directory a host's tier holds its
namespaces in, the record of what its server runs (deployed.json), and what a removal must keep: the
namespaces the inventory's servers use and run, the directories never removed, and the tiers with a server not
checked (hicachectl/ops/l3.py, hicachectl/config/namespace.py).

The core is the Python package hicache-deploy on the controller (see plugins/filter/hicache.py).
"""

from __future__ import annotations

from ansible.errors import AnsibleFilterError

try:
    from hicachectl import rules
    from hicachectl.config import namespace, schema
    from hicachectl.config.deployment import PREFIX
    from hicachectl.config.inventory import ROUTERS, plain
    from hicachectl.ops import l3
    from hicachectl.plans import l3_collector, sglang_server
except ImportError as error:  # pragma: no cover - exercised by ansible-test's import sanity test
    CORE_MISSING = (f"hicache.deploy needs the Python package hicache-deploy on the controller (it provides hicachectl): "
                    f"pip install its wheel into the Python that runs Ansible, see COLLECTION.md ({error})")
else:
    CORE_MISSING = None


def _deployment(hostvars, host):
    if CORE_MISSING is not None:
        raise AnsibleFilterError(CORE_MISSING)
    variables = plain({k: hostvars[k] for k in list(hostvars) if k.startswith(PREFIX) and k not in schema.FACTS})
    deployment, findings = rules.check_host(host, variables)
    errors = [f.format() for f in findings if f.level == rules.ERROR]
    if errors or deployment is None:
        raise AnsibleFilterError("invalid hicache variables:\n" + "\n".join(errors))
    return deployment


def hicache_l3_dir(variables, host):
    """The directory that holds this host's L3 namespaces (hicache_cache_dir); refuses a host whose pages are not files there."""
    d = _deployment(variables, host)
    if not l3.listable(d):
        raise AnsibleFilterError(f"{host}: its L3 pages are not files under hicache_cache_dir (hicache_storage_backend: {d.storage_backend})")
    return d.cache_dir


def hicache_l3_running_record(variables, host):
    """This server's deployed.json: the record of what it runs (sglang_server.record_paths, where the role writes it)."""
    return sglang_server.record_paths(_deployment(variables, host))[0]


def _servers(all_hostvars, hosts):
    return [h for h in hosts if ROUTERS not in (all_hostvars[h].get("group_names") or [])]


def hicache_l3_guard(all_hostvars, hosts):
    """What a removal keeps, over every server among `hosts` (pass every host of the inventory, not the play's):
    keep (the namespaces they use, and the ones their deployed.json says they run), protect (their model, base and
    cfg directories) and hold (host -> why nothing is removed on its tier: a server of the tier whose deployed.json
    was not read, `hicache_l3_report.running` missing, or cannot be read). A server whose variables are invalid
    fails the task, since its namespace cannot be known."""
    servers = _servers(all_hostvars, hosts)
    deployments = {h: _deployment(all_hostvars[h], h) for h in servers}
    used = l3.in_use(deployments)
    runs, unknown = l3.running({h: (all_hostvars[h].get("hicache_l3_report") or {}).get("running") for h in servers})
    hold = {}
    for tier in l3.tiers(deployments)[0]:
        blind = {h: unknown[h] for h in tier.hosts if h in unknown}
        if blind:
            why = ("not checked what " + ", ".join(f"{h} runs ({reason})" for h, reason in blind.items())
                   + ": a server not checked may write here; nothing is removed on this tier")
            hold.update(dict.fromkeys(tier.hosts, why))
    return {"keep": sorted({*used, *runs}), "protect": sorted({entry[0] for entry in l3.protected(deployments)}), "hold": hold}


def hicache_l3_collector(variables, host, all_hostvars, hosts):
    """The L3 collector's plan on server `host` (`variables`: its hicache_vars lookup): whether it runs its tier's
    collector and the files it installs, or what it removes (hicachectl/plans/l3_collector.py). Pass every host of the
    inventory (groups['all'], in the inventory's order), not the play's: the collector is the tier's first server
    whatever --limit says. Another server whose variables do not check out is left out (it fails on its own)."""
    own = _deployment(variables, host)
    deployments = {}
    for name in _servers(all_hostvars, hosts):
        if name == host:
            deployments[name] = own
        elif own.l3_share and all_hostvars[name].get("hicache_l3_share") == own.l3_share:
            # Only the servers of this host's share can be of its tier: each host checks those, not the whole
            # inventory (a thousand servers would each check a thousand).
            raw = plain({k: all_hostvars[name][k] for k in list(all_hostvars[name]) if k.startswith(PREFIX) and k not in schema.FACTS})
            deployment, findings = rules.check_host(name, raw)
            deployments[name] = None if rules.has_errors(findings) else deployment
    deployments.setdefault(host, own)
    return l3_collector.plan(host, deployments).as_fact()


def hicache_l3_in_use(all_hostvars, hosts):
    """The namespaces every server among `hosts` uses (pass every host of the inventory, not the play's):
    a server whose variables are invalid fails the task, since its namespace cannot be known."""
    used = set()
    for host in _servers(all_hostvars, hosts):
        hostvars = all_hostvars[host]
        name = namespace.of(_deployment(hostvars, host))
        if name:
            used.add(name)
    return sorted(used)


class FilterModule:
    def filters(self):
        return {f.__name__: f for f in (hicache_l3_dir, hicache_l3_running_record, hicache_l3_guard, hicache_l3_in_use, hicache_l3_collector)}
