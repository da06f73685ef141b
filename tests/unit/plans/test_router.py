"""The router (hicachectl/plans/router.py, plugins/modules/hicache_router_worker.py): worker URLs, the router's command line
and unit, verify's judgement, and the worker module's decisions against a fake router API. Fast: no router runs here
(molecule/router and tests/fleet/test_fleet_router.py run the real router of the default package, smg)."""

from __future__ import annotations

import importlib.util
import shlex

import jinja2
import pytest
from support import ROOT

from hicachectl import rules
from hicachectl.plans import router

_spec = importlib.util.spec_from_file_location("hicache_router_worker", ROOT / "plugins/modules/hicache_router_worker.py")
worker_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(worker_module)


def router_host(**variables):
    d, findings = router.check_router_host("router-01", variables)
    assert not rules.has_errors(findings), [f.format() for f in findings]
    return d


# --- worker URLs ----------------------------------------------------------------------------------

def test_worker_url_from_ansible_host_and_port():
    assert router.worker_url("gpu-01", {"ansible_host": "10.0.0.11", "hicache_port": 8000}) == "http://10.0.0.11:8000"


def test_worker_url_defaults_to_the_inventory_name_and_sglangs_port():
    assert router.worker_url("gpu-01.example.com", {}) == "http://gpu-01.example.com:30000"


@pytest.mark.parametrize("address", ["fd00::11", "[fd00::11]"])
def test_worker_url_puts_ipv6_in_brackets(address):
    assert router.worker_url("gpu-01", {"ansible_host": address, "hicache_port": 30000}) == "http://[fd00::11]:30000"


def test_hicache_worker_url_wins_and_is_normalised():
    variables = {"ansible_host": "10.0.0.11", "hicache_port": 8000, "hicache_worker_url": "HTTP://GPU-01.lan:9000/"}
    assert router.worker_url("gpu-01", variables) == "http://gpu-01.lan:9000"


@pytest.mark.parametrize("url", ["gpu-01:30000", "http://gpu-01:30000/v1", "http://gpu 01:1", "ftp://gpu-01", "http://a$b:1"])
def test_a_url_the_router_cannot_take_is_refused(url):
    with pytest.raises(ValueError):
        router.worker_url("gpu-01", {"hicache_worker_url": url})


def test_worker_urls_keep_order_and_come_once():
    hostvars = {"b": {"ansible_host": "10.0.0.2"}, "a": {"ansible_host": "10.0.0.1"}, "c": {"hicache_worker_url": "http://10.0.0.2:30000/"}}
    assert router.worker_urls(hostvars, ["b", "a", "c"]) == ["http://10.0.0.2:30000", "http://10.0.0.1:30000"]


def test_extra_workers_are_those_the_inventory_does_not_name():
    listed = ["http://10.0.0.1:30000/", "http://10.0.0.9:30000", "10.0.0.8:1"]
    assert router.extra_workers(listed, ["http://10.0.0.1:30000"]) == ["http://10.0.0.9:30000"]


# --- the command line and the unit ----------------------------------------------------------------

def test_launch_argv():
    d = router_host(hicache_router_port=30081, hicache_router_policy="round_robin", hicache_router_extra_args=["--log-level", "warn"])
    argv = router.launch_argv(d, ["http://10.0.0.1:30000/", "http://[fd00::2]:30000"])
    assert argv == ["/opt/sglang-router/bin/smg", "launch", "--host", "0.0.0.0", "--port", "30081", "--policy", "round_robin",
                    "--prometheus-host", "0.0.0.0", "--prometheus-port", "29000", "--log-level", "warn",
                    "--worker-urls", "http://10.0.0.1:30000", "http://[fd00::2]:30000"]


def _unit(plan):
    template = (ROOT / "roles/router/templates/sglang-router.service.j2").read_text()
    return jinja2.Template(template, undefined=jinja2.StrictUndefined, keep_trailing_newline=True).render(__hicache_router=plan)


def _systemd_words(exec_start: str, env: dict[str, str]) -> list[str]:
    """ExecStart= as systemd runs it, for the words these units hold: quoting, %% and $$, unbraced $VAR split into words."""
    words = []
    for word in shlex.split(exec_start):
        if word.startswith("$") and not word.startswith("$$") and word[1:] in env:
            words += env[word[1:]].split()
        else:
            words.append(word.replace("%%", "%").replace("$$", "$"))
    return words


def test_the_unit_runs_launch_argv_with_the_workers_file():
    d = router_host(hicache_router_extra_args=["--api-key", "a b$c%d"])
    plan = router.plan(d, {"gpu-01": {"ansible_host": "10.0.0.11", "hicache_model_path": "/models/m"}}, ["gpu-01"])
    unit = _unit(plan)
    lines = dict(line.split("=", 1) for line in unit.splitlines() if "=" in line and not line.startswith("#"))
    assert lines["EnvironmentFile"] == "/opt/sglang-router/workers.env" == plan["workers_env_path"]
    env = dict(line.split("=", 1) for line in plan["workers_env"].splitlines() if not line.startswith("#"))
    assert _systemd_words(lines["ExecStart"], env) == plan["argv"]
    assert plan["argv"][-2:] == ["--worker-urls", "http://10.0.0.11:30000"] and plan["models"] == ["/models/m"]


def test_no_servers_no_worker_urls():
    plan = router.plan(router_host(), {}, [])
    assert plan["argv"][-1] == "--worker-urls" and plan["workers_env"].endswith("HICACHE_ROUTER_WORKER_URLS=\n")


def test_wheelhouse_installs_offline_and_index_url_from_the_mirror():
    offline = router.plan(router_host(hicache_router_wheelhouse="/srv/wheels"), {}, [])
    assert offline["wheelhouse_src"] == "/srv/wheels/" and offline["pip_args"] == ["--no-index", "--find-links", "/opt/sglang-router/wheels"]
    mirror = router.plan(router_host(hicache_router_index_url="https://pypi.example.com/simple"), {}, [])
    assert mirror["pip_args"] == ["--index-url", "https://pypi.example.com/simple"] and mirror["wheelhouse"] is None
    assert mirror["requirement"] == "smg==1.13.0"


@pytest.mark.parametrize("variables,package,requirement", [
    ({}, "smg", "smg==1.13.0"),  # SMG by default: where the router's development moved (SGLang 0.5.23's README)
    ({"hicache_router_package": "sglang-router"}, "sglang-router", "sglang-router==0.3.2"),
    ({"hicache_router_package": "sglang-router", "hicache_router_version": "0.3.1"}, "sglang-router", "sglang-router==0.3.1"),
    ({"hicache_router_version": "1.12.0"}, "smg", "smg==1.12.0"),
])
def test_the_router_package_and_its_binary_are_a_choice(variables, package, requirement):
    plan = router.plan(router_host(**variables), {}, [])
    assert plan["package"] == package and plan["requirement"] == requirement and plan["version"] == requirement.split("==")[1]
    assert plan["binary"] == f"/opt/sglang-router/bin/{package}" == plan["argv"][0]
    assert f"SGLang router {package} {plan['version']}" in plan["unit"]["description"]


def test_an_unknown_router_package_is_refused():
    _, found = router.check_router_host("router-1", {"hicache_router_package": "sglang_router"})
    assert any(f.variable == "hicache_router_package" and f.level == "error" for f in found)


def test_a_wildcard_bind_is_reached_on_loopback():
    assert router.plan(router_host(), {}, [])["health_url"] == "http://127.0.0.1:30080/health"
    assert router.plan(router_host(hicache_router_host="::"), {}, [])["metrics_url"] == "http://[::1]:29000/metrics"
    assert router.plan(router_host(hicache_router_host="10.1.1.1"), {}, [])["url"] == "http://10.1.1.1:30080"


def test_a_router_hosts_bad_values_are_refused():
    _, findings = router.check_router_host("router-01", {"hicache_router_policy": "fastest", "hicache_router_port": 0})
    assert {f.variable for f in findings if f.level == rules.ERROR} == {"hicache_router_policy", "hicache_router_port"}


def test_a_router_host_needs_no_server_variables():
    _, findings = router.check_router_host("router-01", {})
    assert not rules.has_errors(findings)


# --- verify's judgement -----------------------------------------------------------------------------

PLAN = {"worker_urls": ["http://10.0.0.1:30000", "http://10.0.0.2:30000"], "models": ["m"], "service": "sglang-router.service",
        "url": "http://127.0.0.1:30080", "metrics_url": "http://127.0.0.1:29000/metrics"}


def _worker(url, healthy=True, model="m"):
    return {"id": "x", "url": url, "is_healthy": healthy, "model_id": model}


def _observed(workers=None, chat=200, metrics="smg_http_requests_total 3\n", reach=200, health=200):
    workers = [_worker(u) for u in PLAN["worker_urls"]] if workers is None else workers
    return {"health": {"status": health}, "workers": {"status": 200, "json": {"workers": workers}},
            "worker_health": {u: {"status": reach} for u in PLAN["worker_urls"]},
            "chats": [{"status": chat}], "metrics": {"status": 200 if metrics is not None else -1, "content": metrics or ""}}


def _statuses(report):
    return {c["check"]: c["status"] for c in report["checks"]}


def test_judge_all_good():
    report = router.judge(PLAN, _observed())
    assert report["ok"] and set(_statuses(report).values()) == {"pass"}
    assert len(report["checks"]) == 1 + 2 + 1 + 1


def test_judge_a_missing_worker_fails():
    report = router.judge(PLAN, _observed(workers=[_worker("http://10.0.0.1:30000/")]))
    assert not report["ok"] and _statuses(report)["worker http://10.0.0.2:30000"] == "fail"
    assert _statuses(report)["worker http://10.0.0.1:30000"] == "pass"  # a trailing slash is the same worker


def test_judge_an_unhealthy_or_unknown_worker_fails():
    workers = [_worker("http://10.0.0.1:30000", healthy=False), _worker("http://10.0.0.2:30000", model="unknown")]
    statuses = _statuses(router.judge(PLAN, _observed(workers=workers)))
    assert statuses["worker http://10.0.0.1:30000"] == statuses["worker http://10.0.0.2:30000"] == "fail"


def test_judge_a_worker_listed_healthy_but_down_fails():
    """sglang-router 0.3.2 keeps a dead worker healthy for minutes: its own /health from the router host decides."""
    report = router.judge(PLAN, _observed(reach=-1))
    assert not report["ok"] and "from the router host" in report["checks"][1]["detail"]


def test_judge_an_extra_worker_fails():
    workers = [_worker(u) for u in PLAN["worker_urls"]] + [_worker("http://10.0.0.9:30000")]
    report = router.judge(PLAN, _observed(workers=workers))
    assert not report["ok"] and "10.0.0.9" in next(c["detail"] for c in report["checks"] if c["check"] == "router workers")


def test_judge_chat_and_metrics_failures():
    assert _statuses(router.judge(PLAN, _observed(chat=502)))["chat through the router (m)"] == "fail"
    assert _statuses(router.judge(PLAN, _observed(metrics=None)))["router metrics"] == "fail"
    assert _statuses(router.judge(PLAN, _observed(metrics="# nothing\n")))["router metrics"] == "fail"


def test_judge_no_router_fails_and_the_rest_is_not_checked():
    report = router.judge(PLAN, _observed(health=-1))
    assert not report["ok"]
    assert _statuses(report) == {"router /health": "fail", "router workers": "not checked", "chat through the router": "not checked",
                                 "router metrics": "not checked"}


def test_judge_without_servers_is_not_checked_never_passed():
    plan = {**PLAN, "worker_urls": [], "models": []}
    report = router.judge(plan, {**_observed(workers=[]), "chats": []})
    statuses = _statuses(report)
    assert statuses["router workers"] == statuses["chat through the router"] == "not checked"
    assert "pass" not in (statuses["router workers"], statuses["chat through the router"])


def test_judge_a_worker_not_asked_is_not_checked():
    observed = {**_observed(), "worker_health": {}}
    assert _statuses(router.judge(PLAN, observed))["worker http://10.0.0.1:30000"] == "not checked"


# --- the hicache_router_worker module's decisions -----------------------------------------------------

class FakeRouter:
    """The worker API of sglang-router 0.3.2 as seen from the module: additions and removals land after `lag` polls;
    a worker added is healthy after `healthy_after` polls (None: never)."""

    def __init__(self, urls=(), lag=1, healthy_after=0):
        self.base = "http://router:30080"
        self.listed = {f"id-{i}": {"id": f"id-{i}", "url": u, "is_healthy": True, "model_id": "m"} for i, u in enumerate(urls)}
        self.pending, self.lag, self.healthy_after, self.calls = [], lag, healthy_after, []

    def workers(self):
        self.calls.append("GET")
        for item in list(self.pending):
            item[0] -= 1
            if item[0] <= 0:
                self.pending.remove(item)
                item[1]()
        for w in self.listed.values():
            if "polls_to_healthy" in w and w["polls_to_healthy"] is not None:
                w["polls_to_healthy"] -= 1
                w["is_healthy"] = w["polls_to_healthy"] < 0
        return [dict(w) for w in self.listed.values()]

    def add(self, url):
        self.calls.append(("POST", url))
        wid = f"id-{len(self.listed) + len(self.calls)}"
        record = {"id": wid, "url": url, "is_healthy": self.healthy_after == 0, "model_id": "m",
                  "polls_to_healthy": self.healthy_after}
        self.pending.append([self.lag, lambda: self.listed.__setitem__(wid, record)])
        return {"status": "accepted", "worker_id": wid}

    def remove(self, wid):
        self.calls.append(("DELETE", wid))
        self.pending.append([self.lag, lambda: self.listed.pop(wid, None)])
        return {"status": "accepted"}

    def job(self, wid):
        return {}


def _run(fake, url, state, timeout=10, check=False):
    clock = [0.0]

    def tick(seconds):
        clock[0] += seconds

    return worker_module.run(fake, url, state, timeout, 1.0, check_mode=check, clock=lambda: clock[0], sleep=tick)


def test_present_adds_and_waits_until_listed():
    fake = FakeRouter(lag=2)
    result = _run(fake, "http://10.0.0.1:30000/", "present")
    assert result["changed"] and result["action"] == "added" and not result["failed"]
    assert ("POST", "http://10.0.0.1:30000") in fake.calls  # normalised before it is sent
    assert result["workers"] == ["http://10.0.0.1:30000"] and result["worker"]["is_healthy"]


def test_present_is_idempotent():
    fake = FakeRouter(["http://10.0.0.1:30000"])
    result = _run(fake, "http://10.0.0.1:30000", "present")
    assert not result["changed"] and result["action"] == "none" and not any(isinstance(c, tuple) for c in fake.calls)


def test_present_fails_when_never_healthy():
    fake = FakeRouter(healthy_after=None)
    fake.healthy_after = 10**6
    result = _run(fake, "http://10.0.0.1:30000", "present", timeout=5)
    assert result["failed"] and "unhealthy" in result["msg"] and result["changed"]


def test_present_waits_for_health():
    result = _run(FakeRouter(healthy_after=3), "http://10.0.0.1:30000", "present")
    assert not result["failed"] and result["seconds"] >= 3


def test_absent_removes_every_record_of_the_url_and_waits():
    fake = FakeRouter(["http://10.0.0.1:30000", "http://10.0.0.1:30000/", "http://10.0.0.2:30000"], lag=3)
    result = _run(fake, "http://10.0.0.1:30000", "absent")
    assert result["changed"] and result["action"] == "removed" and not result["failed"]
    assert [c for c in fake.calls if isinstance(c, tuple)] == [("DELETE", "id-0"), ("DELETE", "id-1")]
    assert result["workers"] == ["http://10.0.0.2:30000"]


def test_absent_of_an_unknown_worker_is_no_change():
    result = _run(FakeRouter(["http://10.0.0.2:30000"]), "http://10.0.0.1:30000", "absent")
    assert not result["changed"] and not result["failed"]


def test_absent_fails_when_the_router_keeps_it():
    fake = FakeRouter(["http://10.0.0.1:30000"], lag=10**6)
    result = _run(fake, "http://10.0.0.1:30000", "absent", timeout=3)
    assert result["failed"] and "still lists" in result["msg"]


@pytest.mark.parametrize("state,listed,action", [("present", [], "added"), ("absent", ["http://10.0.0.1:30000"], "removed"),
                                                 ("present", ["http://10.0.0.1:30000"], "none")])
def test_check_mode_only_reads(state, listed, action):
    fake = FakeRouter(listed)
    result = _run(fake, "http://10.0.0.1:30000", state, check=True)
    assert result["action"] == action and result["changed"] == (action != "none")
    assert fake.calls == ["GET"]


def test_the_module_refuses_a_url_with_a_path():
    with pytest.raises(ValueError):
        _run(FakeRouter(), "http://10.0.0.1:30000/v1", "present")


def test_the_module_and_the_core_normalise_alike():
    for url in ("HTTP://Gpu-01:30000/", "http://[fd00::1]:8000", "https://a.example.com"):
        assert worker_module.normalize(url) == router.normalize(url)


# --- "does the router run?" (state: query, roles/sglang_server/tasks/routers.yml) -------------------------------
# Only a refused connection is a router that does not run. A router that runs but answers slowly, or with an error,
# may still send requests to the server: taking it for "not running" would restart the server without draining it.

class FlakyRouter(FakeRouter):
    """A FakeRouter whose first `failures` worker lists fail with `error`."""

    def __init__(self, error, failures, urls=()):
        super().__init__(urls)
        self.error, self.failures = error, failures

    def workers(self):
        if self.failures:
            self.failures -= 1
            self.calls.append("GET (failed)")
            raise self.error
        return super().workers()


def test_query_a_refused_connection_is_a_router_that_does_not_run():
    refused = worker_module.RouterError("GET http://router:30080/workers: no answer ([Errno 111] Connection refused)", refused=True)
    result = _run(FlakyRouter(refused, failures=10**6), "http://10.0.0.1:30000", "query", timeout=30)
    assert result["running"] is False and not result["changed"] and not result["failed"]
    assert "refused" in result["msg"]


def test_query_a_router_that_answers_late_runs():
    slow = worker_module.RouterError("GET http://router:30080/workers: no answer (timed out)")
    fake = FlakyRouter(slow, failures=3, urls=["http://10.0.0.1:30000"])
    result = _run(fake, "http://10.0.0.1:30000", "query", timeout=30)
    assert result["running"] is True and result["worker"]["url"] == "http://10.0.0.1:30000"
    assert fake.calls.count("GET (failed)") == 3 and not any(isinstance(c, tuple) for c in fake.calls)  # nothing changed


@pytest.mark.parametrize("why", ["no answer (timed out)", "answered 503: starting"])
def test_query_a_router_that_never_answers_fails_naming_it_and_is_never_not_running(why):
    error = worker_module.RouterError(f"GET http://router:30080/workers: {why}")
    with pytest.raises(worker_module.RouterError, match=r"http://router:30080/workers: .*no worker list after 3\d s"):
        _run(FlakyRouter(error, failures=10**6), "http://10.0.0.1:30000", "query", timeout=30)


def test_the_module_tells_a_refused_connection_from_a_silent_router_on_real_sockets(monkeypatch):
    """Router (open_url, as on a host) against 127.0.0.1: a closed port refuses; a port that accepts and never answers
    times out, which is not "refused", also where the environment names a proxy that refuses (urllib would ask the
    proxy for 127.0.0.1 too, and its refusal would pass for the router's)."""
    import socket

    with socket.socket() as gone:
        gone.bind(("127.0.0.1", 0))
        dead_proxy = f"http://127.0.0.1:{gone.getsockname()[1]}"
    for name in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY"):
        monkeypatch.setenv(name, dead_proxy)
    monkeypatch.delenv("no_proxy", raising=False)
    monkeypatch.delenv("NO_PROXY", raising=False)

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        closed_port = closed.getsockname()[1]
    with pytest.raises(worker_module.RouterError) as refused:
        worker_module.Router(f"http://127.0.0.1:{closed_port}", timeout=2).workers()
    assert refused.value.refused, str(refused.value)

    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)  # the kernel completes the handshake; nobody ever reads or answers
        with pytest.raises(worker_module.RouterError) as slow:
            worker_module.Router(f"http://127.0.0.1:{silent.getsockname()[1]}", timeout=0.5).workers()
    assert not slow.value.refused and "timed out" in str(slow.value), str(slow.value)


def test_a_broken_answer_is_a_router_error_that_is_not_a_refusal():
    """A router cut mid-answer (http.client.IncompleteRead, not an OSError) is asked again, never taken for stopped."""
    import socket
    import threading

    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(1)

        def answer_half():
            conn, _ = server.accept()
            conn.recv(4096)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\nContent-Type: application/json\r\n\r\n{\"workers\"")
            conn.close()

        threading.Thread(target=answer_half, daemon=True).start()
        with pytest.raises(worker_module.RouterError) as cut:
            worker_module.Router(f"http://127.0.0.1:{server.getsockname()[1]}", timeout=5).workers()
    assert not cut.value.refused and "broken answer" in str(cut.value), str(cut.value)


def test_verify_asks_what_the_judge_reads_in_one_probe():
    """verify_routers.yml asks through hicache_probe: the router's /health and workers, each server's /health, one chat
    per model after the router answered, the metrics; observed() gives judge() the shape it read from uri tasks."""
    plan = {**PLAN, "models": ["m1", "m2"], "health_url": "http://127.0.0.1:30080/health"}
    requests = router.verify_requests(plan, "salt")
    names = [r["name"] for r in requests]
    assert names == ["health", "workers", *[f"worker {u}" for u in plan["worker_urls"]], "chat 0", "chat 1", "metrics"]
    assert all(r["after"] == "health" for r in requests if r["name"].startswith("chat")) and requests[-1]["return_content"]
    assert [r["body"]["model"] for r in requests if r["name"].startswith("chat")] == ["m1", "m2"]
    good = _observed()
    answers = {"health": good["health"], "workers": good["workers"], "metrics": good["metrics"],
               **{f"worker {u}": good["worker_health"][u] for u in plan["worker_urls"]},
               "chat 0": good["chats"][0], "chat 1": good["chats"][0]}
    assert router.observed(plan, answers)["chats"] == [good["chats"][0]] * 2
    assert router.judge(plan, router.observed(plan, answers))["ok"]
    down = {"health": {"status": -1}, "workers": {"status": -1}, "metrics": {"status": -1},
            "chat 0": {"skipped": True}, "chat 1": {"skipped": True}}
    seen = router.observed(plan, down)
    assert seen["chats"] == [] and seen["worker_health"] == dict.fromkeys(plan["worker_urls"])
    assert not router.judge(plan, seen)["ok"]
