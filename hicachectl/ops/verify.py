"""What `hicachectl verify` asks each server, and what it concludes from the answers.

The playbook (playbooks/verify.yml) gathers on each host; `judge` turns the answers into checks,
each failure with its likely cause. Pure, so every conclusion is tested without a server.

The L3 proof (`--l3`): a long prompt, new to every server, is written to L3 by a *writer*, the server is
restarted (its device and host pools start empty), and the same prompt sent to it must be answered from
L3. A host alone is its own writer. Hosts that share one L3 tier (the same `hicache_l3_share`) and serve one
model prove the sharing: sorted by name, each host's writer is the one before it (the first's is the last), so
every server reads pages another server wrote, and every server writes pages another reads (ring_key: a tier
that holds several models has one ring per model).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

# Three outcomes: a check that could not be made is "not checked", never a pass; where it was asked for, it fails.
from hicachectl.config import namespace, secrets
from hicachectl.config.deployment import Deployment, uses_uring
from hicachectl.formats import prompts
from hicachectl.ops import bench, metrics
from hicachectl.plans import sglang_server

PASS, FAIL, NOT_CHECKED = "pass", "fail", "not checked"
L3_PAGES = 4  # pages the persistence proof writes; more than one, so a partial write shows
# /server_info fields (SGLang returns its ServerArgs) that change the pages a server writes or the keys it reads,
# with the words namespace.COMPONENTS uses for them.
PAGE_FORMAT_INFO = (("served_model_name", "model"), ("revision", "model revision"), ("page_size", "page size"),
                    ("kv_cache_dtype", "KV dtype"), ("tp_size", "TP size"), ("pp_size", "PP size"),
                    ("hicache_mem_layout", "memory layout"), ("hicache_storage_backend", "backend"))


def ring_key(d: Deployment) -> tuple[str, str] | None:
    """The ring of the L3 proof a server (its Deployment) belongs to: its hicache_l3_share and the model it serves
    (hicache_model_repo, else hicache_model_path). Servers of one tier that serve other models write other pages on
    purpose (a shared tier holds several models), so each model's servers prove the sharing among themselves; servers
    of one model that differ in anything else stay in one ring, and the proof names the difference. None: no share."""
    if not d.l3_share:
        return None
    return (str(d.l3_share), str(d.model_repo or d.model_path or ""))


def writers(shares: Mapping[str, Any]) -> dict[str, str]:
    """Each host's writer in the L3 proof, from each host's ring (ring_key: its hicache_l3_share and model; the hosts of
    the play only).

    Hosts of one ring, sorted by name, form a ring: host i's writer is host i-1, the first's the last.
    A host without a share, or alone in its ring among the hosts of the play, is its own writer.
    """
    groups: dict[str, list[str]] = {}
    for host, share in shares.items():
        if share:
            groups.setdefault(share, []).append(host)
    ring = {host: host for host in shares}
    for hosts in groups.values():
        hosts.sort()
        ring.update({host: hosts[i - 1] for i, host in enumerate(hosts)})
    return ring


# SGLang's runtime attach/detach of the L3 backend (python/sglang/srt/entrypoints/http_server.py: 0.5.21 lines 1085-1161,
# 0.5.23 lines 1123-1199; added by sgl-project/sglang#15892, so older servers answer 404): PUT attaches, DELETE detaches,
# GET answers what is attached now, the tokenizer's view {"hicache_storage_backend", "hicache_storage_backend_extra_config",
# "hicache_storage_prefetch_policy", "hicache_write_policy"} (null once detached: managers/tokenizer_control_mixin.py
# detach_hicache_storage); /server_info keeps the values the server started with. All three answer 400 {"error": "This
# endpoint requires admin API key, ..."} (_admin_api_key_missing_response) on a server started without --admin-api-key;
# with one they need `Authorization: Bearer <admin key>` (utils/auth.py, AuthLevel.ADMIN_OPTIONAL; 401 otherwise).
STORAGE_BACKEND_PATH = "/hicache/storage-backend"
ADMIN_KEY_FLAG = "--admin-api-key"
_NO_ADMIN_KEY = "requires admin API key"  # in SGLang's 400 answer without --admin-api-key
L3_BACKEND = "L3 backend"  # the check's name


def admin_api_key(d: Deployment) -> str | None:
    """The server's --admin-api-key: hicache_admin_api_key (validate refuses the flag in hicache_extra_args)."""
    return d.admin_api_key


def storage_backend_request(d: Deployment) -> dict[str, Any]:
    """GET /hicache/storage-backend as the server's own host asks it: its URL and headers (the admin key, when the
    server has one: send them under no_log)."""
    key = admin_api_key(d)
    return {"url": f"http://{d.local_host}:{d.effective_port}{STORAGE_BACKEND_PATH}",
            "headers": secrets.bearer(key)}


def storage_backend_check(d: Deployment, answer: Mapping[str, Any] | None, info: Mapping[str, Any] | None = None) -> dict[str, str] | None:
    """Whether the inventory's L3 backend is attached now (a runtime detach shows only in GET /hicache/storage-backend),
    from that GET's answer (`answer` None: it was not asked) and /server_info (`info`, what the server started with).
    None when there is nothing to check: no backend in the inventory and none reported attached."""
    want, code, body = d.storage_backend, _status(answer), _json(answer)
    fix = "`hicachectl restart` starts the server with the inventory's backend (or attach it again: PUT /hicache/storage-backend)"
    if code == 200 and isinstance(body, dict) and "hicache_storage_backend" in body:
        attached = body.get("hicache_storage_backend")
        if want is None:
            return None if not attached else _check(L3_BACKEND, FAIL, f"{attached} attached at runtime; the inventory sets no hicache_storage_backend",
                                                    "`hicachectl restart` starts the server without it (or DELETE /hicache/storage-backend).")
        if not attached:
            return _check(L3_BACKEND, FAIL, f"no storage backend attached: {want} was detached at runtime (GET {STORAGE_BACKEND_PATH})",
                          f"the server reads and writes no L3 page until it is attached again: {fix}.")
        if attached != want:
            return _check(L3_BACKEND, FAIL, f"{attached} attached at runtime, the inventory says {want} (GET {STORAGE_BACKEND_PATH})", fix + ".")
        drift = [f"{what} {body[field]} (inventory: {wanted})" for field, what, wanted in
                 (("hicache_write_policy", "write policy", write_policy(d)),
                  ("hicache_storage_prefetch_policy", "prefetch policy", prefetch_policy(d)))
                 if body.get(field) not in (None, wanted)]
        if "hicache_storage_backend_extra_config" in body and not _same_extra_config(d, body.get("hicache_storage_backend_extra_config")):
            drift.append("another backend config than the inventory's (its hicache_extra_config)")
        if drift:
            return _check(L3_BACKEND, FAIL, f"{want} attached, set at runtime to " + ", ".join(drift), fix + ".")
        return _check(L3_BACKEND, PASS, f"{want} attached (GET {STORAGE_BACKEND_PATH})")
    if want is None:
        return None
    if answer is None:
        return _check(L3_BACKEND, NOT_CHECKED, f"GET {STORAGE_BACKEND_PATH} was not asked")
    if code == 404:
        return _check(L3_BACKEND, NOT_CHECKED, f"the server has no GET {STORAGE_BACKEND_PATH} (SGLang before its runtime attach/detach, "
                      "sgl-project/sglang#15892): a runtime detach would not show")
    if code == 400 and _NO_ADMIN_KEY in str((body.get("error") if isinstance(body, dict) else None) or (answer or {}).get("content") or ""):
        # SGLang refuses DELETE /hicache/storage-backend for the same reason: the backend it started with stays attached.
        started = info.get("hicache_storage_backend") if isinstance(info, Mapping) else None
        why = f"the server runs without {ADMIN_KEY_FLAG}, so SGLang refuses a runtime detach (DELETE {STORAGE_BACKEND_PATH}) as it refuses this GET"
        if started == want:
            return _check(L3_BACKEND, PASS, f"{want} attached since the start: {why}")
        if started:
            return _check(L3_BACKEND, FAIL, f"the server started with {started}, not the inventory's {want}; {why}", "`hicachectl deploy`.")
        return _check(L3_BACKEND, NOT_CHECKED, f"{why}, but /server_info did not say which backend it started with")
    if code in (401, 403):
        given = admin_api_key(d)
        return _check(L3_BACKEND, NOT_CHECKED, f"GET {STORAGE_BACKEND_PATH} answered {code}: the server wants its admin API key"
                      + (", and refused hicache_admin_api_key" if given else "; set hicache_admin_api_key (in Ansible Vault)"))
    return _check(L3_BACKEND, NOT_CHECKED, f"GET {STORAGE_BACKEND_PATH} answered {code if code > 0 else 'nothing'}")


def _same_extra_config(d: Deployment, attached: Any) -> bool:
    """Whether the extra config GET /hicache/storage-backend reports is the one the inventory starts the server with:
    SGLang keeps the --hicache-storage-backend-extra-config text it started with (inline JSON, or @<file>), or the JSON
    of a runtime attach (tokenizer_control_mixin.py attach_hicache_storage). The role's io_uring fallback (posix_aio
    where io_uring failed on the host) is the inventory's too."""
    from hicachectl.plans import launch

    def meaning(text: Any) -> Any:
        if not isinstance(text, str) or not text or text.startswith("@"):
            return text or None
        try:
            return json.loads(text)
        except ValueError:
            return text

    wanted = {json.dumps(meaning(launch.extra_config_arg(config)), sort_keys=True)
              for config in (d, launch.uring_fallback(d) if uses_uring(d) else d)}
    return json.dumps(meaning(attached), sort_keys=True) in wanted


def detached(check: Mapping[str, Any] | None) -> bool:
    """Whether a storage_backend_check found the inventory's backend detached at runtime."""
    return bool(check) and check["status"] == FAIL and check["detail"].startswith("no storage backend attached")


def plan(d: Deployment, salt: str, writer=None) -> dict[str, Any]:
    """URLs, requests and thresholds for one host (what the playbook sends). `writer` is the Deployment of
    the host whose server writes this host's proof prompt to the shared L3 (None or `d`: this host's own)."""
    writer = writer or d
    pages = max(d.page_size or 1, writer.page_size or 1)
    # longer than SGLang's prefetch threshold on both servers, below which a prefix is never loaded from L3
    words = max(L3_PAGES * pages + pages // 2, prefetch_threshold(d) + pages, prefetch_threshold(writer) + pages)
    # New to every server of the share: the host's name and the run's id come first (prompts.prompt).
    text = prompts.prompt(f"hicache-verify-l3-{d.inventory_host}-{salt}", words)
    return {
        "base_url": f"http://{d.local_host}:{d.effective_port}",
        # the server's L3 directory on the host (its namespace under the tier's mount point), where it writes pages
        "l3_dir": namespace.server_dir(d, d.cache_dir) if d.storage_backend in ("file", "nixl") and d.cache_dir else None,
        "storage_backend": storage_backend_request(d),  # its headers carry the admin API key: use them under no_log
        "unit": sglang_server.unit_name(d),
        "health_timeout": d.health_timeout,
        "probe": prompts.chat_request(d.served_name, prompts.prompt(f"hicache-verify-probe-{salt}", 32)),
        "l3_probe": prompts.chat_request(d.served_name, text),
        # as long as the proof prompt and new to every server: computed by this server after the restart, it is what the
        # proof prompt's answer from L3 is timed against (is L3 worth it here?)
        "recompute_probe": prompts.chat_request(d.served_name, prompts.prompt(f"hicache-verify-recompute-{d.inventory_host}-{salt}", words)),
        "l3_backend": d.storage_backend,
        "writer": writer.inventory_host,
        "shared": writer.inventory_host != d.inventory_host,
        "writer_url": f"http://{writer.local_host}:{writer.effective_port}",  # as the writer's own host reaches it
        "l3_fill": prompts.chat_request(writer.served_name, text),
        "l3_min_tokens": writer.page_size or 1,  # at least one whole page must reach L3
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


def server_drift(d: Deployment, info: Mapping[str, Any]) -> list[str]:
    """What the running server (its /server_info) does differently from the inventory, one phrase each."""
    return [f"{what} {info[field]} (inventory: {want_value})" for field, what, want_value in
            (("page_size", "page size", d.page_size), ("hicache_write_policy", "write policy", d.write_policy),
             ("hicache_storage_backend", "storage backend", d.storage_backend), ("served_model_name", "served model name", d.served_name),
             ("kv_cache_dtype", "KV dtype", d.kv_cache_dtype), ("tp_size", "TP size", d.tp_size))
            if want_value is not None and field in info and info[field] != want_value]


def running_differences(writer_info: Mapping[str, Any], info: Mapping[str, Any]) -> list[tuple[str, str]]:
    """What two running servers (their /server_info) do differently that changes pages or keys: (what, phrase)."""
    return [(what, f"{what} {writer_info[field]} vs {info[field]}") for field, what in PAGE_FORMAT_INFO
            if field in writer_info and field in info and writer_info[field] != info[field]]


def format_differences(writer, d: Deployment, writer_info: Mapping[str, Any], info: Mapping[str, Any]) -> list[str]:
    """What differs between the writer and this host: the inventory's page format and namespace
    (namespace.differences), then what only the running servers show."""
    left, right = namespace.components(writer), namespace.components(d)
    said = {words for words in left if left[words] != right.get(words)}
    return list(namespace.differences(writer, d)) + [phrase for what, phrase in running_differences(writer_info, info) if what not in said]


def unit_check(d: Deployment, obs: Mapping[str, Any]) -> dict[str, str] | None:
    """The server's unit as systemd has it (`systemctl show`): active and running, or the answers on the server's
    port are not its own (a server started by hand, another process) or it is down. None where it was not read (an
    older playbook); not checked where systemd does not run the host."""
    read = obs.get("unit")
    if not isinstance(read, Mapping):
        return None
    unit = f"{d.service_name}.service"
    props = dict(line.split("=", 1) for line in str(read.get("stdout") or "").splitlines() if "=" in line)
    if read.get("rc") != 0 or not props.get("ActiveState"):
        return _check("unit", NOT_CHECKED, f"{unit} could not be read (systemd does not run this host?)")
    active, sub = props["ActiveState"], props.get("SubState", "")
    if (active, sub) == ("active", "running"):
        return _check("unit", PASS, f"{unit} is active (running)")
    answered = _status(obs.get("health")) > 0
    return _check("unit", FAIL, f"{unit} is {active} ({sub})" + ("; something else answers the server's port" if answered else ""),
                  f"`journalctl -u {unit}` on the host" + (" (Address already in use: stop what holds the port), then `hicachectl deploy`"
                                                          if answered else ", then `hicachectl deploy` or `hicachectl restart`") + ".")


def endpoint_checks(d: Deployment, obs: Mapping[str, Any]) -> list[dict[str, str]]:
    unit = d.service_name
    health = _status(obs.get("health"))
    found = unit_check(d, obs)
    if health <= 0:  # one failure: nothing answers (the unit's state, when read, is said with it)
        state = f" ({found['detail']})" if found and found["status"] == FAIL else ""
        return [_check("/health", FAIL, f"nothing answers at {obs.get('health', {}).get('url', 'the server port')}{state}",
                       f"the server is not running: `hicachectl status`, `journalctl -u {unit}` on the host."),
                _check("endpoints", NOT_CHECKED, "no server to ask")]
    checks = [found] if found else []
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
                      _check("server config", PASS, "page size, KV dtype, TP size, write policy and storage backend as the inventory sets them"))
    backend = storage_backend_check(d, obs.get("storage_backend"), info if isinstance(info, dict) else None)
    if backend:
        checks.append(backend)
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


# SGLang's defaults (0.5.23 server_args.py: --hicache-storage-prefetch-policy timeout, --hicache-write-policy
# write_through; managers/cache_controller.py: prefetch_threshold 256, raised to the page size), for a setting left unset.
SGLANG_PREFETCH_POLICY = "timeout"
SGLANG_WRITE_POLICY = "write_through"
SGLANG_PREFETCH_THRESHOLD = 256


def write_policy(d: Deployment) -> str:
    """The write policy the server runs with: the inventory's, else SGLang's default."""
    return d.write_policy or SGLANG_WRITE_POLICY


def prefetch_policy(d: Deployment) -> str:
    """The prefetch policy the server runs with: the inventory's, else SGLang's default."""
    return d.prefetch_policy or SGLANG_PREFETCH_POLICY


def prefetch_threshold(d: Deployment) -> int:
    """Tokens below which SGLang does not load a prefix from L3 at all (unified_radix_cache.py: len(prefetch_key) <
    prefetch_threshold returns); the controller takes max(prefetch_threshold, page_size)."""
    value = d.extra_config.get("prefetch_threshold", SGLANG_PREFETCH_THRESHOLD) if d.extra_config else SGLANG_PREFETCH_THRESHOLD
    return max(int(value) if isinstance(value, int) and not isinstance(value, bool) else SGLANG_PREFETCH_THRESHOLD, d.page_size or 1)


def _keys_changed(before: Mapping[str, Any], after: Mapping[str, Any]) -> list[str]:
    changes = []
    for field, what in (("page_size", "page size"), ("served_model_name", "served model name")):
        if field in before and field in after and before[field] != after[field]:
            changes.append(f"{what} {before[field]} -> {after[field]}")
    return changes


def _l3_write(d: Deployment, writer, obs: Mapping[str, Any]) -> tuple[dict[str, str], bool]:
    """The first half of the proof: the writer's server wrote the long prompt's pages to L3."""
    by = f" by {writer.inventory_host}" if writer is not d else ""
    on = f" on {writer.inventory_host}" if writer is not d else ""
    page = writer.page_size or 1
    fill = obs.get("fill")
    if _status(fill) != 200:
        return _check("L3 write", FAIL, f"the long prompt was answered {_status(fill)}{by}",
                      f"see `journalctl -u {writer.service_name}`{on}."), False
    written = metrics.delta((obs.get("fill_metrics") or {}).get("content"), (obs.get("before_metrics") or {}).get("content"),
                            lambda t: metrics.total(t, metrics.BACKUPED))
    prompt_tokens = _usage(fill).get("prompt_tokens", 0)
    if written is not None and written >= page:
        return _check("L3 write", PASS, f"{written:.0f} of {prompt_tokens} prompt tokens written to L3{by}"), True
    info = _json(obs.get("writer_info") if writer is not d else obs.get("info_before"))
    policy = (info.get("hicache_write_policy") if isinstance(info, dict) else None) or write_policy(writer)  # what runs
    own = _json(obs.get("info_before")) if writer is d else None
    if writer is d and detached(storage_backend_check(d, obs.get("storage_backend"), own if isinstance(own, dict) else None)):
        cause = (f"the storage backend {d.storage_backend} was detached at runtime (GET {STORAGE_BACKEND_PATH} answers none): the server "
                 "writes nothing to L3 until it is attached again; `hicachectl restart` starts it with the inventory's backend.")
    elif written is None:
        cause = f"the server{on} reports no sglang:backuped_tokens_total: the storage backend did not start (server log) or metrics are off."
    elif policy == "write_back":
        cause = f"hicache_write_policy write_back{on} writes a page to L3 only when the host pool evicts it, so nothing is on L3 yet; use write_through."
    elif policy == "write_through_selective":
        cause = f"write_through_selective{on} writes a page only after 2 hits; use write_through to prove persistence."
    elif prompt_tokens < page:
        cause = f"the prompt ({prompt_tokens} tokens) is shorter than a page ({page})."
    else:
        cause = f"nothing reached L3 in time{on}: look for storage errors in the server log and check the L3 mount (verify's host checks)."
    return _check("L3 write", FAIL, f"{0 if written is None else written:.0f} tokens written{by} for a {prompt_tokens}-token prompt", cause), False


def l3_proof(d: Deployment, obs: Mapping[str, Any], writer=None) -> tuple[list[dict[str, str]], bool]:
    """The L3 proof's checks: a long prompt written to L3 by the writer (this host's own server, or the one before it
    in its hicache_l3_share), this server restarted, the prompt hitting L3 here; and whether the proof holds (its
    pages came back from L3, every check passed)."""
    writer = d if writer is None or writer.inventory_host == d.inventory_host else writer
    shared = writer is not d
    if d.storage_backend is None:
        return [_check("L3 write", FAIL, "no L3 tier configured", "set hicache_storage_backend (file, nixl or dynamic).")], False
    if obs.get("restart_skipped"):
        return [_check("L3 persistence", FAIL, f"not proven: {obs['restart_skipped']}",
                       "--l3 asked for the proof on every host; fix the failed batch and run `hicachectl verify --l3` again.")], False
    write, written = _l3_write(d, writer, obs)
    if not written:
        return [write], False
    checks = [write]
    if obs.get("restart_failed"):
        return checks + [_check("restart", FAIL, obs["restart_failed"], f"`journalctl -u {d.service_name}` on the host.")], False
    checks.append(_check("restart", PASS, "server restarted and healthy: host and device caches are empty"))
    reuse = obs.get("reuse")
    before, after = (obs.get("reuse_metrics_before") or {}).get("content"), (obs.get("reuse_metrics") or {}).get("content")
    hits = metrics.delta(after, before, metrics.storage_hits)
    cached = (_usage(reuse).get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0
    name = "L3 hit across servers" if shared else "L3 hit after restart"
    info_after, writer_info = _json(obs.get("info_after")), _json(obs.get("writer_info"))
    differences = format_differences(writer, d, writer_info if isinstance(writer_info, dict) else {},
                                     info_after if isinstance(info_after, dict) else {}) if shared else []
    # Most of the prompt must come back from storage: a few hits could be pages this server wrote itself before (a
    # chat template's first tokens), not the proof's. Allowed short: the last partial page and one more.
    page = max(d.page_size or 1, writer.page_size or 1)
    prompt_tokens = _usage(reuse).get("prompt_tokens") or 0
    needed = max(1, prompt_tokens - 2 * page)
    if _status(reuse) == 200 and (hits or 0) >= needed and cached >= needed:
        detail = f"{cached} of {_usage(reuse).get('prompt_tokens')} prompt tokens cached, {hits:.0f} loaded from storage"
        if shared and differences:  # the pages were read though they are another format: the keys do not tell them apart
            return checks + [_check(name, FAIL, f"{detail}, from pages {writer.inventory_host} wrote in another format: " + "; ".join(differences),
                                    f"{d.inventory_host} read pages written for another page format (SGLang's file backend keys omit the KV dtype, "
                                    "sglang#33268): wrong KV. Set hicache_l3_namespace: auto (or distinct names) on both.")], False
        timed = l3_timing(obs)
        if timed:
            detail += f", in {timed[1]:.2f} s against {timed[0]:.2f} s to compute a prompt as long"
        return checks + [_check(name, PASS, detail + (f", written by {writer.inventory_host}" if shared else ""))], True
    keys = _keys_changed(_json(obs.get("info_before")), info_after)
    dropped = metrics.delta(after, before, lambda t: metrics.total(t, metrics.BACKUP_DROPPED)) or 0
    # Found in L3 but fewer tokens than the prefetch threshold, so SGLang loaded none (unified_radix_cache.py, 0.5.23:
    # reason below_threshold); the other reasons are reads that did not finish or had no room.
    below = metrics.delta(after, before, lambda t: metrics.total(t, metrics.PREFETCH_UNFULFILLED, reason="below_threshold")) or 0
    unfulfilled = (metrics.delta(after, before, lambda t: metrics.total(t, metrics.PREFETCH_UNFULFILLED)) or 0) - below
    if keys:
        cause = f"the server came back with a different {' and '.join(keys)}: both are part of every L3 key, so the keys differ and nothing can hit. Deploy the inventory's config (start.sh changed on disk?)."
    elif _status(reuse) != 200:
        cause = f"the request after the restart failed ({_status(reuse)}); see `journalctl -u {d.service_name}`."
    elif differences:
        cause = (f"{writer.inventory_host} and {d.inventory_host} differ: {'; '.join(differences)}. Their pages have other keys or another "
                 f"namespace, so one cannot read what the other wrote: give every host of hicache_l3_share {d.l3_share} the same page format "
                 "and namespace, or another hicache_l3_share.")
    elif (hits or 0) == 0 and prompt_tokens < prefetch_threshold(d):
        cause = (f"the prompt ({prompt_tokens} tokens) is shorter than SGLang's prefetch threshold ({prefetch_threshold(d)} tokens: "
                 "hicache_extra_config.prefetch_threshold, 256 by default, at least a page), below which a prefix is not loaded from "
                 "L3 at all; verify with a longer prompt, or lower prefetch_threshold.")
    elif (hits or 0) == 0 and below > 0:
        cause = (f"only {below:.0f} of the prompt's {prompt_tokens} tokens were found in L3, fewer than SGLang's prefetch threshold "
                 f"({prefetch_threshold(d)} tokens), so none were loaded: most pages written before the restart are gone "
                 "(evicted, e.g. by NIXL's L3 cleaner, or pruned) or were written under other keys.")
    elif (hits or 0) > 0:
        cause = (f"only {hits:.0f} of {prompt_tokens} prompt tokens came from storage (the proof needs {needed}): those may be pages "
                 f"{d.inventory_host} wrote itself before (a chat template's), not the proof's "
                 + (f"from {writer.inventory_host}; is the tier really shared?" if shared else "; were the pages written before the restart kept?"))
    elif dropped > 0:
        cause = f"{dropped:.0f} tokens were dropped from the host pool: it is too small to stage the pages; raise hicache_size_gb (see `hicachectl size`)."
    elif unfulfilled > 0:
        cause = f"{unfulfilled:.0f} tokens were not prefetched in time (prefetch policy {prefetch_policy(d)}): L3 reads are too slow or the host pool too small."
    elif shared:
        cause = (f"{writer.inventory_host} wrote the pages and {d.inventory_host} runs the same page format and namespace, yet found none: "
                 f"the tier is not really shared (is hicache_cache_dir {d.cache_dir} on {d.inventory_host} the same export as "
                 f"{writer.cache_dir} on {writer.inventory_host}?).")
    else:
        cause = "the pages written before the restart were not found: is the L3 directory the same mount after the restart, and the backend's namespace unchanged?"
    return checks + [_check(name, FAIL, f"{cached} cached tokens, {hits or 0:.0f} loaded from storage", cause)], False


def _seconds(answer: Any) -> float | None:
    value = answer.get("seconds") if isinstance(answer, Mapping) and _status(answer) == 200 else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0 else None


def l3_timing(obs: Mapping[str, Any]) -> tuple[float, float] | None:
    """(seconds to compute a prompt as long as the proof's, seconds to answer the proof prompt from L3), both on this
    server after its restart: the proof prompt's pages read from L3, then a prompt new to every server (a prefill of as
    many tokens). Each asks for one token, so each is a time to first token. Not the writer's first answer: that may be
    another server's GPU, and was not its first request after a restart. None where either was not timed."""
    computed, loaded = _seconds(obs.get("recompute")), _seconds(obs.get("reuse"))
    return (computed, loaded) if computed and loaded else None


def l3_findings(d: Deployment, obs: Mapping[str, Any], writer=None) -> list[dict[str, Any]]:
    """Where reading the proof prompt from L3 was not faster than computing it: the finding bench makes (is L3 worth it
    here?), from one request each, with bench's levers and the server's value of each. Made only where the proof holds."""
    timed = l3_timing(obs)
    if not timed or timed[1] < timed[0]:
        return []
    prompt_tokens = _usage(obs.get("reuse")).get("prompt_tokens") or 0
    message = (f"L3 does not beat recompute on {d.inventory_host}: its proof prompt ({prompt_tokens} tokens) came back from L3 in "
               f"{timed[1]:.2f} s after the restart, against {timed[0]:.2f} s to compute a new prompt as long on the same server "
               f"({timed[1] / timed[0]:.2f}x); one request each, and a short prompt favours recompute: `hicachectl bench` measures it "
               "at your prompt length and load")
    info = _json(obs.get("info_after"))
    return [{"finding": bench.L3_LOSES, "host": d.inventory_host, "message": message, "seconds": {"recompute": timed[0], "l3": timed[1]},
             "levers": bench.levers(info if isinstance(info, dict) else {})}]


def l3_dir_check(obs: Mapping[str, Any]) -> dict[str, str] | None:
    """The directory the server writes its pages in (stat on the host): there and writable, or every write fails until
    a deploy or the server's next start makes it again. None where the server has no L3 directory (or it was not read)."""
    read = obs.get("l3_dir")
    if not isinstance(read, Mapping) or not read.get("path"):
        return None
    path = read["path"]
    if not read.get("exists"):
        return _check("L3 directory", FAIL, f"{path} is missing: every page the server writes fails until a deploy or its next start makes it again",
                      "`hicachectl deploy` makes it again without a restart (and find what removed it: a prune, SGLang's clear).")
    if not read.get("isdir") or not read.get("writeable"):
        return _check("L3 directory", FAIL, f"{path} is {'not a directory' if not read.get('isdir') else 'not writable'}: the server's writes fail",
                      "check its mode, its mount (read-only?) and chattr flags on the host.")
    return _check("L3 directory", PASS, f"{path} is there and writable")


def judge(d: Deployment, obs: Mapping[str, Any], l3: bool, writer=None) -> dict[str, Any]:
    """The checks for one host; `writer` is the Deployment of the host that wrote its L3 proof (None: itself)."""
    checks = [_check(f["item"], FAIL, f["detail"], "the host differs from the inventory: `hicachectl deploy` (or `plan` to see what).")
              for f in obs.get("host_failures", [])]
    checks += endpoint_checks(d, obs)
    if _status(obs.get("health")) > 0 and (found := l3_dir_check(obs)) is not None:  # a running server's writes
        checks.append(found)
    found = []
    if l3 and _status(obs.get("health")) > 0:
        proof, proven = l3_proof(d, obs, writer)
        checks += proof
        if proven:
            found = l3_findings(d, obs, writer)
    return {"ok": all(c["status"] != FAIL for c in checks), "checks": checks, "findings": found}
