"""The fleet: what no single host shows (one machine twice, hosts sharing an L3 tier, servers behind routers)."""

from __future__ import annotations

import urllib.parse
from collections.abc import Iterable, Mapping
from typing import Any

from hicachectl.config.deployment import PREFIX, Deployment
from hicachectl.rules.findings import ERROR, WARNING, Finding
from hicachectl.rules.output import compact_hosts


def _machine(host: str, connection: Mapping[str, Any]) -> tuple[str, str]:
    """Where Ansible reaches a host: (address, SSH port); every local connection is this machine."""
    if str(connection.get("ansible_connection") or "") == "local":
        return "this machine (ansible_connection: local)", ""
    address = str(connection.get("ansible_host") or host).strip().lower().rstrip(".")
    return address, str(connection.get("ansible_port") or 22)


def _connection(host: str, variables: Mapping[str, Any], connections: Mapping[str, Mapping[str, Any]] | None) -> dict[str, Any]:
    """How Ansible reaches a host: its variables' ansible_* settings, overridden by `connections[host]` when given."""
    connection = {k: v for k, v in variables.items() if k.startswith("ansible_")}
    connection.update((connections or {}).get(host) or {})
    return connection


def _reached_at(host: str, variables: Mapping[str, Any], connections: Mapping[str, Mapping[str, Any]] | None) -> tuple[str, str]:
    """_machine of a host, from _connection."""
    return _machine(host, _connection(host, variables, connections))


def check_fleet(hosts: Mapping[str, Mapping[str, Any]], connections: Mapping[str, Mapping[str, Any]] | None = None) -> list[Finding]:
    """Findings across the hosts of one inventory, once per run: two inventory hosts Ansible reaches at the same
    address and port are one machine, which would get the same unit, container, server port and deploy lock twice.

    `hosts` maps each host to its variables; how it is reached (ansible_host, ansible_port, ansible_connection)
    is read from `connections[host]` when given, else from the variables; a host without ansible_host is reached by its name.
    """
    machines: dict[tuple[str, str], list[str]] = {}
    for host, variables in hosts.items():
        machines.setdefault(_reached_at(host, variables, connections), []).append(host)
    findings = _bad_addresses(hosts, connections) + _documentation_hosts(hosts, connections)
    for (address, port), names in machines.items():
        if len(names) < 2:
            continue
        where = address if not port else f"{address}, port {port}"
        for host in names:
            findings.append(Finding(
                ERROR, host, "ansible_host", "duplicate-host",
                f"{len(names)} hosts ({compact_hosts(names)}) are all reached at {where}: one machine, which would get the same unit, "
                "container, server port and deploy lock twice.",
                f"give each of {compact_hosts(names)} its own ansible_host (or ansible_port), or keep only one of them."))
    return findings


def check_routers(routers: Mapping[str, Mapping[str, Any]], connections: Mapping[str, Mapping[str, Any]] | None = None) -> list[Finding]:
    """The routers among themselves: each reached at an address that can be a machine's (host-address) and not a
    documentation placeholder; two on one machine (check_fleet's machine) may share it, each with its own unit,
    directory and ports, but not one of those (the second unit would replace the first, or fail to bind)."""
    from hicachectl.config import schema

    findings = _bad_addresses(routers, connections) + _documentation_hosts(routers, connections)
    defaults = {v.name: v.default for v in schema.VARIABLES if v.name in ("hicache_router_service_name", "hicache_router_dir")}
    machines: dict[tuple[str, str], list[str]] = {}
    for host, variables in routers.items():
        machines.setdefault(_reached_at(host, variables or {}, connections), []).append(host)
    for (address, port), names in machines.items():
        taken: dict[str, str] = {}
        for host in names:
            variables = routers[host] or {}
            owned = [f"port {p}" for p in _router_ports(variables)]
            owned += [f"{name.removeprefix('hicache_router_').replace('_', ' ')} {variables.get(name) or defaults[name]}" for name in defaults]
            for thing in owned:
                other = taken.setdefault(thing, host)
                if other != host:
                    where = address if not port else f"{address}, port {port}"
                    findings.append(Finding(
                        ERROR, host, "ansible_host", "duplicate-host",
                        f"{other} and {host} are routers on one machine ({where}) with the same {thing}: the second would replace the "
                        "first or fail to start.",
                        f"give {host} its own hicache_router_service_name, hicache_router_dir and ports, or its own machine."))
                    break
    return findings


def check_server_or_router(in_both: Iterable[str]) -> list[Finding]:
    """A host in hicache_servers and in hicache_routers: every host outside hicache_routers is a server, so it would
    run the router only, never the server its other group says (site.yml's plays: all:!hicache_routers)."""
    from hicachectl.config.inventory import ROUTERS, SERVERS

    return [Finding(ERROR, host, "groups", "server-and-router",
                    f"{host} is in {SERVERS} and in {ROUTERS}: it would run the router only, not a server.",
                    f"keep {host} in one of the two groups (a router beside a server on one machine is two inventory hosts).")
            for host in in_both]


def _bad_addresses(hosts: Mapping[str, Mapping[str, Any]], connections: Mapping[str, Mapping[str, Any]] | None) -> list[Finding]:
    """ansible_host must be where SSH and the routers' URLs reach a machine: an IP address or a DNS name. Anything else
    (a space, a URL, a port written into it) fails at the first contact, or later in a worker URL. Refused here."""
    from hicachectl.formats.urls import is_host_address

    findings = []
    for host, variables in hosts.items():
        connection = _connection(host, variables, connections)
        address = connection.get("ansible_host")
        if address is not None and str(connection.get("ansible_connection") or "") != "local" and not is_host_address(str(address)):
            findings.append(Finding(
                ERROR, host, "ansible_host", "host-address",
                f"{str(address)!r} is neither an IP address nor a DNS name, so SSH and the routers cannot reach {host} there.",
                f"set ansible_host of {host} to its address or DNS name alone (the SSH port goes in ansible_port, the user in ansible_user)."))
    return findings


def _documentation_hosts(hosts: Mapping[str, Mapping[str, Any]], connections: Mapping[str, Mapping[str, Any]] | None) -> list[Finding]:
    """A host Ansible would reach at an address reserved for documentation (the profiles' 192.0.2.x, 2001:db8::,
    *.example.com): no machine answers there; the inventory still holds a placeholder. Refused, before any contact."""
    from hicachectl.rules.variables import documentation_address

    findings = []
    for host, variables in hosts.items():
        connection = _connection(host, variables, connections)
        if str(connection.get("ansible_connection") or "") == "local":
            continue
        address = connection.get("ansible_host") or host
        if documentation_address(address):
            findings.append(Finding(
                ERROR, host, "ansible_host", "documentation-address",
                f"{address} is an address reserved for documentation (RFC 5737/3849/2606): no machine answers it, nothing can be deployed there.",
                f"set ansible_host of {host} to the machine's real address (or name the host by its real DNS name)."))
    return findings


def _is_mla(d: Deployment, known: dict[str, bool | None]) -> bool | None:
    """Whether the host's model is MLA, from its config.json (hicache_model_config); None when validate cannot tell
    (no config given, or one the tiers rule already refuses)."""
    from hicachectl.config import sizing

    if not d.model_config:
        return None
    if d.model_config not in known:
        try:
            known[d.model_config] = sizing.model_shape(sizing.load_config(d.model_config)).attention == "MLA"
        except sizing.SizingError:
            known[d.model_config] = None
    return known[d.model_config]


def check_shared_tiers(deployments: Mapping[str, Any]) -> list[Finding]:
    """Hosts that share an L3 tier (hicache_l3_share) and one directory of it (the same namespace, or the namespace
    off) read each other's pages. Two such servers whose page format differs in what SGLang's keys do not hold (KV
    dtype, memory layout, the weights behind one served name: sglang#33268) would read each other's pages as their
    own: refused. What the keys hold depends on the backend and on the attention type (namespace.keyed: an MLA
    model's keys hold no TP size): with the model's config.json (hicache_model_config) validate knows it; without,
    servers that differ only in TP size besides such a difference are a warning. Hosts of one tier in different
    namespaces share nothing: a warning."""
    from hicachectl.config import namespace

    tiers: dict[str, list[str]] = {}
    for host, d in deployments.items():
        if d is not None and d.l3_share and d.storage_backend is not None:
            tiers.setdefault(d.l3_share, []).append(host)
    findings = []
    known: dict[str, bool | None] = {}
    for share, hosts in tiers.items():
        directories: dict[str | None, list[str]] = {}
        for host in hosts:
            directories.setdefault(namespace.of(deployments[host]), []).append(host)
        for name, together in directories.items():
            first = deployments[together[0]]
            for host in together[1:]:
                where = f"namespace {name}" if name else "the tier itself (namespace off)"
                mla = _is_mla(first, known)
                if mla is None:
                    mla = _is_mla(deployments[host], known)
                clash = namespace.collisions(first, deployments[host], mla=bool(mla))  # not known: keyed as before
                if clash:
                    findings.append(Finding(
                        ERROR, host, "hicache_l3_namespace", "l3-shared-format",
                        f"writes into {where} on L3 tier {share} with {together[0]}, but their pages differ ({', '.join(clash)}) "
                        f"in what SGLang's keys do not hold{' for an MLA model (no TP size)' if mla else ''}: each would read "
                        "the other's pages as its own.",
                        "set hicache_l3_namespace: auto on the hosts of the tier (or make their page formats equal)."))
                elif mla is None:
                    unknown = namespace.collisions(first, deployments[host], mla=None)
                    if unknown:
                        findings.append(Finding(
                            WARNING, host, "hicache_model_config", "l3-shared-format-mla",
                            f"writes into {where} on L3 tier {share} with {together[0]}; their pages differ ({', '.join(unknown)}) and "
                            "only the TP size keeps them apart, which an MLA model's keys do not hold (SGLang's file and NIXL "
                            "backends): if the model is MLA, each would read the other's pages as its own.",
                            "set hicache_model_config to the model's config.json (validate then knows), or hicache_l3_namespace: auto."))
        findings += _tier_budget(share, hosts, deployments, directories)
        if len(directories) > 1:
            names = ", ".join(f"{name or 'off'} ({compact_hosts(together)})" for name, together in directories.items())
            for host in hosts:
                findings.append(Finding(
                    WARNING, host, "hicache_l3_share", "l3-share-split",
                    f"the hosts of L3 tier {share} use {len(directories)} namespaces ({names}): pages are shared only within each.",
                    "give the servers of one tier one page format (see `hicachectl validate` for what each namespace is derived from)."))
    return findings


_BUDGET = ("l3_budget_gb", "l3_free_floor_pct", "l3_collect_interval_min")


def _tier_budget(share: str, hosts: list[str], deployments: Mapping[str, Any], directories: Mapping[str | None, list[str]]) -> list[Finding]:
    """One budget per tier (its collector runs on one server, with one config), one share per namespace, at most the
    whole budget shared out."""
    findings = []
    first = deployments[hosts[0]]
    for host in hosts[1:]:
        d = deployments[host]
        for field in _BUDGET:
            if getattr(d, field) != getattr(first, field):
                findings.append(Finding(
                    ERROR, host, PREFIX + field, "l3-budget-split",
                    f"is {getattr(d, field)!r} but {getattr(first, field)!r} on {hosts[0]}, which shares L3 tier {share}: the tier has one "
                    "collector, with one budget.", f"give every server of tier {share} the same {PREFIX + field}."))
    if first.l3_budget_gb is None:
        return findings
    shares: dict[str, int] = {}
    for name, together in directories.items():
        given = {deployments[h].l3_namespace_share_pct for h in together} - {None}
        if len(given) > 1:
            findings.append(Finding(
                ERROR, together[-1], "hicache_l3_namespace_share_pct", "l3-budget-share",
                f"the servers of namespace {name or 'off'} on tier {share} ({compact_hosts(together)}) give it different shares "
                f"({', '.join(map(str, sorted(given)))}).", "give the servers of one namespace one share, or none."))
        if given:
            shares[name or "off"] = max(given)
    if sum(shares.values()) > 100:
        findings.append(Finding(
            ERROR, hosts[-1], "hicache_l3_namespace_share_pct", "l3-budget-share",
            f"the namespaces of tier {share} are given {sum(shares.values())}% of its budget in all "
            f"({', '.join(f'{k} {v}%' for k, v in sorted(shares.items()))}).", "give shares that add up to at most 100."))
    return findings


def check_routed(deployments: Mapping[str, Any], routers: Iterable[str] | Mapping[str, Mapping[str, Any]],
                 connections: Mapping[str, Mapping[str, Any]] | None = None) -> list[Finding]:
    """With routers in the inventory, every restart drains the server first, reading its running and queued requests
    on /metrics: a server without metrics could only be restarted blind (requests cut), so it is refused here.
    With the routers' variables (a mapping) and how each host is reached (`connections`), a router and a server
    on one machine and one port are refused too (check_router_clash)."""
    clashes = check_router_clash(deployments, routers, connections) if isinstance(routers, Mapping) else []
    routers_vars = routers if isinstance(routers, Mapping) else dict.fromkeys(routers, {})
    routers = list(routers)
    if not routers:
        return []
    findings = [Finding(ERROR, host, "hicache_enable_metrics", "router-drain-metrics",
                        f"is false, but the inventory has routers ({compact_hosts(routers)}): a restart takes the server out of them and "
                        "waits for its running and queued requests on /metrics, which it would not serve.",
                        "set hicache_enable_metrics: true.")
                for host, d in deployments.items() if d is not None and not d.enable_metrics]
    findings += [Finding(ERROR, host, "hicache_host", "router-reach",
                         f"the server listens on {d.effective_host} (loopback), which the routers ({compact_hosts(routers)}) cannot reach at "
                         "its default worker URL http://<ansible_host>:<port>.",
                         "set hicache_host: 0.0.0.0 (or an address the routers reach), or hicache_worker_url for a router on the same machine.")
                 for host, d in deployments.items()
                 if d is not None and d.worker_url is None and d.effective_host in ("127.0.0.1", "localhost", "::1")]
    return findings + _worker_urls(deployments, routers_vars, connections) + clashes


def _worker_urls(deployments: Mapping[str, Any], routers: Mapping[str, Mapping[str, Any]],
                 connections: Mapping[str, Mapping[str, Any]] | None) -> list[Finding]:
    """Where the routers reach each server (plans/router.py worker_url: hicache_worker_url, else http://<ansible_host
    or the name>:<port>). Two servers at one URL are one worker to a router: it lists one and sends the other's
    requests there. A URL on loopback reaches only a router on the server's own machine (check_fleet's machine)."""
    from hicachectl.formats.urls import is_loopback, worker_url

    urls: dict[str, list[str]] = {}
    findings = []
    # Routers surely elsewhere: reached at an address that is not loopback (a router reached on loopback, or locally,
    # may be this machine, as a server on loopback may be: a tunnel or port forward can hide either).
    remote = {r: _reached_at(r, v or {}, connections) for r, v in routers.items()}
    remote = {r: m for r, m in remote.items() if m[1] and not is_loopback(m[0])}
    for host, d in deployments.items():
        if d is None:
            continue
        connection = (connections or {}).get(host) or {}
        try:
            url = worker_url(d.worker_url, connection.get("ansible_host") or host, d.effective_port)
        except ValueError as exc:
            if not d.worker_url:  # hicache_worker_url's own form is the variable rules' to refuse
                findings.append(Finding(
                    ERROR, host, "ansible_host", "router-reach",
                    f"the routers would reach the server at its default worker URL, which cannot be made from this address: {exc}.",
                    "set hicache_worker_url to a URL the routers reach (http://ADDRESS:PORT)."))
            continue
        urls.setdefault(url, []).append(host)
        others = sorted(r for r, m in remote.items() if m != _reached_at(host, {}, connections))
        if d.worker_url and is_loopback(urllib.parse.urlsplit(url).hostname or "", unspecified=True) and others:
            findings.append(Finding(
                ERROR, host, "hicache_worker_url", "router-reach",
                f"is {url}, on loopback: only a router on this server's own machine reaches it, not {compact_hosts(others)}.",
                "set hicache_worker_url to an address the routers reach (or leave it unset: http://<ansible_host>:<port>)."))
    for url, names in urls.items():
        if len(names) > 1:
            findings += [Finding(
                ERROR, host, "hicache_worker_url", "worker-url-shared",
                f"{len(names)} servers ({compact_hosts(names)}) are all reached by the routers at {url}: a router lists one worker "
                "for them and sends every request to that one.",
                f"give each of {compact_hosts(names)} its own address or port (ansible_host, hicache_port) or its own hicache_worker_url.")
                for host in names]
    return findings


# The router's ports when its host does not set them: hicache_router_port and hicache_router_prometheus_port's
# defaults in the catalogue (hicachectl/config/schema.py).
def _router_ports(variables: Mapping[str, Any]) -> dict[int, str]:
    from hicachectl.config import schema

    defaults = {v.name: v.default for v in schema.VARIABLES if v.name in ("hicache_router_port", "hicache_router_prometheus_port")}
    ports: dict[int, str] = {}
    for name in ("hicache_router_port", "hicache_router_prometheus_port"):
        value = variables.get(name, defaults.get(name))
        try:
            ports.setdefault(int(value), name)
        except (TypeError, ValueError):
            continue  # a bad port is the variable rules' finding
    return ports


def check_router_clash(deployments: Mapping[str, Any], routers: Mapping[str, Mapping[str, Any]],
                       connections: Mapping[str, Mapping[str, Any]] | None = None) -> list[Finding]:
    """A router host and a server host that are one machine cannot both listen on one port: the second to start fails
    to bind (sglang-router's --port/--prometheus-port, SGLang's --port). Refused on the router host, naming the server.
    One machine is what check_fleet calls one: the same address and SSH port (or both local). Two SSH ports on one
    address are two machines behind one address (containers, VMs, a NAT), each binding its own ports (#34)."""
    servers: dict[str, list[tuple[str, int]]] = {}
    for host, d in deployments.items():
        if d is not None:
            servers.setdefault(_reached_at(host, {}, connections), []).append((host, int(d.effective_port)))
    findings = []
    for router_host, variables in routers.items():
        ports = _router_ports(variables or {})
        for server, port in servers.get(_reached_at(router_host, variables or {}, connections), []):
            if port in ports:
                findings.append(Finding(
                    ERROR, router_host, ports[port], "router-server-port",
                    f"is {port}, the port the server {server} on the same machine listens on: whichever starts second cannot bind it.",
                    f"give the router another {ports[port]} (or the server another hicache_port), or put them on different machines."))
    return findings
