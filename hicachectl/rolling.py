"""A server's restart behind the inventory's routers (issue #12): which routers to take it out of, at which
URL, how to tell that it has finished its requests, and how long to wait for that. Pure: no I/O.

The sequence (roles/sglang_server/tasks/restart.yml, for every restart of a server: a changed config, `restart`,
`rollback`, `upgrade`): take the worker out of every router (the routers send nothing new to it), wait until its
/metrics shows no request running or queued (the requests the routers had sent it are done), restart, wait for
/health, record the config, put the worker back in every router and wait until each lists it healthy. A server
that is still busy after hicache_router_drain_timeout seconds is not restarted (a request cut mid-flight is a
failure the client sees); it is put back in the routers and the host fails, named.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hicachectl import metrics, router, rules

# SGLang's scheduler gauges (python/sglang/srt/observability/metrics_collector.py): requests being run and
# requests waiting for the GPU. Every rank's series counts: a drained server has none anywhere.
IN_FLIGHT = ("sglang:num_running_reqs", "sglang:num_queue_reqs")


def in_flight(text: str | None) -> float | None:
    """Requests the server is running or holds in its queue, summed over every series (all TP/DP ranks);
    None when the /metrics text has neither gauge (metrics off, or not SGLang's)."""
    found = [value for name, _, value in metrics.parse(text or "") if name in IN_FLIGHT]
    return sum(found) if found else None


def _router_url(host: str, variables: Mapping[str, Any]) -> str:
    d, findings = router.check_router_host(host, variables)
    errors = [f.format() for f in findings if f.level == rules.ERROR]
    if errors or d is None:
        raise ValueError(f"router {host}: invalid variables: " + "; ".join(errors))
    return router.base_url(d)


def plan(d, host: str, hostvars: Mapping[str, Any], all_hostvars: Mapping[str, Mapping[str, Any]], routers: Iterable[str]) -> dict[str, Any]:
    """What a restart of the server `host` (its Deployment `d`, its host variables `hostvars`) does around the routers
    `routers` (the hosts of group hicache_routers, each with its variables in `all_hostvars`). The router URL is as
    the router host reaches its own API (the module runs there)."""
    routers = list(routers)
    base = f"http://{d.local_host}:{d.effective_port}"
    return {
        "routers": [{"host": name, "url": _router_url(name, all_hostvars[name])} for name in routers],
        "worker_url": router.worker_url(host, hostvars) if routers else None,
        "metrics_url": base + "/metrics",
        "drain_timeout": int(d.router_drain_timeout),
        # /metrics is the only way to see the server's requests; without it a drain cannot be checked, so the
        # server is not taken out (nor restarted) rather than restarted blind.
        "cannot_drain": "" if d.enable_metrics or not routers else
        (f"{host} has hicache_enable_metrics false: its running and queued requests cannot be read, so it cannot be "
         "drained before its restart; set hicache_enable_metrics true"),
        "worker_timeout": 120,
    }
