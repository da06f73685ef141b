"""Judge what `hicachectl status` read on a host: pure, so every verdict is tested without a host.

A server is fine only when its unit is active, /health answers 200, the config it started with
(deployed.json, written once it was healthy) is the inventory's, and /server_info agrees with the inventory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hicachectl import rolling, verify

CURRENT, PENDING, OTHER, NONE = "current", "pending restart", "not the inventory's", "not deployed"
# status's exit codes (hicachectl.cli.CHECK_EXIT_CODES): every server fine; one is not; one could not be read.
EXIT_OK, EXIT_NOT_FINE, EXIT_NOT_READ = 0, 1, 2
HEADERS = ("host", "unit", "since", "image", "config", "health", "problem")


def config_state(deployed: Mapping[str, Any], installed: Mapping[str, Any], wanted: str) -> str:
    if not deployed and not installed:
        return NONE
    if deployed.get("config_hash") == wanted:
        return CURRENT
    if installed.get("config_hash") == wanted:
        return PENDING  # the inventory's files are in place, but the server has not restarted with them
    return OTHER


def judge(d, state: Mapping[str, Any]) -> dict[str, Any]:
    """One host's verdict: {"ok", "config", "healthy", "problems": [why it is not fine, one phrase each]}."""
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
    return {"ok": not problems, "config": config, "healthy": health == 200, "unit": unit, "problems": problems}


def judge_hosts(deployments: Mapping[str, Any], states: Mapping[str, Mapping[str, Any]], unread: Mapping[str, str]) -> dict[str, Any]:
    """Every server's verdict, by host name: `states` what status.yml read on the hosts it could read, `unread` why
    each other host could not be read. {"exit_code": 2 when a host could not be read, else 1 when a server is not
    fine, else 0; "hosts": each host's --json entry; "rows": the table under HEADERS}."""
    hosts, rows = {}, []
    for host in sorted(deployments):
        if host not in states:
            reason = unread[host]
            hosts[host] = {"ok": False, "error": reason}
            rows.append([host, "?", "", "", "", "", reason])
            continue
        state = states[host]
        verdict = judge(deployments[host], state)
        hosts[host] = {**state, **verdict, "current": verdict["config"] == CURRENT}
        rows.append(_row(host, state, verdict))
    if any(host not in states for host in hosts):
        code = EXIT_NOT_READ
    else:
        code = EXIT_OK if all(entry["ok"] for entry in hosts.values()) else EXIT_NOT_FINE
    return {"exit_code": code, "hosts": hosts, "rows": rows}


def _row(host: str, state: Mapping[str, Any], verdict: Mapping[str, Any]) -> list[str]:
    problems = "; ".join(verdict["problems"])
    if verdict["config"] == NONE:
        return [host, "not deployed", "", "", "", "", problems]
    deployed = state["deployed"] or {}
    health = "ok" if verdict["healthy"] else ("down" if int(state["health"] or -1) <= 0 else str(state["health"]))
    return [host, state["unit"], state["since"], deployed.get("image", "-"), f"{deployed.get('config_hash') or '-'} ({verdict['config']})",
            health, problems]
