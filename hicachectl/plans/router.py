"""The SGLang router in front of the inventory's servers: what the router role installs and runs, and what `verify`
concludes from the router's answers. Pure: no I/O.

Which router: hicache_router_package, `smg` by default. The router's development moved to SMG, the SGLang Model
Gateway (smg-project/smg; `smg` on PyPI, 1.13.0): SGLang 0.5.23's README lists SMG for deployment and routing,
and `sglang-router` stopped at 0.3.2 (2026-01). Both install a binary of the package's name with the same
`launch --host --port --policy --prometheus-host --prometheus-port --worker-urls` (smg 1.13.0 smg/router_args.py)
and serve the same /workers API and smg_* metrics; neither serves the old /add_worker, /remove_worker (404).

The router runs as a systemd unit from its own virtualenv. Its workers are the inventory's servers (every host not
in group hicache_routers). The unit reads their URLs from an environment file (WORKERS_ENV beside the venv), so a
changed server list changes that file and the role adds or removes the workers through the router's worker API
(module hicache_router_worker), without restarting the router; the file is what a restarted router starts with.
A changed version, port, policy or flag changes the unit itself and restarts it.

sglang-router 0.3.2 facts this relies on: `launch --worker-urls URL...` (zero URLs is fine), `GET /workers`,
`POST /workers` {"url"}, `DELETE /workers/{id}`, `GET /health`, Prometheus text with `smg_*` metric names on
--prometheus-port. A worker it cannot reach when it is added is not listed: the addition stays "processing" and is
retried every few seconds until the worker answers (seen on loopback with 0.3.2); a listed worker that dies stays
listed healthy until its periodic health check (every 60 s, 3 failures) says otherwise. So verify also asks each
worker's /health from the router host, and a worker whose model the router could not read (`model_id` "unknown") fails.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from hicachectl import rules
from hicachectl.config.deployment import Deployment
from hicachectl.formats import prompts, quoting, urls
from hicachectl.formats.urls import normalize
from hicachectl.formats.urls import url_host as _url_host

PASS, FAIL, NOT_CHECKED = "pass", "fail", "not checked"  # verify.py's three outcomes
WORKERS_VAR = "HICACHE_ROUTER_WORKER_URLS"
WORKERS_ENV = "workers.env"  # in hicache_router_dir
WHEELHOUSE_DIR = "wheels"  # in hicache_router_dir: the controller's wheelhouse, copied
SGLANG_PORT = 30000  # SGLang's default --port
METRIC_PREFIX = "smg_"  # sglang-router 0.3.x's and smg's metric names
# The version of each router package this release was checked with (hicache_router_version None picks it).
CHECKED_VERSIONS = {"smg": "1.13.0", "sglang-router": "0.3.2"}


# --- the workers --------------------------------------------------------------------------------------

def worker_url(host: str, variables: Mapping[str, Any]) -> str:
    """Where the routers reach the server `host`: hicache_worker_url, else http://<ansible_host or the inventory
    name>:<hicache_port or 30000> (an IPv6 address in brackets)."""
    return urls.worker_url(variables.get("hicache_worker_url"), variables.get("ansible_host") or host, variables.get("hicache_port") or SGLANG_PORT)


def worker_urls(hostvars: Mapping[str, Mapping[str, Any]], servers: Iterable[str]) -> list[str]:
    """The worker URL of each server, in the servers' order, each once."""
    return list(dict.fromkeys(worker_url(host, hostvars[host]) for host in servers))


def extra_workers(listed: Iterable[Any], wanted: Iterable[str]) -> list[str]:
    """The URLs the router lists that are not the inventory's workers (normalised, each once). A listed URL that
    is not http(s)://host[:port] was not added by hicache-deploy and is left alone."""
    want = {normalize(u) for u in wanted}
    extra = []
    for url in listed:
        try:
            key = normalize(str(url))
        except ValueError:
            continue
        if key not in want and key not in extra:
            extra.append(key)
    return extra


def served_models(hostvars: Mapping[str, Mapping[str, Any]], servers: Iterable[str]) -> list[str]:
    """The model names the servers answer to (--served-model-name, else --model-path), each once."""
    names = (hostvars[h].get("hicache_served_model_name") or hostvars[h].get("hicache_model_path") for h in servers)
    return list(dict.fromkeys(str(n) for n in names if n))


# --- the service ------------------------------------------------------------------------------------

def _connect_host(d: Deployment) -> str:
    """How the router's own host reaches it (a wildcard bind on loopback)."""
    host = d.router_host or "0.0.0.0"
    if host in ("0.0.0.0", "localhost"):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return _url_host(host)


def unit_path(d: Deployment) -> str:
    """The router's systemd unit, as the router role installs it: there once the role has run on the host."""
    return f"/etc/systemd/system/{d.router_service_name}.service"


def base_url(d: Deployment) -> str:
    return f"http://{_connect_host(d)}:{d.router_port}"


def metrics_url(d: Deployment) -> str:
    return f"http://{_connect_host(d)}:{d.router_prometheus_port}/metrics"


def package(d: Deployment) -> str:
    return d.router_package or "smg"


def version(d: Deployment) -> str:
    """The pinned version of the router package: hicache_router_version, else the one this release was checked with."""
    return d.router_version or CHECKED_VERSIONS[package(d)]


def binary(d: Deployment) -> str:
    """The package's console script in its virtualenv (smg: `smg`, sglang-router: `sglang-router`)."""
    return f"{d.router_dir.rstrip('/')}/bin/{package(d)}"


def launch_argv(d: Deployment, urls: Iterable[str]) -> list[str]:
    """The router's command line (what the unit runs once systemd expands the worker URLs)."""
    argv = [binary(d), "launch", "--host", str(d.router_host), "--port", str(d.router_port), "--policy", str(d.router_policy),
            "--prometheus-host", str(d.router_host), "--prometheus-port", str(d.router_prometheus_port)]
    argv += [str(word) for word in d.router_extra_args or ()]
    return argv + ["--worker-urls", *(normalize(u) for u in urls)]


def exec_start(d: Deployment) -> str:
    """ExecStart= of the unit: launch_argv with the worker URLs from the environment file ($VAR unbraced: systemd
    splits it into one word per URL, none when it is empty)."""
    return " ".join(quoting.unit_word(w) for w in launch_argv(d, [])) + f" ${WORKERS_VAR}"


def workers_env(urls: Iterable[str]) -> str:
    return f"# Written by hicache-deploy: the router's workers (the inventory's servers).\n{WORKERS_VAR}={' '.join(normalize(u) for u in urls)}\n"


def unit_fields(d: Deployment) -> dict[str, str]:
    """The values roles/router/templates/sglang-router.service.j2 places, each escaped for its unit setting."""
    return {"host": quoting.unit_value(d.inventory_host),
            "description": quoting.unit_value(f"SGLang router {package(d)} {version(d)} (hicache-deploy)"),
            "environment_file": quoting.unit_word(f"{d.router_dir.rstrip('/')}/{WORKERS_ENV}"),
            "exec_start": exec_start(d)}


def plan(d: Deployment, hostvars: Mapping[str, Mapping[str, Any]], servers: Iterable[str]) -> dict[str, Any]:
    """Everything the router role does on the router host `d`, for the servers (host names, their variables in hostvars)."""
    servers = list(servers)
    urls = worker_urls(hostvars, servers)
    directory = d.router_dir.rstrip("/")
    wheelhouse = f"{directory}/{WHEELHOUSE_DIR}" if d.router_wheelhouse else None
    pip_args = ["--no-index", "--find-links", wheelhouse] if wheelhouse else (["--index-url", d.router_index_url] if d.router_index_url else [])
    return {
        "package": package(d),
        "version": version(d),
        "dir": directory,
        "requirement": f"{package(d)}=={version(d)}",
        "pip_args": pip_args,
        "index_url": d.router_index_url,
        "wheelhouse_src": d.router_wheelhouse.rstrip("/") + "/" if d.router_wheelhouse else None,
        "wheelhouse": wheelhouse,
        "binary": binary(d),
        "service": f"{d.router_service_name}.service",
        "unit_path": unit_path(d),
        "unit": unit_fields(d),
        "workers_env_path": f"{directory}/{WORKERS_ENV}",
        "workers_env": workers_env(urls),
        "argv": launch_argv(d, urls),
        "servers": servers,
        "worker_urls": urls,
        "models": served_models(hostvars, servers),
        "url": base_url(d),
        "health_url": base_url(d) + "/health",
        "metrics_url": metrics_url(d),
        "health_timeout": 60,
        "worker_timeout": 120,
    }


def check_router_host(host: str, variables: Mapping[str, Any]) -> tuple[Any, list]:
    """A router host's variables, checked as the router role alone needs them (rules.check_host, role "router")."""
    return rules.check_host(host, variables, role="router")


# --- doctor ------------------------------------------------------------------------------------------

# Space the router's virtualenv and wheelhouse take, with room to spare (smg's wheel and its dependencies).
ROUTER_MIN_FREE_GB = 1


def doctor_report(d: Deployment, facts: Mapping[str, Any], python_missing: str) -> dict[str, Any]:
    """doctor's judgement of a router host (`facts`: hicache_host_facts' answer; `python_missing`: the packages the
    router role would install for its virtualenv, as its own probe prints them). The report has preflight's shape."""
    from hicachectl.plans import preflight
    from hicachectl.plans.plan import MISSING, OK, WARN, Check

    checks = preflight.host_checks(dict(facts))
    checks.append(Check("systemd", OK if facts.get("systemd") else MISSING,
                        "systemd runs the host" if facts.get("systemd") else f"the router runs as the systemd unit {d.router_service_name}.service", required=True))
    missing = python_missing.split()
    checks.append(Check("python_venv", WARN if missing else OK,
                        f"{' '.join(missing)} missing: the router role installs it with the host's package manager" if missing
                        else "venv and packaging (the router's virtualenv)"))
    disk = facts.get("disk") or {}
    free = disk.get("free_gb")
    enough = free is not None and free >= ROUTER_MIN_FREE_GB
    checks.append(Check("disk", OK if enough else WARN, f"{free} GB free at {disk.get('path')} (want {ROUTER_MIN_FREE_GB} for {d.router_dir})"))
    return preflight.summary(checks, strict=True)


# --- verify -----------------------------------------------------------------------------------------

def probes(models: Iterable[str], salt: str) -> list[dict]:
    """One chat completion per served model, sent through the router."""
    return [prompts.chat_request(model, prompts.prompt(f"hicache-verify-router-{salt}", 16)) for model in models]


def verify_requests(router_vars: Mapping[str, Any], salt: str) -> list[dict[str, Any]]:
    """What verify asks on a router host, in order, as hicache_probe's requests: the router's /health and GET /workers,
    each server's /health (from the router host: the router's own path to it), one chat completion per served model
    through the router (only once its /health answered 200), its Prometheus metrics. observed() reads the answers back."""
    url = router_vars["url"]
    return ([{"name": "health", "url": router_vars["health_url"], "timeout": 30}, {"name": "workers", "url": f"{url}/workers", "timeout": 30}]
            + [{"name": f"worker {worker}", "url": f"{worker}/health", "timeout": 30} for worker in router_vars.get("worker_urls") or []]
            + [{"name": f"chat {i}", "url": f"{url}/v1/chat/completions", "method": "POST", "body": body, "timeout": 120, "after": "health"}
               for i, body in enumerate(probes(router_vars.get("models") or [], salt))]
            + [{"name": "metrics", "url": router_vars["metrics_url"], "return_content": True, "timeout": 30}])


def observed(router_vars: Mapping[str, Any], answers: Mapping[str, Any]) -> dict[str, Any]:
    """The answers to verify_requests in the shape judge() reads: chats not sent (the router did not answer) left out."""
    chats = [answers.get(f"chat {i}") or {} for i in range(len(router_vars.get("models") or []))]
    return {"health": answers.get("health"), "workers": answers.get("workers"), "metrics": answers.get("metrics"),
            "worker_health": {worker: answers.get(f"worker {worker}") for worker in router_vars.get("worker_urls") or []},
            "chats": [chat for chat in chats if not chat.get("skipped")]}


def _check(name: str, status: str, detail: str, cause: str = "") -> dict[str, str]:
    return {"check": name, "status": status, "detail": detail, "cause": cause}


def _status(result: Mapping[str, Any] | None) -> int:
    try:
        return int((result or {}).get("status", -1) or -1)
    except (TypeError, ValueError):
        return -1


def _listed(result: Mapping[str, Any] | None) -> list[dict] | None:
    body = (result or {}).get("json")
    if _status(result) != 200 or not isinstance(body, dict) or not isinstance(body.get("workers"), list):
        return None
    return [w for w in body["workers"] if isinstance(w, dict)]


def _key(url: Any) -> str:
    try:
        return normalize(str(url))
    except ValueError:
        return str(url)


def judge(router_vars: Mapping[str, Any], observed: Mapping[str, Any]) -> dict[str, Any]:
    """The router's checks. `router_vars` holds the plan's `worker_urls`, `models`, `service` and `url`; `observed`
    the uri results: `health`, `workers` (GET /workers), `chats` (one per model), `metrics`, and `worker_health`
    (a mapping worker URL -> its /health asked from the router host)."""
    service = router_vars.get("service", "the router's unit")
    url = router_vars.get("url", "the router")
    expected = [_key(u) for u in router_vars.get("worker_urls") or ()]
    health = _status(observed.get("health"))
    if health <= 0:
        return {"ok": False, "checks": [
            _check("router /health", FAIL, f"nothing answers at {url}", f"the router is not running: `systemctl status {service}`, "
                   f"`journalctl -u {service}` on the host, or `hicachectl deploy`."),
            _check("router workers", NOT_CHECKED, "no router to ask"),
            _check("chat through the router", NOT_CHECKED, "no router to ask"),
            _check("router metrics", NOT_CHECKED, "no router to ask")]}
    checks = [_check("router /health", PASS, "200") if health == 200 else
              _check("router /health", FAIL, f"answered {health}", f"`journalctl -u {service}` on the host.")]
    listed = _listed(observed.get("workers"))
    reach = {_key(k): v for k, v in (observed.get("worker_health") or {}).items()}
    if listed is None:
        checks.append(_check("router workers", FAIL, f"GET /workers answered {_status(observed.get('workers'))}, not a worker list",
                             f"is this {router_vars.get('package', 'the router')} {router_vars.get('version', '')}? `journalctl -u {service}`."))
    elif not expected:
        checks.append(_check("router workers", NOT_CHECKED, "the inventory has no servers (hosts outside hicache_routers)"))
    else:
        by_url: dict[str, list[dict]] = {}
        for worker in listed:
            by_url.setdefault(_key(worker.get("url")), []).append(worker)
        for want in expected:
            name = f"worker {want}"
            records = by_url.get(want) or []
            answer = _status(reach.get(want)) if want in reach else None
            if not records:
                checks.append(_check(name, FAIL, "the router does not list it",
                                     "`hicachectl deploy` adds the inventory's servers to the router (or a rolling change took it out and stopped)."))
            elif not all(w.get("is_healthy") is True for w in records):
                checks.append(_check(name, FAIL, "the router lists it unhealthy",
                                     "the server is down or the router cannot reach it: `hicachectl status`, and its /health from the router host."))
            elif any(str(w.get("model_id", "")) in ("", "unknown") for w in records):
                checks.append(_check(name, FAIL, "listed, but the router could not read its model (model_id unknown)",
                                     "the router could not reach the server when it was added; check hicache_worker_url and the network."))
            elif answer is None:
                checks.append(_check(name, NOT_CHECKED, "listed healthy by the router; its /health was not asked from the router host"))
            elif answer != 200:
                checks.append(_check(name, FAIL, f"listed healthy, but its /health answered {answer if answer > 0 else 'nothing'} from the router host "
                                     "(sglang-router marks a worker unhealthy only after 3 failed checks, 60 s apart)",
                                     "the server is down or unreachable from the router: `hicachectl status`, hicache_worker_url, firewalls."))
            else:
                checks.append(_check(name, PASS, f"listed healthy, model {records[0].get('model_id')}; /health 200 from the router host"))
        extra = sorted(set(by_url) - set(expected))
        if extra:
            checks.append(_check("router workers", FAIL, "the router also sends to " + ", ".join(extra) + ", not an inventory server",
                                 "`hicachectl deploy` takes workers the inventory does not name out of the router."))
    chats = list(observed.get("chats") or [])
    models = list(router_vars.get("models") or [])
    if not expected:
        checks.append(_check("chat through the router", NOT_CHECKED, "no servers to answer"))
    elif not chats:
        checks.append(_check("chat through the router", NOT_CHECKED, "no chat completion was sent"))
    for model, chat in zip(models, chats, strict=False):
        answer = _status(chat)
        if answer == 200:
            checks.append(_check(f"chat through the router ({model})", PASS, "200"))
        else:
            body = str((chat or {}).get("json") or (chat or {}).get("msg") or "")[:200]
            checks.append(_check(f"chat through the router ({model})", FAIL, f"answered {answer if answer > 0 else 'nothing'} {body}".strip(),
                                 f"no healthy worker serves {model}, or the router cannot reach it: `journalctl -u {service}`."))
    metrics = observed.get("metrics") or {}
    text = str(metrics.get("content") or "")
    if _status(metrics) == 200 and METRIC_PREFIX in text:
        checks.append(_check("router metrics", PASS, f"{METRIC_PREFIX}* metrics served"))
    else:
        checks.append(_check("router metrics", FAIL, f"{router_vars.get('metrics_url', 'the metrics port')} answered "
                             f"{_status(metrics) if _status(metrics) > 0 else 'nothing'}" + ("" if _status(metrics) != 200 else f", without {METRIC_PREFIX}* metrics"),
                             "hicache_router_prometheus_port is taken or blocked; `journalctl -u " + service + "`."))
    return {"ok": all(c["status"] != FAIL for c in checks), "checks": checks}
