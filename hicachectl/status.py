"""Judge what `hicachectl status` read on a host: pure, so every verdict is tested without a host.

A server is fine only when its unit is active, /health answers 200, the config it started with
(deployed.json, written once it was healthy) is the inventory's, and /server_info agrees with the inventory.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from hicachectl import verify

CURRENT, PENDING, OTHER, NONE = "current", "pending restart", "not the inventory's", "not deployed"


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
    if config == NONE:
        problems.append(f"not deployed: no config in {d.cfg_dir} (`hicachectl deploy`)")
    elif config == PENDING:
        problems.append(f"pending restart: {d.cfg_dir} holds the inventory's config {state['wanted_config_hash']}, the server was started with "
                        f"{deployed.get('config_hash', 'none')} (`hicachectl restart`)")
    elif config == OTHER:
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
