"""`hicachectl status` beyond what tests/unit/cli/test_judges.py holds: the L3 backend a server has attached now (SGLang's
GET /hicache/storage-backend, the only place a runtime detach shows), and the routers (group hicache_routers): their
unit, the router package's version and the workers GET /workers lists against the inventory's servers. The states are
written out in the shape playbooks/status.yml reports them (hicache_status_report)."""

from __future__ import annotations

import pytest
from helpers import deployment

from hicachectl.ops import status

HASH = "c0ffee"
SERVERS = ("gpu-a", "gpu-b")
URLS = ("http://10.0.0.1:30000", "http://10.0.0.2:30000")
NO_ADMIN_KEY = {"error": "This endpoint requires admin API key, but this server was started without one (admin-api-key). "
                         "Restart with --admin-api-key to enable."}  # SGLang 0.5.23 http_server.py 2260-2271


def server_state(**changes):
    """A server that runs the inventory's config, healthy, and answers GET /hicache/storage-backend with `backend`."""
    read = {"deployed": {"config_hash": HASH, "image": "lmsysorg/sglang:v0.5.20-cu130"}, "installed": {"config_hash": HASH},
            "server_info": {"hicache_storage_backend": "file"}, "wanted_config_hash": HASH, "unit": "active",
            "since": "Mon 2026-11-30 10:00:00 UTC", "main_pid": "42", "restarts": "0", "health": "200",
            "storage_backend": {"status": 200, "json": {"hicache_storage_backend": "file", "hicache_storage_backend_extra_config": None,
                                                        "hicache_storage_prefetch_policy": "timeout", "hicache_write_policy": "write_through"}}}
    return {**read, **changes}


def worker(url, healthy=True):
    """One entry of the router's GET /workers (hicachectl/plans/router.py: smg 1.13.0 and sglang-router 0.3.2 alike)."""
    return {"id": url, "url": url, "model_id": "m", "is_healthy": healthy, "worker_type": "regular"}


def router_state(**changes):
    """A router that runs the pinned smg, healthy, listing both inventory servers healthy."""
    read = {"role": "router", "package": "smg", "version": "1.13.0", "wanted_version": "1.13.0", "dir": "/opt/sglang-router",
            "service": "sglang-router.service", "unit": "active", "load_state": "loaded", "since": "Mon 2026-11-30 09:00:00 UTC",
            "main_pid": "7", "health": "200", "workers": {"status": 200, "json": {"workers": [worker(u) for u in URLS], "total": 2}},
            "worker_urls": list(URLS), "servers": list(SERVERS)}
    return {**read, **changes}


@pytest.fixture(scope="module")
def servers():
    d = deployment("local")
    assert d.storage_backend == "file"
    return dict.fromkeys(SERVERS, d)


def fine(servers):
    return {h: server_state() for h in servers}


# --- the L3 backend ---------------------------------------------------------------------------------------------

def test_a_backend_detached_at_runtime_makes_the_server_not_fine(servers):
    detached = server_state(storage_backend={"status": 200, "json": {"hicache_storage_backend": None}})
    verdict = status.judge_hosts(servers, {**fine(servers), "gpu-b": detached}, {})
    assert verdict["exit_code"] == status.EXIT_NOT_FINE and verdict["hosts"]["gpu-a"]["ok"] and not verdict["hosts"]["gpu-b"]["ok"]
    problem = verdict["rows"][1][6]
    assert problem.startswith("no storage backend attached: file was detached at runtime") and "`hicachectl restart`" in problem
    assert verdict["hosts"]["gpu-b"]["l3_backend"]["status"] == "fail"
    assert verdict["lines"][-1] == "status: 2 server(s): 1 fine, 1 not fine"


def test_the_attached_backend_passes_and_shows_in_json_only(servers):
    verdict = status.judge_hosts(servers, fine(servers), {})
    assert verdict["exit_code"] == 0 and all(row[6] == "" for row in verdict["rows"])
    assert verdict["hosts"]["gpu-a"]["l3_backend"]["status"] == "pass"
    assert verdict["lines"][1:] == ["status: 2 server(s): 2 fine"]


def test_a_server_without_the_route_is_not_checked_said_under_the_table(servers):
    old = server_state(storage_backend={"status": 404, "json": {"detail": "Not Found"}})
    verdict = status.judge_hosts(servers, {**fine(servers), "gpu-a": old}, {})
    assert verdict["exit_code"] == 0 and verdict["hosts"]["gpu-a"]["ok"]  # not checked: never a failure, never a pass
    assert verdict["hosts"]["gpu-a"]["l3_backend"]["status"] == "not checked"
    assert any(line.startswith("gpu-a: L3 backend not checked: the server has no GET /hicache/storage-backend") for line in verdict["lines"])
    assert verdict["lines"][-1] == "status: 2 server(s): 2 fine (1 check(s) not made)"


def test_without_an_admin_key_the_started_backend_counts_as_attached(servers):
    verdict = status.judge_hosts(servers, {h: server_state(storage_backend={"status": 400, "json": NO_ADMIN_KEY}) for h in servers}, {})
    assert verdict["exit_code"] == 0 and {h["l3_backend"]["status"] for h in verdict["hosts"].values()} == {"pass"}


# --- routers ----------------------------------------------------------------------------------------------------

def test_routers_are_listed_after_the_servers_and_the_counts_agree(servers):
    verdict = status.judge_hosts(servers, {**fine(servers), "router-01": router_state()}, {}, routers=["router-01"])
    assert verdict["exit_code"] == 0
    assert [row[0] for row in verdict["rows"]] == ["gpu-a", "gpu-b", "router-01"]
    assert verdict["rows"][2] == ["router-01", "active", "Mon 2026-11-30 09:00:00 UTC", "smg 1.13.0", "workers 2/2", "ok", ""]
    assert verdict["hosts"]["router-01"]["role"] == "router" and verdict["hosts"]["router-01"]["ok"]
    assert verdict["lines"][-1] == "status: 2 server(s) and 1 router(s): 3 fine"
    assert set(verdict["hosts"]) == {"gpu-a", "gpu-b", "router-01"}


def test_a_router_missing_a_server_or_sending_elsewhere_is_not_fine(servers):
    listing = {"status": 200, "json": {"workers": [worker(URLS[0]), worker("http://10.9.9.9:30000")]}}
    verdict = status.judge_hosts(servers, {**fine(servers), "router-01": router_state(workers=listing)}, {}, routers=["router-01"])
    row = verdict["rows"][2]
    assert verdict["exit_code"] == status.EXIT_NOT_FINE and row[4] == "workers 1/2"
    assert row[6] == ("does not list gpu-b (http://10.0.0.2:30000) (`hicachectl deploy` adds the inventory's servers); "
                      "also sends to http://10.9.9.9:30000, not an inventory server (`hicachectl deploy` takes it out)")
    assert verdict["hosts"]["router-01"]["workers"]["missing"] == ["gpu-b (http://10.0.0.2:30000)"]
    assert verdict["lines"][-1] == "status: 2 server(s) and 1 router(s): 2 fine, 1 not fine"


def test_an_unhealthy_worker_another_version_and_a_stopped_router(servers):
    sick = router_state(workers={"status": 200, "json": {"workers": [worker(URLS[0]), worker(URLS[1], healthy=False)]}})
    assert "lists gpu-b (http://10.0.0.2:30000) unhealthy" in status.judge_router(sick)["problems"][0]
    older = status.judge_router(router_state(version="1.12.0"))
    assert older["problems"] == ["runs smg 1.12.0, the inventory pins 1.13.0 (`hicachectl deploy`)"]
    stopped = status.judge_router(router_state(unit="failed", health="-1", workers=None))
    assert stopped["problems"] == ["unit sglang-router.service is failed", "nothing answers /health"] and not stopped["healthy"]
    row = status.judge_hosts({}, {"router-01": router_state(unit="failed", health="-1", workers=None)}, {}, routers=["router-01"])["rows"][0]
    assert row[1] == "failed" and row[4] == "workers ?" and row[5] == "down"


def test_a_router_never_deployed_says_so_and_one_not_read_is_exit_2(servers):
    never = router_state(version="", unit="inactive", load_state="not-found", health="-1", workers=None)
    verdict = status.judge_hosts(servers, {**fine(servers), "router-01": never}, {"router-02": "unreachable: ssh refused"},
                                 routers=["router-02", "router-01"])
    assert verdict["exit_code"] == status.EXIT_NOT_READ
    assert verdict["rows"][2][:2] == ["router-01", "not deployed"] and "`hicachectl deploy`" in verdict["rows"][2][6]
    assert verdict["rows"][3] == ["router-02", "?", "", "", "", "", "unreachable: ssh refused"]
    assert verdict["hosts"]["router-02"] == {"ok": False, "role": "router", "error": "unreachable: ssh refused"}
    assert verdict["lines"][-1] == "status: 2 server(s) and 2 router(s): 2 fine, 1 not fine, 1 not read"
