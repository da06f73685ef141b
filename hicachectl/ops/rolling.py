"""What a rollout does across the fleet. Pure: no I/O.

A server's restart behind the inventory's routers (issue #12): which routers to take it out of, at which
URL, how to tell that it has finished its requests, and how long to wait for that. Whether the inventory's image
is a downgrade of what a server runs, and which host downloads a model directory several hosts share (issue #24).

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

from hicachectl import rules
from hicachectl.config.deployment import Deployment, version_tuple
from hicachectl.ops import metrics
from hicachectl.plans import model, router, sglang_image

# SGLang's scheduler gauges (python/sglang/srt/observability/metrics_collector.py): requests being run and
# requests waiting for the GPU. Every rank's series counts: a drained server has none anywhere.
IN_FLIGHT = ("sglang:num_running_reqs", "sglang:num_queue_reqs")


def in_flight(text: str | None) -> float | None:
    """Requests the server is running or holds in its queue, summed over every series (all TP/DP ranks);
    None when the /metrics text has neither gauge (metrics off, or not SGLang's)."""
    found = [value for name, _, value in metrics.parse(text or "") if name in IN_FLIGHT]
    return sum(found) if found else None


def _router(host: str, variables: Mapping[str, Any]) -> dict[str, str]:
    """A router as a restart asks it: its host, its API as the router host reaches it, and its unit (there once the
    router role has run: a router without it is not deployed yet, and its refusal is no news)."""
    d, findings = router.check_router_host(host, variables)
    errors = [f.format() for f in findings if f.level == rules.ERROR]
    if errors or d is None:
        raise ValueError(f"router {host}: invalid variables: " + "; ".join(errors))
    return {"host": host, "url": router.base_url(d), "unit": router.unit_path(d)}


def plan(d: Deployment, host: str, hostvars: Mapping[str, Any], all_hostvars: Mapping[str, Mapping[str, Any]], routers: Iterable[str]) -> dict[str, Any]:
    """What a restart of the server `host` (its Deployment `d`, its host variables `hostvars`) does around the routers
    `routers` (the hosts of group hicache_routers, each with its variables in `all_hostvars`). The router URL is as
    the router host reaches its own API (the module runs there)."""
    routers = list(routers)
    base = f"http://{d.local_host}:{d.effective_port}"
    return {
        "routers": [_router(name, all_hostvars[name]) for name in routers],
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


# --- what a rollout changes: the image the inventory pins against the one a server runs (issue #24) ----------------

def same_image(a: str, b: str) -> bool:
    """Whether two references name the same image, however a runtime or a user spells them (sglang_image.qualify)."""
    return sglang_image.qualify(a) == sglang_image.qualify(b)


def downgrade(d: Deployment, running: Mapping[str, Any] | None) -> str:
    """Why rolling the inventory's image out would be a downgrade of what the server runs now: the SGLang version of
    its image (hicache_sglang_version, else read from the tag) is older than the one in `running`, the record the
    server started with (deployed.json, roles/sglang_server/tasks/restart.yml writes it once healthy). '' when it is
    not older, or when either version is unknown (a digest-only image, no server yet): no claim without a version."""
    if not isinstance(running, Mapping):
        return ""
    was, now = running.get("sglang_version"), d.sglang_version
    try:
        older = bool(was and now) and version_tuple(str(now)) < version_tuple(str(was))
    except ValueError:  # not X.Y.Z: no order to judge
        return ""
    if not older:
        return ""
    return (f"the server runs SGLang {was} (image {running.get('image', 'unknown')}) and the inventory pins the older {now} "
            f"(hicache_image {d.image}): a downgrade")


# --- one download per shared model directory (issue #24, item 7) ----------------------------------------------------
# The lock's file, in the shared directory itself (its parent may be another host's own disk); the model role takes it
# with hicache_lock, and plugins/modules/hicache_model_stamp.py neither lists it among the model's files nor empties it.
DOWNLOAD_LOCK = model.DOWNLOAD_LOCK


def _download_key(d: Deployment) -> tuple:
    return d.model_share, d.model_dir


def model_download(host: str, deployments: Mapping[str, Any], play_hosts: Iterable[str]) -> dict[str, Any]:
    """Who downloads the hub model of `host` (its Deployment in `deployments`, with those of the other hosts of the run,
    `play_hosts`). Without hicache_model_share every host downloads its own. With it, the hosts of the run that give
    the same share and hicache_model_dir download once: the first of them by name (so `plan` can say who, and the
    same host every time), under the lock DOWNLOAD_LOCK in that directory (another run, another inventory); the others
    wait up to hicache_model_share_wait seconds for its stamp. Hosts sharing a directory must want the same download
    (repository and revision): else each would empty it for its own, a ValueError naming them."""
    from hicachectl.rules.output import compact_hosts

    d = deployments[host]
    own = {"shared": False, "share": None, "downloader": host, "waits": False, "sharing": [host], "lock": None,
           "wait": int(d.model_share_wait), "text": ""}
    if d.model_source != "hub" or not d.model_share:
        return own
    sharing = sorted(name for name in dict.fromkeys(play_hosts) if name in deployments and deployments[name] is not None
                     and deployments[name].model_source == "hub" and _download_key(deployments[name]) == _download_key(d))
    sharing = sharing or [host]
    other = [name for name in sharing if (deployments[name].model_repo, deployments[name].model_revision or None) != (d.model_repo, d.model_revision or None)]
    if other:
        raise ValueError(f"{host} and {compact_hosts(other)} share {d.model_dir} (hicache_model_share {d.model_share}) but want other downloads "
                         f"(hicache_model_repo / hicache_model_revision): give them the same model, or each its own hicache_model_dir")
    downloader = sharing[0]
    text = (f"{downloader} downloads {d.model_repo} into {d.model_dir} for the {len(sharing)} host(s) {compact_hosts(sharing)} sharing it "
            f"({d.model_share}), under the lock {d.model_dir}/{DOWNLOAD_LOCK}; " +
            ("the others wait for its stamp" if len(sharing) > 1 else "no other host of this run shares it"))
    return {"shared": True, "share": d.model_share, "downloader": downloader, "waits": host != downloader, "sharing": sharing,
            "lock": f"{d.model_dir}/{DOWNLOAD_LOCK}", "wait": int(d.model_share_wait), "text": text}
