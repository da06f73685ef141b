"""Judge what `hicachectl status` read on a host: pure, so every verdict is tested without a host.

A server is fine only when its unit is active, /health answers 200, the config it started with
(deployed.json, written once it was healthy) is the inventory's, /server_info agrees with the inventory, and
the inventory's L3 backend is still attached (GET /hicache/storage-backend: a runtime detach shows nowhere else;
verify.storage_backend_check, whose "not checked" is said under the table, never counted as fine or not).

A router (group hicache_routers) is fine when its unit is active, the router package the inventory pins is the one
in its virtualenv, /health answers 200, and GET /workers lists every inventory server healthy and nothing else.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hicachectl.config.deployment import Deployment
from hicachectl.ops import rolling, verify
from hicachectl.plans import router

CURRENT, PENDING, OTHER, NONE = "current", "pending restart", "not the inventory's", "not deployed"
ROUTER = "router"  # the `role` of a router's --json entry
# status's exit codes (hicachectl.cli.main.CHECK_EXIT_CODES): every host fine; one is not; one could not be read.
EXIT_OK, EXIT_NOT_FINE, EXIT_NOT_READ = 0, 1, 2
# A router's row has the same columns: image is the router package and version, config its workers.
HEADERS = ("host", "unit", "since", "image", "config", "health", "problem")


def config_state(deployed: Mapping[str, Any], installed: Mapping[str, Any], wanted: str) -> str:
    if not deployed and not installed:
        return NONE
    if deployed.get("config_hash") == wanted:
        return CURRENT
    if installed.get("config_hash") == wanted:
        return PENDING  # the inventory's files are in place, but the server has not restarted with them
    return OTHER


def judge(d: Deployment, state: Mapping[str, Any]) -> dict[str, Any]:
    """One server's verdict: {"ok", "config", "healthy", "unit", "l3_backend": verify.storage_backend_check's check
    (None: no backend to check), "problems": [why it is not fine, one phrase each]}."""
    deployed, installed = state.get("deployed") or {}, state.get("installed") or {}
    config = config_state(deployed, installed, state["wanted_config_hash"])
    health = int(state.get("health") or -1)
    unit = state.get("unit") or "unknown"
    problems = []
    # The image is part of what "current" means: with runtime none it is in no launch file, so not in the hash.
    running_image = deployed.get("image")
    if config == CURRENT and running_image and d.image and not rolling.same_image(running_image, d.image):
        config = OTHER
        problems.append(f"runs image {running_image}, not the inventory's {d.image} (`hicachectl upgrade`, or `deploy`)")
    if config == NONE:
        problems.append(f"not deployed: no config in {d.cfg_dir} (`hicachectl deploy`)")
    elif config == PENDING:
        problems.append(f"pending restart: {d.cfg_dir} holds the inventory's config {state['wanted_config_hash']}, the server was started with "
                        f"{deployed.get('config_hash', 'none')} (`hicachectl restart`)")
    elif config == OTHER and not problems:
        problems.append(f"runs config {deployed.get('config_hash', 'none')}, not the inventory's {state['wanted_config_hash']} (`hicachectl deploy`)")
    if config != NONE and unit != "active":
        problems.append(f"unit {d.service_name} is {unit}")
    if config != NONE and health != 200:
        problems.append("nothing answers /health" if health <= 0 else f"/health answered {health}")
    info = state.get("server_info") or {}
    drift = verify.server_drift(d, info) if isinstance(info, Mapping) and health == 200 else []
    if drift:
        problems.append("the server runs " + ", ".join(drift))
    backend = None
    if config != NONE:
        backend = (verify.storage_backend_check(d, state.get("storage_backend"), info if isinstance(info, Mapping) else None) if health == 200
                   else {"check": verify.L3_BACKEND, "status": verify.NOT_CHECKED, "detail": "no server to ask", "cause": ""} if d.storage_backend else None)
    if backend and backend["status"] == verify.FAIL:
        problems.append(f"{backend['detail']} ({backend['cause'].rstrip('.')})")
    return {"ok": not problems, "config": config, "healthy": health == 200, "unit": unit, "l3_backend": backend, "problems": problems}


# --- routers ----------------------------------------------------------------------------------------------

def _status(answer: Mapping[str, Any] | None) -> int:
    """An HTTP status Ansible's uri registered (-1: nothing answered)."""
    try:
        return int((answer or {}).get("status", -1) or -1)
    except (TypeError, ValueError):
        return -1


def _workers(state: Mapping[str, Any]) -> list[dict] | None:
    """The router's GET /workers listing (router.py: {"workers": [{"url", "is_healthy", "model_id", ...}]}), None if not one."""
    answer = state.get("workers") or {}
    body = answer.get("json") if isinstance(answer, Mapping) else None
    if _status(answer) != 200 or not isinstance(body, Mapping) or not isinstance(body.get("workers"), list):
        return None
    return [w for w in body["workers"] if isinstance(w, Mapping)]


def judge_router(state: Mapping[str, Any]) -> dict[str, Any]:
    """One router's verdict from what status.yml's router play read: {"ok", "role", "deployed", "unit", "healthy",
    "version", "workers": {"expected", "listed healthy", "missing", "unhealthy", "extra"}, "problems"}.
    `state`: package, version (in its virtualenv; "" if none), wanted_version, dir, service, unit, load_state, health,
    workers (GET /workers: status, json), worker_urls and servers (the inventory's, router.plan's order)."""
    package, service = state.get("package") or "the router", state.get("service") or "the router's unit"
    installed, wanted = str(state.get("version") or "").strip(), str(state.get("wanted_version") or "")
    unit = state.get("unit") or "unknown"
    health = _status({"status": state.get("health")})
    deployed = bool(installed) or state.get("load_state") not in (None, "", "not-found")
    expected = [router.normalize(u) for u in state.get("worker_urls") or ()]
    servers = list(state.get("servers") or ())
    names = dict(zip(expected, servers, strict=True)) if len(servers) == len(expected) else {}
    problems: list[str] = []
    workers = {"expected": len(expected), "listed healthy": 0, "missing": [], "unhealthy": [], "extra": []}
    if not deployed:
        problems.append(f"not deployed: no {package} in {state.get('dir') or 'its virtualenv'} and no unit {service} (`hicachectl deploy`)")
        return {"ok": False, "role": ROUTER, "deployed": False, "unit": unit, "healthy": False, "version": installed,
                "workers": workers, "problems": problems}
    if not installed:
        problems.append(f"no {package} in {state.get('dir') or 'its virtualenv'} (`hicachectl deploy`)")
    elif wanted and installed != wanted:
        problems.append(f"runs {package} {installed}, the inventory pins {wanted} (`hicachectl deploy`)")
    if unit != "active":
        problems.append(f"unit {service} is {unit}")
    if health != 200:
        problems.append("nothing answers /health" if health <= 0 else f"/health answered {health}")
    else:
        listed = _workers(state)
        if listed is None:
            problems.append(f"GET /workers answered {_status(state.get('workers'))}, not a worker list")
        else:
            by_url: dict[str, list[Mapping]] = {}
            for worker in listed:
                try:
                    by_url.setdefault(router.normalize(str(worker.get("url"))), []).append(worker)
                except ValueError:
                    continue  # not a URL hicache-deploy adds: left alone, as router.extra_workers does
            for url in expected:
                shown = f"{names[url]} ({url})" if url in names else url
                records = by_url.get(url) or []
                if not records:
                    workers["missing"].append(shown)
                elif not all(w.get("is_healthy") is True for w in records):
                    workers["unhealthy"].append(shown)
                else:
                    workers["listed healthy"] += 1
            workers["extra"] = sorted(set(by_url) - set(expected))
            if workers["missing"]:
                problems.append("does not list " + ", ".join(workers["missing"]) + " (`hicachectl deploy` adds the inventory's servers)")
            if workers["unhealthy"]:
                problems.append("lists " + ", ".join(workers["unhealthy"]) + " unhealthy (`hicachectl status` of the server, its /health from the router host)")
            if workers["extra"]:
                problems.append("also sends to " + ", ".join(workers["extra"]) + ", not an inventory server (`hicachectl deploy` takes it out)")
    return {"ok": not problems, "role": ROUTER, "deployed": True, "unit": unit, "healthy": health == 200, "version": installed,
            "workers": workers, "problems": problems}


def _router_row(host: str, state: Mapping[str, Any], verdict: Mapping[str, Any]) -> list[str]:
    problems = "; ".join(verdict["problems"])
    if not verdict["deployed"]:
        return [host, "not deployed", "", "", "", "", problems]
    workers = verdict["workers"]
    listed = f"workers {workers['listed healthy']}/{workers['expected']}" if verdict["healthy"] else "workers ?"
    health = "ok" if verdict["healthy"] else ("down" if _status({"status": state.get("health")}) <= 0 else str(state.get("health")))
    return [host, verdict["unit"], state.get("since") or "", f"{state.get('package') or 'router'} {verdict['version'] or '-'}", listed,
            health, problems]


# --- every host ---------------------------------------------------------------------------------------------

def judge_hosts(deployments: Mapping[str, Any], states: Mapping[str, Mapping[str, Any]], unread: Mapping[str, str],
                routers: Iterable[str] = ()) -> dict[str, Any]:
    """Every host's verdict, by host name: the servers (`deployments`), then the routers (`routers`, router host
    names). `states` holds what status.yml read on each host it could read, `unread` why each other host could not
    be read. {"exit_code": 2 when a host could not be read, else 1 when a host is not fine, else 0; "hosts": each
    host's --json entry (a router's with role "router"); "rows": the table under HEADERS; "lines": the table, what
    was not checked, and the summary line}."""
    routers = sorted(set(routers) - set(deployments))
    hosts, rows, notes = {}, [], []
    for host in sorted(deployments):
        if host not in states:
            reason = unread[host]
            hosts[host] = {"ok": False, "error": reason}
            rows.append([host, "?", "", "", "", "", reason])
            continue
        state = states[host]
        verdict = judge(deployments[host], state)
        hosts[host] = {**state, **verdict, "current": verdict["config"] == CURRENT}  # server_info: redacted by status.yml
        rows.append(_row(host, state, verdict))
        backend = verdict["l3_backend"]
        if backend and backend["status"] == verify.NOT_CHECKED and verdict["healthy"]:
            notes.append(f"{host}: {verify.L3_BACKEND} not checked: {backend['detail']}")
    for host in routers:
        if host not in states:
            reason = unread.get(host, "not read")
            hosts[host] = {"ok": False, "role": ROUTER, "error": reason}
            rows.append([host, "?", "", "", "", "", reason])
            continue
        state = states[host]
        verdict = judge_router(state)
        hosts[host] = {**state, **verdict}
        rows.append(_router_row(host, state, verdict))
    not_read = [h for h, entry in hosts.items() if "error" in entry]
    fine = [h for h, entry in hosts.items() if entry["ok"]]
    if not_read:
        code = EXIT_NOT_READ
    else:
        code = EXIT_OK if len(fine) == len(hosts) else EXIT_NOT_FINE
    return {"exit_code": code, "hosts": hosts, "rows": rows, "lines": [_table(rows), *notes, summary(len(deployments), len(routers), len(fine),
                                                                                                     len(hosts) - len(fine) - len(not_read), len(not_read), len(notes))]}


def summary(servers: int, routers: int, fine: int, not_fine: int, not_read: int, not_checked: int = 0) -> str:
    """`status: 2 server(s) and 1 router(s): 2 fine, 1 not fine (1 check not made)`: the counts add up to the hosts."""
    parts = [f"{fine} fine"] + ([f"{not_fine} not fine"] if not_fine else []) + ([f"{not_read} not read"] if not_read else [])
    return (f"status: {servers} server(s)" + (f" and {routers} router(s)" if routers else "") + ": " + ", ".join(parts)
            + (f" ({not_checked} check(s) not made)" if not_checked else ""))


def _table(rows: list[list[str]]) -> str:
    from hicachectl.formats import report

    return report.table(HEADERS, rows)


def _row(host: str, state: Mapping[str, Any], verdict: Mapping[str, Any]) -> list[str]:
    problems = "; ".join(verdict["problems"])
    if verdict["config"] == NONE:
        return [host, "not deployed", "", "", "", "", problems]
    deployed = state["deployed"] or {}
    health = "ok" if verdict["healthy"] else ("down" if int(state["health"] or -1) <= 0 else str(state["health"]))
    return [host, state["unit"], state["since"], deployed.get("image", "-"), f"{deployed.get('config_hash') or '-'} ({verdict['config']})",
            health, problems]
