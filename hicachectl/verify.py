"""What `hicachectl verify` asks each server, and what it concludes from the answers.

The playbook (playbooks/verify.yml) gathers on each host; `judge` turns the answers into checks,
each failure with its likely cause. Pure, so every conclusion is tested without a server.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from hicachectl import metrics, prompts, render

# Three outcomes: a check that could not be made is "not checked", never a pass; where it was asked for, it fails.
PASS, FAIL, NOT_CHECKED = "pass", "fail", "not checked"
L3_PAGES = 4  # pages the persistence proof writes; more than one, so a partial write shows


def plan(d, salt: str) -> dict[str, Any]:
    """URLs, requests and thresholds for one host (what the playbook sends)."""
    page = d.page_size or 1
    words = max(L3_PAGES * page + page // 2, 256)
    return {
        "base_url": f"http://{d.local_host}:{d.effective_port}",
        "unit": render.unit_name(d),
        "health_timeout": d.health_timeout,
        "probe": prompts.chat_request(d.served_name, prompts.prompt(f"hicache-verify-probe-{salt}", 32)),
        "l3_probe": prompts.chat_request(d.served_name, prompts.prompt(f"hicache-verify-l3-{salt}", words)),
        "l3_min_tokens": page,  # at least one whole page must reach L3
        "l3_backend": d.storage_backend,
        "write_timeout": 120,
        "request_timeout": max(600, math.ceil(words / 100)),
    }


def _check(name: str, status: str, detail: str, cause: str = "") -> dict[str, str]:
    return {"check": name, "status": status, "detail": detail, "cause": cause}


def _status(result: Mapping[str, Any] | None) -> int:
    return int((result or {}).get("status", -1) or -1)


def _json(result: Mapping[str, Any] | None) -> Any:
    return (result or {}).get("json") or {}


def _usage(result) -> dict:
    return _json(result).get("usage") or {} if isinstance(_json(result), dict) else {}


def server_drift(d, info: Mapping[str, Any]) -> list[str]:
    """What the running server (its /server_info) does differently from the inventory, one phrase each."""
    return [f"{what} {info[field]} (inventory: {want_value})" for field, what, want_value in
            (("page_size", "page size", d.page_size), ("hicache_write_policy", "write policy", d.write_policy),
             ("hicache_storage_backend", "storage backend", d.storage_backend), ("served_model_name", "served model name", d.served_name))
            if want_value is not None and field in info and info[field] != want_value]


def endpoint_checks(d, obs: Mapping[str, Any]) -> list[dict[str, str]]:
    unit = d.service_name
    checks = []
    health = _status(obs.get("health"))
    if health <= 0:
        return [_check("/health", FAIL, f"nothing answers at {obs.get('health', {}).get('url', 'the server port')}",
                       f"the server is not running: `hicachectl status`, `journalctl -u {unit}` on the host."),
                _check("endpoints", NOT_CHECKED, "no server to ask")]
    checks.append(_check("/health", PASS, "200: a 1-token generation works") if health == 200 else
                  _check("/health", FAIL, f"answered {health}",
                         f"the server is down or still loading; `journalctl -u {unit}` on the host, `hicachectl status`."))
    data = _json(obs.get("models"))
    served = [m.get("id") for m in data.get("data", [])] if isinstance(data, dict) else []
    want = d.served_name
    checks.append(_check("/v1/models", PASS, f"serves {want}") if want in served else
                  _check("/v1/models", FAIL, f"serves {served or 'nothing'}, the inventory says {want}",
                         "the running server is not the inventory's: deploy, or look for another server on the port."))
    info = _json(obs.get("info"))
    if isinstance(info, dict) and info:
        drift = server_drift(d, info)
        checks.append(_check("server config", FAIL, "the server runs " + ", ".join(drift),
                             "the running server is not the inventory's (start.sh changed on the host, or not restarted): "
                             "`hicachectl deploy`.") if drift else
                      _check("server config", PASS, "page size, write policy and storage backend as the inventory sets them"))
    chat, usage = obs.get("chat"), _usage(obs.get("chat"))
    if _status(chat) != 200:
        checks.append(_check("chat completion", FAIL, f"answered {_status(chat)}", f"see `journalctl -u {unit}` on the host."))
    else:
        checks.append(_check("chat completion", PASS, f"{usage.get('prompt_tokens', '?')} prompt tokens, 1 generated"))
        if "cached_tokens" in (usage.get("prompt_tokens_details") or {}):
            checks.append(_check("cache report", PASS, "usage.prompt_tokens_details.cached_tokens present"))
        else:
            checks.append(_check("cache report", FAIL, "no usage.prompt_tokens_details.cached_tokens",
                                 "--enable-cache-report is off: set hicache_enable_cache_report: true and deploy."))
    text = (obs.get("metrics") or {}).get("content") or ""
    if _status(obs.get("metrics")) == 200 and "sglang:" in text:
        checks.append(_check("/metrics", PASS, "sglang:* metrics served"))
    else:
        checks.append(_check("/metrics", FAIL, f"answered {_status(obs.get('metrics'))}",
                             "--enable-metrics is off: set hicache_enable_metrics: true and deploy."))
    return checks


def _keys_changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    changes = []
    for field, what in (("page_size", "page size"), ("served_model_name", "served model name")):
        if field in before and field in after and before[field] != after[field]:
            changes.append(f"{what} {before[field]} -> {after[field]}")
    return changes


def l3_checks(d, obs: Mapping[str, Any]) -> list[dict[str, str]]:
    """The persistence proof: a long prompt written to L3, the server restarted, the prompt hitting L3."""
    if d.storage_backend is None:
        return [_check("L3 write", FAIL, "no L3 tier configured", "set hicache_storage_backend (file, nixl or dynamic).")]
    if obs.get("restart_skipped"):
        return [_check("L3 persistence", FAIL, f"not proven: {obs['restart_skipped']}",
                       "--l3 asked for the proof on every host; fix the failed batch and run `hicachectl verify --l3` again.")]
    page = d.page_size or 1
    fill = obs.get("fill")
    written = metrics.delta((obs.get("fill_metrics") or {}).get("content"), (obs.get("before_metrics") or {}).get("content"),
                            lambda t: metrics.total(t, metrics.BACKUPED))
    prompt_tokens = _usage(fill).get("prompt_tokens", 0)
    checks = []
    if _status(fill) != 200:
        return [_check("L3 write", FAIL, f"the long prompt was answered {_status(fill)}", f"see `journalctl -u {d.service_name}`.")]
    policy = _json(obs.get("info_before")).get("hicache_write_policy") or d.write_policy  # what the server runs
    if written is not None and written >= page:
        checks.append(_check("L3 write", PASS, f"{written:.0f} of {prompt_tokens} prompt tokens written to L3"))
    else:
        if written is None:
            cause = "the server reports no sglang:backuped_tokens_total: the storage backend did not start (server log) or metrics are off."
        elif policy == "write_back":
            cause = "hicache_write_policy write_back writes a page to L3 only when the host pool evicts it, so nothing is on L3 yet; use write_through."
        elif policy == "write_through_selective":
            cause = "write_through_selective writes a page only after 2 hits; use write_through to prove persistence."
        elif prompt_tokens < page:
            cause = f"the prompt ({prompt_tokens} tokens) is shorter than a page ({page})."
        else:
            cause = "nothing reached L3 in time: look for storage errors in the server log and check the L3 mount (verify's host checks)."
        checks.append(_check("L3 write", FAIL, f"{0 if written is None else written:.0f} tokens written for a {prompt_tokens}-token prompt", cause))
        return checks
    if obs.get("restart_failed"):
        return checks + [_check("restart", FAIL, obs["restart_failed"], f"`journalctl -u {d.service_name}` on the host.")]
    checks.append(_check("restart", PASS, "server restarted and healthy: host and device caches are empty"))
    reuse = obs.get("reuse")
    before, after = (obs.get("reuse_metrics_before") or {}).get("content"), (obs.get("reuse_metrics") or {}).get("content")
    hits = metrics.delta(after, before, metrics.storage_hits)
    cached = (_usage(reuse).get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    if _status(reuse) == 200 and (hits or 0) > 0 and cached > 0:
        return checks + [_check("L3 hit after restart", PASS, f"{cached} of {_usage(reuse).get('prompt_tokens')} prompt tokens cached, "
                                                              f"{hits:.0f} loaded from storage")]
    keys = _keys_changed(_json(obs.get("info_before")), _json(obs.get("info_after")))
    dropped = metrics.delta(after, before, lambda t: metrics.total(t, metrics.BACKUP_DROPPED)) or 0
    unfulfilled = metrics.delta(after, before, lambda t: metrics.total(t, metrics.PREFETCH_UNFULFILLED)) or 0
    if keys:
        cause = f"the server came back with a different {' and '.join(keys)}: both are part of every L3 key, so the keys differ and nothing can hit. Deploy the inventory's config (start.sh changed on disk?)."
    elif _status(reuse) != 200:
        cause = f"the request after the restart failed ({_status(reuse)}); see `journalctl -u {d.service_name}`."
    elif dropped > 0:
        cause = f"{dropped:.0f} tokens were dropped from the host pool: it is too small to stage the pages; raise hicache_size_gb (see `hicachectl size`)."
    elif unfulfilled > 0:
        cause = f"{unfulfilled:.0f} tokens were not prefetched in time (prefetch policy {d.prefetch_policy or 'best_effort'}): L3 reads are too slow or the host pool too small."
    else:
        cause = "the pages written before the restart were not found: is the L3 directory the same mount after the restart, and the backend's namespace unchanged?"
    return checks + [_check("L3 hit after restart", FAIL, f"{cached} cached tokens, {hits or 0:.0f} loaded from storage", cause)]


def judge(d, obs: Mapping[str, Any], l3: bool) -> dict[str, Any]:
    checks = [_check(f["item"], FAIL, f["detail"], "the host differs from the inventory: `hicachectl deploy` (or `plan` to see what).")
              for f in obs.get("host_failures", [])]
    checks += endpoint_checks(d, obs)
    if l3 and _status(obs.get("health")) > 0:
        checks += l3_checks(d, obs)
    return {"ok": all(c["status"] != FAIL for c in checks), "checks": checks}
