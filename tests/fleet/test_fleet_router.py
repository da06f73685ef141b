"""The real router in front of three stand-in servers on SSH test hosts (issues #12, #23): the default package
(smg, SGLang's router since it moved to SMG), or the one HICACHE_TEST_ROUTER_PACKAGE names (sglang-router for 0.3.2),
at the version this release was checked with (hicachectl/plans/router.py CHECKED_VERSIONS), from a wheelhouse fetched here.

- cache-aware routing: 30 prompts sharing a long prefix land on one server (each server's own
  sglang:num_requests_total), unlike round_robin;
- a rolling `hicachectl upgrade` while a client streams requests through the router: no request fails, every server
  runs the new image, and each server left the router and had no request running or queued before it was stopped.

How "drained before its restart" is observed, without trusting the playbook: a monitor polls the router's
GET /workers and every server's /metrics (running + queued gauges) every 0.1 s from this machine: the router's listing
says when it removed each worker, and the server's journal when systemd began stopping it.
For each server: the removal precedes the stop, and a /metrics sample taken after the removal and before the stop
shows no request running or queued. The router sends a removed worker nothing new, so nothing was in flight at the
stop. The router retries a failed request on another worker by default, so "no failed request" alone would not
prove a drain; the two observations above do.
"""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import os
import pathlib
import re
import threading
import time
import urllib.error
import urllib.request

import pytest
from fleet import HEALTH_TIMEOUT, STANDIN, Fleet
from support import cli, cli_json

from hicachectl.plans.router import CHECKED_VERSIONS

pytestmark = pytest.mark.slow

ROUTER_PACKAGE = os.environ.get("HICACHE_TEST_ROUTER_PACKAGE", "smg")
ROUTER_VERSION = CHECKED_VERSIONS[ROUTER_PACKAGE]
WHEELHOUSE = pathlib.Path.home() / f".cache/hicache-deploy/router-wheels-{ROUTER_PACKAGE}-{ROUTER_VERSION}"
ROUTER_PORT = 30080
BASE_VARS = {
    "hicache_container_runtime": "none",
    "hicache_launcher": ["python3", STANDIN],
    "hicache_served_model_name": "gpt-oss-20b",
    "hicache_page_size": 16,
    "hicache_health_timeout": HEALTH_TIMEOUT,
    "hicache_host": "0.0.0.0",  # the router reaches the servers over the test bed's network
    "hicache_image": "lmsysorg/sglang:v0.5.21-cu129",
    # A restart takes 5 s (model loading), a request about 0.25 s (800 words at 300 us each): long enough that a
    # server stopped without a drain would be seen cutting requests.
    "hicache_container_env": {"STANDIN_LOAD_SECONDS": "5", "STANDIN_PREFILL_US_PER_TOKEN": "300"},
    "hicache_router_wheelhouse": str(WHEELHOUSE),
    "hicache_router_package": ROUTER_PACKAGE,
    # one L3 tier for the three servers (a host directory mounted into each): warm prompts hit on any of them
    "hicache_storage_backend": "file",
    "hicache_storage_type": "local",
    "hicache_cache_dir": "/mnt/kvcache",
    "hicache_l3_share": "router-bed",
    "hicache_write_policy": "write_through",
}
ANSI = re.compile(r"\x1b\[[0-9;]*m")


@pytest.fixture(scope="module")
def bed(tmp_path_factory):
    if not WHEELHOUSE.is_dir():
        import subprocess
        import sys
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", f"{ROUTER_PACKAGE}=={ROUTER_VERSION}", "-d", str(WHEELHOUSE)], check=True)
    shared = tmp_path_factory.mktemp("router-l3")
    fleet = Fleet(tmp_path_factory.mktemp("router"), 4, prefix="hicache-router", volumes=(f"{shared}:/mnt/kvcache",)).up()
    try:
        names = sorted(fleet.hosts)
        servers, router = names[:3], names[3]
        fleet.install_standin(servers)
        venv_support(fleet, router)
        urls = {s: f"http://{fleet.address(s)}:30000" for s in servers}
        yield fleet, servers, router, urls, f"http://{fleet.address(router)}:{ROUTER_PORT}"
    finally:
        fleet.down()


def venv_support(fleet, host):
    """The router role makes a virtualenv; the test hosts' minimal Debian lacks python3-venv and reaches no mirror,
    so its packages are fetched here (this machine runs the same Debian) and installed there."""
    import subprocess

    debs = fleet.workdir / "debs"
    debs.mkdir(exist_ok=True)
    subprocess.run(["apt-get", "download", "-q", "python3-venv", "python3.11-venv", "python3-pip-whl", "python3-setuptools-whl",
                    "python3-distutils", "python3-lib2to3", "python3-packaging"],
                   cwd=debs, check=True, capture_output=True)
    fleet.ssh(host, "mkdir -p /tmp/debs")
    for deb in debs.glob("*.deb"):
        subprocess.run(["podman", "cp", str(deb), f"{host}:/tmp/debs/"], check=True)
    done = fleet.ssh(host, "dpkg -i /tmp/debs/*.deb")
    assert done.returncode == 0, done.stdout + done.stderr


def inventory(bed, name, **extra):
    fleet, servers, router, urls, _ = bed
    return fleet.inventory(extra_vars={**BASE_VARS, **extra}, name=name, routers=(router,),
                           host_vars={s: {"hicache_worker_url": urls[s]} for s in servers})


def get(url, timeout=5.0):
    """(status, body); status 0 when no answer came within `timeout` (a slow answer, neither up nor down), -1 when the
    connection failed (nothing listening: refused or reset) or the answer was cut (the server stopping mid-answer)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except http.client.HTTPException:  # IncompleteRead, BadStatusLine: a server that went away while answering
        return -1, ""
    except OSError as exc:  # URLError wraps a connect timeout in .reason; a read timeout is raised as it is
        timed_out = isinstance(exc, TimeoutError) or isinstance(getattr(exc, "reason", None), TimeoutError)
        return (0 if timed_out else -1), ""


def chat(router_url, prompt, timeout=60.0):
    body = json.dumps({"model": "gpt-oss-20b", "messages": [{"role": "user", "content": prompt}], "max_tokens": 1}).encode()
    request = urllib.request.Request(router_url + "/v1/chat/completions", data=body, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return response.status, json.loads(response.read())


def requests_total(url):
    status, text = get(url + "/metrics")
    assert status == 200, f"{url}/metrics answered {status}"
    return float(re.search(r"^sglang:num_requests_total (\S+)", text, re.M)[1])


def in_flight(text):
    return sum(float(v) for v in re.findall(r"^sglang:num_(?:running|queue)_reqs(?:\{[^}]*\})? (\S+)", text, re.M))


def listed(router_url):
    status, text = get(router_url + "/workers")
    return {w["url"]: w["is_healthy"] for w in json.loads(text)["workers"]} if status == 200 else None


def wait_listed(router_url, urls, timeout=60):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        workers = listed(router_url)
        if workers is not None and all(workers.get(u) is True for u in urls):
            return
        time.sleep(0.5)
    raise AssertionError(f"the router at {router_url} does not list {urls} healthy: {listed(router_url)}")


def share_of(bed, prompts):
    """Send the prompts through the router one after the other; per server, how many it received."""
    _, servers, _, urls, router_url = bed
    before = {s: requests_total(urls[s]) for s in servers}
    for prompt in prompts:
        status, _ = chat(router_url, prompt)
        assert status == 200
    return {s: requests_total(urls[s]) - before[s] for s in servers}


def shared_prefix_prompts(tag, n=30, words=1500):
    prefix = " ".join(f"{tag}-{i}" for i in range(words))
    return [f"{prefix} tail {i} {tag}" for i in range(n)]


def journal(fleet, host, unit):
    """(realtime seconds, message) of the unit's journal entries, ANSI colours removed."""
    out = fleet.ssh(host, f"journalctl -u {unit} -o json --no-pager").stdout
    entries = []
    for line in out.splitlines():
        entry = json.loads(line)
        message = entry.get("MESSAGE", "")
        if isinstance(message, list):  # journald stores a message with control characters as bytes
            message = bytes(message).decode(errors="replace")
        entries.append((int(entry["__REALTIME_TIMESTAMP"]) / 1e6, ANSI.sub("", message or "")))
    return entries


def main_pid(fleet, host):
    return fleet.ssh(host, "systemctl show --property=MainPID --value sglang-hicache.service").stdout.strip()


def test_deploy_then_cache_aware_routing_keeps_a_shared_prefix_on_one_server_unlike_round_robin(bed):
    fleet, servers, router, urls, router_url = bed
    run = cli("deploy", "--inventory", str(inventory(bed, "cache-aware")))
    assert run.returncode == 0, run.stdout + run.stderr
    # the servers go before the router, which this run starts: no note about a router not running (#34)
    assert "refused the connection" not in run.stdout + run.stderr, run.stdout + run.stderr
    wait_listed(router_url, urls.values())
    # verify asks the router too: every server known and healthy, a request through it answered
    checked = cli("verify", "--inventory", str(inventory(bed, "cache-aware")), "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    report = json.loads(checked.stdout)
    assert set(report["hosts"]) == {*servers, router}, report
    router_checks = {c["check"]: c["status"] for c in report["hosts"][router]["checks"]}
    assert router_checks and all(status == "pass" for status in router_checks.values()), router_checks
    # status shows the router beside the servers, read on its host: its unit, its package and every server listed healthy
    shown = cli("status", "--inventory", str(inventory(bed, "cache-aware")), "--json")
    assert shown.returncode == 0, shown.stdout + shown.stderr
    state = json.loads(shown.stdout)["hosts"]
    assert set(state) == {*servers, router}, state
    assert state[router]["role"] == "router" and state[router]["ok"] and state[router]["unit"] == "active", state[router]
    assert state[router]["workers"]["listed healthy"] == len(servers) and not state[router]["problems"], state[router]
    table = cli("status", "--inventory", str(inventory(bed, "cache-aware")))
    assert any(line.split()[:1] == [router] for line in table.stdout.splitlines()), table.stdout

    counts = share_of(bed, shared_prefix_prompts("alpha"))
    print(f"cache_aware: {counts}")
    assert sum(counts.values()) == 30, counts
    assert max(counts.values()) >= 27, f"cache_aware spread a shared prefix: {counts}"

    rr = cli("deploy", "--inventory", str(inventory(bed, "round-robin", hicache_router_policy="round_robin")), "--limit", router)
    assert rr.returncode == 0, rr.stdout + rr.stderr
    wait_listed(router_url, urls.values())
    counts = share_of(bed, shared_prefix_prompts("beta"))
    print(f"round_robin: {counts}")
    assert sum(counts.values()) == 30 and min(counts.values()) > 0 and max(counts.values()) < 27, f"round_robin: {counts}"


def test_no_op_deploys_of_servers_and_router_change_nothing_and_plan_gates_on_it(bed):
    """#34: a deploy that changes nothing says so on the servers and the router, every time (the workers file lists
    the servers in the inventory's order: Ansible's set-based `difference` reordered them from run to run before), and
    plan --detailed-exitcode says 0 then, 2 with a pending change. After the test above the router runs round_robin:
    its inventory is the fleet's as it is. Its own test, so that each has its own time bound (pytest-timeout)."""
    fleet, servers, router, urls, router_url = bed
    as_it_is = inventory(bed, "round-robin", hicache_router_policy="round_robin")
    for attempt in range(3):
        again = cli_json("deploy", "--inventory", str(as_it_is))
        changed = {h: r["changed"] for h, r in again["hosts"].items()}
        assert again["ok"] and changed == dict.fromkeys([*servers, router], 0), (attempt, changed, again["hosts"])
    gate = cli("plan", "--inventory", str(as_it_is), "--detailed-exitcode")
    assert gate.returncode == 0, gate.stdout + gate.stderr  # nothing to change
    pending = cli("plan", "--inventory", str(inventory(bed, "pending")), "--detailed-exitcode")  # cache_aware, the default
    assert pending.returncode == 2, pending.stdout + pending.stderr  # the router's unit would change


class Monitor(threading.Thread):
    """Samples the router's worker list and every server's /metrics every 0.1 s."""

    def __init__(self, router_url, urls):
        super().__init__(daemon=True)
        self.router_url, self.urls = router_url, urls
        self.samples = []  # (time, listed urls or None, {url: (status, in-flight)})
        self.stop = threading.Event()
        self.error = None  # what ended the sampling early: the test fails on it rather than on the samples it lacks

    def run(self):
        try:
            while not self.stop.is_set():
                workers = listed(self.router_url)
                servers = {}
                for url in self.urls:
                    status, text = get(url + "/metrics", timeout=2)
                    servers[url] = (status, in_flight(text) if status == 200 else None)
                self.samples.append((time.time(), workers, servers))
                time.sleep(0.1)
        except Exception as exc:  # noqa: BLE001 - kept for the test's own assertion
            self.error = repr(exc)
            raise


class Client(threading.Thread):
    """A steady stream of chat completions through the router (about 5 a second), each on its own thread."""

    def __init__(self, router_url):
        super().__init__(daemon=True)
        self.router_url = router_url
        self.ok, self.failed = 0, []
        self.stop = threading.Event()
        self.lock = threading.Lock()

    def one(self, i):
        try:
            status, body = chat(self.router_url, " ".join(f"req{i}-{w}" for w in range(800)))
            good = status == 200 and body["choices"][0]["message"]["content"]
        except Exception as exc:  # noqa: BLE001 - every failure the client sees counts
            good, status = False, repr(exc)
        with self.lock:
            if good:
                self.ok += 1
            else:
                self.failed.append((time.time(), status))

    def run(self):
        with concurrent.futures.ThreadPoolExecutor(max_workers=16) as pool:
            i = 0
            while not self.stop.is_set():
                pool.submit(self.one, i)
                i += 1
                time.sleep(0.2)


def test_a_rolling_upgrade_through_the_router_fails_no_request_and_drains_each_server_before_its_restart(bed):
    fleet, servers, router, urls, router_url = bed
    inv = inventory(bed, "rolling")
    cli("deploy", "--inventory", str(inv), check_rc=0)
    wait_listed(router_url, urls.values())
    pids = {s: main_pid(fleet, s) for s in servers}
    started = time.time()

    monitor, client = Monitor(router_url, list(urls.values())), Client(router_url)
    monitor.start()
    client.start()
    time.sleep(3)  # the stream is flowing before the first server leaves
    # Upgrades are declarative: the new image is the inventory's (docs/operations.md).
    upgraded = inventory(bed, "rolling-upgraded", hicache_image="lmsysorg/sglang:v0.5.23-cu129")
    upgrade = cli("upgrade", "--inventory", str(upgraded))
    time.sleep(3)
    client.stop.set()
    client.join(timeout=120)
    monitor.stop.set()
    monitor.join(timeout=10)
    assert upgrade.returncode == 0, upgrade.stdout + upgrade.stderr
    assert monitor.error is None, f"the monitor stopped sampling: {monitor.error}"

    print(f"client: {client.ok} requests ok, {len(client.failed)} failed")
    assert client.failed == [], f"{len(client.failed)} failed requests of {client.ok + len(client.failed)}: {client.failed[:5]}"
    assert client.ok >= 50, f"only {client.ok} requests went through: the stream did not cover the upgrade"
    for s in servers:
        assert '"image": "lmsysorg/sglang:v0.5.23-cu129"' in fleet.ssh(s, "cat /opt/sglang-hicache/cfg/deployed.json").stdout
        assert main_pid(fleet, s) != pids[s], f"{s} was not restarted"

    # When the router stopped listing each worker, from its own /workers API as the monitor sampled it (0.1 s): the same
    # for smg and sglang-router, whose logs word a removal differently. A sample is never earlier than the removal.
    removed = {}
    for at, workers, _ in monitor.samples:
        for s, url in urls.items():
            if at >= started and workers is not None and url not in workers:
                removed.setdefault(s, at)
    for s, url in urls.items():
        stops = [at for at, message in journal(fleet, s, "sglang-hicache.service") if at >= started and message.startswith("Stopping")]
        assert len(stops) == 1, f"{s}: {len(stops)} stops during the upgrade"
        stop = stops[0]
        assert s in removed, f"the router never stopped listing {s} ({url})"
        assert removed[s] < stop, f"{s} was stopped {stop - removed[s]:.2f} s before the router removed it"
        between = [(at, servers_[url]) for at, workers, servers_ in monitor.samples if removed[s] < at < stop]
        assert between, f"{s}: no sample of its /metrics between its removal and its stop"
        assert between[-1][1] == (200, 0), f"{s}: at its last sample before the stop it had {between[-1][1]} (status, in flight)"
        print(f"{s}: removed {stop - removed[s]:.2f} s before its stop; {len(between)} samples between, the last {stop - between[-1][0]:.2f} s "
              f"before the stop: {between[-1][1]} (status, in flight); peak in flight while out {max(v[1] or 0 for _, v in between)}")
        # Never listed by the router while it was down: the samples where its /metrics answered other than 200 or
        # refused the connection. A sample that timed out (status 0: the stand-in slow on a loaded machine, seen in a
        # full run) shows neither.
        down = [at for at, workers, servers_ in monitor.samples if servers_[url][0] not in (200, 0) and workers is not None and url in workers]
        assert down == [], f"the router listed {s} while it did not answer, at {down[:3]}"
    # Batches of one: each server was stopped only after the previous one was back in the router.
    order = sorted(servers, key=lambda s: removed[s])
    for first, second in zip(order, order[1:], strict=False):
        back = [at for at, workers, _ in monitor.samples if at > removed[first] and workers and workers.get(urls[first]) is True]
        assert back and back[0] < removed[second], f"{second} left the router before {first} was back"


def test_the_shared_tier_proof_and_bench_through_the_router_warm_prompts_come_from_the_shared_tier(bed, tmp_path):
    fleet, servers, router, urls, router_url = bed
    # The image the rolling upgrade above left on the servers: the inventory's older one would be a downgrade, refused.
    # SGLang's --max-total-tokens gives each server a GPU pool of 4096 tokens (the stand-in then models it and the host
    # pool, hicache_ratio 4 times as large), so bench's filler can push the prompts off the GPU before its host phase.
    inv = inventory(bed, "bench", hicache_image="lmsysorg/sglang:v0.5.23-cu129", hicache_extra_args=["--max-total-tokens", "4096"],
                    hicache_ratio=4)
    run = cli("deploy", "--inventory", str(inv))
    assert run.returncode == 0, run.stdout + run.stderr
    # the cross-server proof behind the router: each server restarted (drained from the router, put back) hits the
    # pages its neighbour wrote on the shared tier; the router still lists every server healthy afterwards
    proof = cli("verify", "--inventory", str(inv), "--l3", "--json")
    assert proof.returncode == 0, proof.stdout + proof.stderr
    report = json.loads(proof.stdout)
    for server in servers:
        checks = {c["check"]: c for c in report["hosts"][server]["checks"]}
        assert checks["L3 hit across servers"]["status"] == "pass", checks
    wait_listed(router_url, urls.values())
    out = tmp_path / "bench"
    run = cli("bench", "-i", str(inv), "--router", "--concurrency", "1,2", "--input-len", "1200", "--out", str(out), "--json", "--timeout", "300")
    assert run.returncode == 0, run.stdout + run.stderr
    data = json.loads(run.stdout)
    assert router in data["target"] and data["warm_after"]
    levels = {row["concurrency"]: row for row in data["levels"]}
    assert set(levels) == {1, 2}
    for level, requests in data["requests"].items():
        cold, warm = requests["cold"], requests["warm"]
        assert len(cold) == len(warm) == int(level)
        # every warm prompt came back from L3 (the stand-in loads 2 us per cached token, prefills 300 us per token)
        assert all(q["cached_tokens"] >= 1200 - 32 for q in warm), warm
        assert all(q["cached_tokens"] == 0 for q in cold), cold
    # the host phase behind the router: the filler went to each server itself (GPU pool + the level's prompts each),
    # and the router sent the prompts back to the server that held them, which served them from host memory
    for row in levels.values():
        assert row["host_gpu_pool_tokens"] == 4096 * len(servers) and row["host_notes"] == [], row
        assert row["host_filler_tokens"] >= len(servers) * (4096 + row["concurrency"] * 1200), row
        assert row["host_served_from"].startswith("host ") and row["host_sources"]["host"] >= 0.9, row
    assert (out / "bench.json").exists() and (out / "bench.png").exists()
