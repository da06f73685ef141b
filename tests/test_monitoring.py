"""`hicachectl monitoring`: file_sd targets, alert rules and a Grafana dashboard, checked against SGLang's metric names.

Fast: targets from an inventory, every metric name one the stand-in exports or one SGLang-only with its source.
Slow (Debian's prometheus and promtool, installed when missing): every query parsed by promtool, the alert logic
through `promtool test rules` on synthetic series; Prometheus scrapes three stand-ins through the rendered targets
and rules, every dashboard query must return data after traffic, and stopping a stand-in must fire HiCacheServerDown.
"""

from __future__ import annotations

import json
import math
import os
import pathlib
import re
import shutil
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml
from support import ROOT, cli

from hicachectl.ops import metrics, monitoring

sys.path.insert(0, str(ROOT / "tests/infra"))
from fleet import free_port  # noqa: E402

STANDIN_ARGS = ("--served-model-name", "m", "--page-size", "4", "--hicache-storage-backend", "file", "--enable-metrics", "--enable-cache-report")
# Names SGLang exports that the stand-in does not, each with where SGLang registers it.
SGLANG_ONLY = {
    "sglang:hicache_backup_dropped_tokens_total": "StorageMetricsCollector.backup_dropped_tokens_total, "
                                                  "python/sglang/srt/observability/metrics_collector.py (0.5.20-0.5.23); "
                                                  "created at the first dropped backup, the stand-in never drops one",
}
PROMETHEUS_OWN = {"up"}


def inventory(tmp_path, ports: dict[str, int], **overrides) -> pathlib.Path:
    """An inventory of hosts on 127.0.0.1 (distinct SSH ports, so one machine is not named twice), each server on its port."""
    root = tmp_path / "inv"
    (root / "group_vars").mkdir(parents=True)
    (root / "host_vars").mkdir()
    base = yaml.safe_load((ROOT / "inventories/local/group_vars/all.yml").read_text())
    (root / "group_vars/all.yml").write_text(yaml.safe_dump({**base, "hicache_host": "0.0.0.0", "hicache_served_model_name": "m",
                                                             "hicache_page_size": 4, **overrides}))
    hosts = {name: {"ansible_host": "127.0.0.1", "ansible_port": 2200 + i, "hicache_port": port} for i, (name, port) in enumerate(ports.items())}
    (root / "hosts.yml").write_text(yaml.safe_dump({"all": {"children": {"hicache_servers": {"hosts": hosts}}}}))
    return root


def render(tmp_path, inv) -> pathlib.Path:
    out = tmp_path / "monitoring"
    proc = cli("monitoring", "-i", str(inv), "--out", str(out), check_rc=0)
    assert "wrote" in proc.stdout
    return out


def all_queries() -> list[tuple[str, str]]:
    """(where, expr) of every dashboard panel query and every alert rule."""
    board = monitoring.dashboard("t")
    found = [(f"panel {title!r} {ref}", expr) for title, ref, expr in monitoring.panel_queries(board)]
    found += [(f"alert {r['alert']}", r["expr"]) for g in monitoring.alert_rules()["groups"] for r in g["rules"]]
    return found


# --- fast ----------------------------------------------------------------------------------------------------

def test_targets_from_the_inventory_with_host_and_model_labels(tmp_path):
    inv = inventory(tmp_path, {"gpu-a": 30001, "gpu-b": 30002})
    out = render(tmp_path, inv)
    groups = json.loads((out / monitoring.TARGETS_FILE).read_text())
    assert [g["targets"] for g in groups] == [["127.0.0.1:30001"], ["127.0.0.1:30002"]]
    assert groups[0]["labels"] == {"inventory": "inv", "inventory_host": "gpu-a", "served_model": "m",
                                   "hicache_write_policy": "write_through", "hicache_storage_backend": "file"}
    config = yaml.safe_load((out / monitoring.PROMETHEUS_FILE).read_text())
    assert config["scrape_configs"][0]["file_sd_configs"] == [{"files": [monitoring.TARGETS_FILE]}]
    assert config["rule_files"] == [monitoring.RULES_FILE]
    board = json.loads((out / monitoring.DASHBOARD_FILE).read_text())
    assert [v["name"] for v in board["templating"]["list"]] == ["datasource", "instance"]
    # again without --force: nothing overwritten (exit 2)
    assert cli("monitoring", "-i", str(inv), "--out", str(out)).returncode == 2


def test_a_loopback_server_on_a_remote_host_and_metrics_off_are_named(tmp_path):
    from hicachectl.config.deployment import build

    d = build("gpu-01", {"hicache_image": "lmsysorg/sglang:v0.5.21", "hicache_model_path": "/m", "hicache_host": "127.0.0.1",
                               "hicache_port": 8000, "hicache_enable_metrics": False})
    target, notes = monitoring.server_target("prod", d, {"ansible_host": "10.0.0.5"})
    assert target.address == "10.0.0.5:8000"
    assert any("listens on 127.0.0.1 only" in n for n in notes) and any("hicache_enable_metrics is false" in n for n in notes)
    bound = build("gpu-02", {"hicache_image": "lmsysorg/sglang:v0.5.21", "hicache_model_path": "/m", "hicache_host": "fd00::7", "hicache_port": 8000})
    assert monitoring.server_target("prod", bound, {"ansible_host": "10.0.0.6"})[0].address == "[fd00::7]:8000"
    # #34: the URL the routers reach a server at is where Prometheus scrapes it: two servers behind one ansible_host
    # (another port each) are two targets, not one
    behind = {"hicache_image": "lmsysorg/sglang:v0.5.21", "hicache_model_path": "/m", "hicache_host": "0.0.0.0"}
    one = build("gpu-03", {**behind, "hicache_port": 30000, "hicache_worker_url": "http://gw.example.internal:31003"})
    two = build("gpu-04", {**behind, "hicache_port": 30000, "hicache_worker_url": "https://gw.example.internal:31004/"})
    reached = {"ansible_host": "10.0.0.7"}
    targets = [monitoring.server_target("prod", d, reached)[0] for d in (one, two)]
    assert [t.address for t in targets] == ["gw.example.internal:31003", "gw.example.internal:31004"]
    assert "__scheme__" not in targets[0].labels and targets[1].labels["__scheme__"] == "https"
    assert monitoring.router_targets("prod") == []  # the hook: no routers group yet
    assert monitoring.file_sd(monitoring.router_targets("prod", {"r1": ("10.0.0.9", 30080)})) == [
        {"targets": ["10.0.0.9:30080"], "labels": {"inventory": "prod", "inventory_host": "r1"}}]


@pytest.mark.slow  # the stand-in's L3 is SGLang's own file backend (CPU torch): a start takes 5-20 s here
def test_every_metric_is_one_sglang_exports_and_the_standin_or_its_source_shows_it(standin):
    port, _ = standin(*STANDIN_ARGS)
    prompt = " ".join(f"w{i}" for i in range(40))
    for _ in range(2):
        chat(port, prompt)
    exported = {name for name, _, _ in metrics.parse(get(f"http://127.0.0.1:{port}/metrics"))}
    used = set()
    for where, expr in all_queries():
        names = {monitoring.base_metric(n) for n in monitoring.metric_names(expr)}
        assert names, f"{where}: no metric found in {expr}"
        unknown = names - set(monitoring.SGLANG_METRICS) - PROMETHEUS_OWN
        assert not unknown, f"{where}: {unknown} not among SGLang's metrics (hicachectl/ops/monitoring.py SGLANG_METRICS)"
        used |= {n for n in monitoring.metric_names(expr)}
    for name in used - PROMETHEUS_OWN:
        assert name in exported or name in SGLANG_ONLY, f"{name}: neither exported by the stand-in nor listed as SGLang-only with its source"
    assert "sglang:time_to_first_token_seconds_bucket" in used and "sglang:time_to_first_token_seconds_bucket" in exported
    text = get(f"http://127.0.0.1:{port}/metrics")
    assert 'sglang:cached_tokens_total{cache_source="storage"}' in text  # the label SGLang uses for the tier


@pytest.mark.slow  # needs Debian's promtool, installed by the fixture when missing (never skipped)
def test_every_query_parses_and_the_rules_check(tmp_path, prometheus_installed):
    check_with_promtool(tmp_path)


@pytest.mark.slow  # needs Debian's promtool, installed by the fixture when missing (never skipped)
def test_alert_logic_on_synthetic_series(tmp_path, prometheus_installed):
    """promtool test rules: a server down, an L3 hit share collapsing after a restart, write-through backups stalling,
    backups dropped; each alert's annotations name the instance."""
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(monitoring.alert_rules(), sort_keys=False, width=1000))
    rules = {r["alert"]: r for r in monitoring.alert_rules()["groups"][0]["rules"]}
    target = {"job": monitoring.SERVER_JOB, "instance": "10.0.0.5:30000", "inventory": "prod", "inventory_host": "gpu-01",
              "served_model": "m", "hicache_write_policy": "write_through", "hicache_storage_backend": "file"}

    def series(name, values, **labels):
        return {"series": name + "{" + ",".join(f'{k}="{v}"' for k, v in {**target, **labels}.items()) + "}", "values": values}

    def expected(alert, value="", **extra):
        labels = {**target, **extra}
        shown = {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: labels.get(m[1], ""), v) for k, v in rules[alert]["annotations"].items()}
        shown = {k: re.sub(r"\{\{ \$value( \| humanizePercentage)? \}\}", value, v) for k, v in shown.items()}
        assert all(target["instance"] in v for v in shown.values()), f"{alert}: an annotation does not name the instance"
        return shown

    grouped = {"instance": target["instance"], "inventory_host": target["inventory_host"]}
    router = {"job": monitoring.ROUTER_JOB, "instance": "10.0.0.9:29000", "inventory": "prod", "inventory_host": "router-01"}
    router_shown = {k: re.sub(r"\{\{ \$labels\.(\w+) \}\}", lambda m: router.get(m[1], ""), v)
                    for k, v in rules["HiCacheRouterDown"]["annotations"].items()}
    assert all(router["instance"] in v for v in router_shown.values())
    tests = [
        {"interval": "15s", "input_series": [series("up", "1 1 0x10")],
         "alert_rule_test": [{"eval_time": "30s", "alertname": "HiCacheServerDown", "exp_alerts": []},
                             {"eval_time": "2m", "alertname": "HiCacheServerDown",
                              "exp_alerts": [{"exp_labels": {**target, "severity": "critical"}, "exp_annotations": expected("HiCacheServerDown")}]}]},
        # a router's metrics endpoint stops answering (#34: router alert rules)
        {"interval": "15s", "input_series": [{"series": "up{" + ",".join(f'{k}="{v}"' for k, v in router.items()) + "}", "values": "1 1 0x10"}],
         "alert_rule_test": [{"eval_time": "30s", "alertname": "HiCacheRouterDown", "exp_alerts": []},
                             {"eval_time": "2m", "alertname": "HiCacheRouterDown",
                              "exp_alerts": [{"exp_labels": {**router, "severity": "critical"}, "exp_annotations": router_shown}]}]},
        # 80% of prompt tokens from L3 for 75 minutes; then a restart with a new page size: no storage hit since.
        {"interval": "1m", "input_series": [
            series("sglang:prompt_tokens_total", "0+1000x75 0+1000x75", model_name="m", is_streaming="false"),
            series("sglang:cached_tokens_total", "0+800x75 _x75", model_name="m", cache_source="storage")],
         "alert_rule_test": [{"eval_time": "70m", "alertname": "HiCacheStorageHitRateCollapsed", "exp_alerts": []},
                             {"eval_time": "120m", "alertname": "HiCacheStorageHitRateCollapsed",
                              "exp_alerts": [{"exp_labels": {**grouped, "severity": "warning"},
                                              "exp_annotations": expected("HiCacheStorageHitRateCollapsed", "0%")}]}]},
        # write_through, 2000 new tokens a minute, nothing backed up
        {"interval": "1m", "input_series": [
            series("up", "1x40"),
            series("sglang:prompt_tokens_total", "0+2000x40", model_name="m", is_streaming="false"),
            series("sglang:backuped_tokens_total", "500x40", storage_backend="file", tp_rank="0")],
         "alert_rule_test": [{"eval_time": "30m", "alertname": "HiCacheL3BackupStalled",
                              "exp_alerts": [{"exp_labels": {**grouped, "severity": "critical"},
                                              "exp_annotations": expected("HiCacheL3BackupStalled", "30000")}]},
                             {"eval_time": "30m", "alertname": "HiCacheL3BackupDropped", "exp_alerts": []}]},
        # the same with backups flowing, and some dropped
        {"interval": "1m", "input_series": [
            series("up", "1x40"),
            series("sglang:prompt_tokens_total", "0+2000x40", model_name="m", is_streaming="false"),
            series("sglang:backuped_tokens_total", "0+1500x40", storage_backend="file", tp_rank="0"),
            series("sglang:hicache_backup_dropped_tokens_total", "0+10x40", storage_backend="file", tp_rank="0")],
         "alert_rule_test": [{"eval_time": "30m", "alertname": "HiCacheL3BackupStalled", "exp_alerts": []},
                             {"eval_time": "30m", "alertname": "HiCacheL3BackupDropped",
                              "exp_alerts": [{"exp_labels": {**grouped, "severity": "warning"},
                                              "exp_annotations": expected("HiCacheL3BackupDropped", "100")}]}]},
        # PP 2 (both stages log the same tokens) with DP attention 2 (each DP rank its own requests), the label sets of
        # SGLang's storage_attachment.py (0.5.23 lines 330-338; tp_rank is the attention-TP rank): 150 tokens dropped, not 300
        {"interval": "1m", "input_series": [
            series("sglang:hicache_backup_dropped_tokens_total", f"0+{per_minute}x40", storage_backend="file", tp_rank="0", dp_rank=dp,
                   pp_rank=pp, pp_size="2", attn_cp_rank="0", attn_cp_size="1")
            for dp, per_minute in (("0", 10), ("1", 5)) for pp in ("0", "1")],
         "alert_rule_test": [{"eval_time": "30m", "alertname": "HiCacheL3BackupDropped",
                              "exp_alerts": [{"exp_labels": {**grouped, "severity": "warning"},
                                              "exp_annotations": expected("HiCacheL3BackupDropped", "150")}]}]},
        # half the L3 hits not read before the prefetch deadline
        {"interval": "1m", "input_series": [
            series("sglang:storage_prefetch_hit_tokens_total", "0+1000x40", storage_backend="file", tp_rank="0"),
            series("sglang:storage_prefetch_unfulfilled_tokens_total", "0+500x40", storage_backend="file", tp_rank="0", reason="deadline"),
            series("sglang:storage_prefetch_unfulfilled_tokens_total", "0+900x40", storage_backend="file", tp_rank="0", reason="below_threshold")],
         "alert_rule_test": [{"eval_time": "30m", "alertname": "HiCachePrefetchTimeouts",
                              "exp_alerts": [{"exp_labels": {**grouped, "severity": "warning"},
                                              "exp_annotations": expected("HiCachePrefetchTimeouts", "50%")}]},
                             {"eval_time": "30m", "alertname": "HiCachePrefetchUnfulfilled", "exp_alerts": []}]},
    ]
    (tmp_path / "tests.yml").write_text(yaml.safe_dump({"rule_files": ["rules.yml"], "evaluation_interval": "15s", "tests": tests}, sort_keys=False, width=1000))
    proc = subprocess.run(["promtool", "test", "rules", str(tmp_path / "tests.yml")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def check_with_promtool(tmp_path, rules_file=None):
    """Every dashboard query (Grafana's variables put in) as a recording rule, and the alert rules: `promtool check rules`."""
    recording = [{"record": f"hicache_check:q{i}", "expr": monitoring.concrete(expr)} for i, (_, _, expr) in enumerate(monitoring.panel_queries(monitoring.dashboard("t")))]
    (tmp_path / "queries.yml").write_text(yaml.safe_dump({"groups": [{"name": "queries", "rules": recording}]}, width=1000))
    if rules_file is None:
        rules_file = tmp_path / "alerts.yml"
        rules_file.write_text(yaml.safe_dump(monitoring.alert_rules(), sort_keys=False, width=1000))
    proc = subprocess.run(["promtool", "check", "rules", str(tmp_path / "queries.yml"), str(rules_file)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"SUCCESS: {len(recording)} rules found" in proc.stdout


# --- slow: the real Prometheus against stand-ins -------------------------------------------------------------

def get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return r.read().decode()


def chat(port: int, prompt: str, stream: bool = False) -> dict | None:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", method="POST",
                                 data=json.dumps({"model": "m", "stream": stream, "messages": [{"role": "user", "content": prompt}]}).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        body = r.read()
    return None if stream else json.loads(body)


@pytest.fixture(scope="module")
def prometheus_installed():
    """Debian's prometheus (promtool comes with it), installed once if missing."""
    if shutil.which("prometheus") is None or shutil.which("promtool") is None:
        sudo = [] if os.geteuid() == 0 else ["sudo", "-n"]
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        proc = subprocess.run([*sudo, "apt-get", "install", "-y", "--no-install-recommends", "prometheus"], capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode != 0:
            subprocess.run([*sudo, "apt-get", "update"], capture_output=True, env=env, timeout=600)
            proc = subprocess.run([*sudo, "apt-get", "install", "-y", "--no-install-recommends", "prometheus"], capture_output=True, text=True, env=env, timeout=900)
        assert proc.returncode == 0, f"apt-get install prometheus failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}"
    return shutil.which("prometheus")


def api(base: str, path: str, **params) -> dict:
    url = f"{base}{path}" + ("?" + urllib.parse.urlencode(params) if params else "")
    body = json.loads(get(url))
    assert body["status"] == "success", body
    return body["data"]


def wait_for(what: str, check, seconds: float, step: float = 0.5):
    deadline = time.monotonic() + seconds
    last = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except (OSError, urllib.error.URLError, ValueError) as exc:
            last = exc
        else:
            if last:
                return last
        time.sleep(step)
    raise AssertionError(f"{what}: not within {seconds:.0f}s (last: {last!r})")


@pytest.mark.slow
def test_prometheus_scrapes_the_standins_every_panel_has_data_and_a_stopped_server_fires(tmp_path, standin, prometheus_installed):
    servers = {f"srv-{i}": standin(*STANDIN_ARGS) for i in range(3)}
    out = render(tmp_path, inventory(tmp_path, {name: port for name, (port, _) in servers.items()}))
    check_with_promtool(tmp_path, out / monitoring.RULES_FILE)
    config = yaml.safe_load((out / monitoring.PROMETHEUS_FILE).read_text())
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"}
    (out / monitoring.PROMETHEUS_FILE).write_text(yaml.safe_dump(config, sort_keys=False))
    web = free_port()
    base = f"http://127.0.0.1:{web}"
    log = open(tmp_path / "prometheus.log", "w")  # noqa: SIM115 - closed below
    prom = subprocess.Popen([prometheus_installed, f"--config.file={out / monitoring.PROMETHEUS_FILE}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
                             f"--web.listen-address=127.0.0.1:{web}"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_for("Prometheus ready", lambda: get(f"{base}/-/ready"), 60)
        wait_for("3 targets up", lambda: sum(t["health"] == "up" for t in api(base, "/api/v1/targets")["activeTargets"]) == 3, 30)

        # Traffic: a repeated long prompt, so the second and later requests are L3 hits; all three servers share the
        # L3 directory as a fleet on one NFS export would. Concurrent clients, so requests also queue.
        prompt = " ".join(f"tok{i}" for i in range(400))
        errors = []

        def client(port: int, n: int) -> None:
            try:
                for k in range(n):
                    chat(port, prompt + (f" tail{k % 3}" if k % 2 else ""), stream=bool(k % 4 == 3))
                    time.sleep(0.05)
            except Exception as exc:  # noqa: BLE001 - reported by the assertion below
                errors.append(exc)

        threads = [threading.Thread(target=client, args=(port, 60)) for port, _ in servers.values() for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert not errors and not any(t.is_alive() for t in threads), errors
        time.sleep(3)  # a few scrapes after the last request

        empty, shown = [], []
        for title, ref, expr in monitoring.panel_queries(json.loads((out / monitoring.DASHBOARD_FILE).read_text())):
            result = api(base, "/api/v1/query", query=monitoring.concrete(expr, instance=".*", rate_interval="30s"))["result"]
            values = [float(r["value"][1]) for r in result]
            shown.append(f"{title} {ref}: {len(result)} series {values[:4]}")
            if not any(math.isfinite(v) for v in values):
                empty.append(f"{title} {ref}: {expr}")
        print("\n".join(shown))  # shown with pytest -s
        assert not empty, "queries without data:\n" + "\n".join(empty) + "\n\nall:\n" + "\n".join(shown)

        def one(expr: str) -> list[float]:
            return [float(r["value"][1]) for r in api(base, "/api/v1/query", query=expr)["result"]]

        share = one(monitoring.concrete(next(e for t, _, e in monitoring.panel_queries(monitoring.dashboard("x")) if t.startswith("Storage (L3) hit share") and "(fleet)" in t), rate_interval="30s"))
        assert share and 0.5 < share[0] <= 1, share  # most prompt tokens came from L3
        assert len(one('sum by (instance) (sglang:time_to_first_token_seconds_count{job="hicache-sglang"})')) == 3
        assert one('count(up{job="hicache-sglang",inventory_host="srv-1",served_model="m"})') == [1.0]

        # Stop one server: HiCacheServerDown (for: 1m) must fire for it, and only for it.
        stopped_port, stopped = servers["srv-1"]
        stopped.kill()
        stopped.wait()

        def firing():
            alerts = [a for a in api(base, "/api/v1/alerts")["alerts"] if a["labels"]["alertname"] == "HiCacheServerDown" and a["state"] == "firing"]
            return alerts

        alerts = wait_for("HiCacheServerDown firing", firing, 120, step=1)
        assert [a["labels"]["instance"] for a in alerts] == [f"127.0.0.1:{stopped_port}"]
        assert alerts[0]["labels"]["inventory_host"] == "srv-1" and f"127.0.0.1:{stopped_port}" in alerts[0]["annotations"]["summary"]
    finally:
        prom.terminate()
        try:
            prom.wait(timeout=20)
        except subprocess.TimeoutExpired:
            prom.kill()
            prom.wait()
        log.close()


# SGLang's StorageMetricsCollector names (observability/metrics_collector.py): logged by every TP, PP and attention-CP
# rank of a server, each counting the same tokens; the scheduler's gauges by every pipeline stage (metrics.py says why).
STORAGE_METRICS = {name for name, (_, source) in monitoring.SGLANG_METRICS.items() if source.startswith("StorageMetricsCollector")}
SCHEDULER_GAUGES = {"sglang:num_running_reqs", "sglang:num_queue_reqs"}
SELECTOR = re.compile(r"(sglang:[a-z_]+)(\{[^{}]*\})?")


def test_every_query_counts_a_token_once_across_the_ranks_of_a_server():
    """Issue 23: under PP > 1 a query that read tp_rank="0" alone summed every pipeline stage's copy of the same tokens."""
    assert STORAGE_METRICS >= {metrics.BACKUPED, metrics.STORAGE_HITS, metrics.BACKUP_DROPPED, metrics.PREFETCH_UNFULFILLED}
    seen = set()
    for where, expr in all_queries():
        for name, matchers in SELECTOR.findall(expr):
            if name in STORAGE_METRICS:
                seen.add(name)
                assert all(f'{rank}=~"0|"' in matchers for rank in metrics.REPLICA_RANKS), f"{where}: {name}{matchers}"
            if name in SCHEDULER_GAUGES:
                seen.add(name)
                assert metrics.SCHEDULER_ONCE in matchers and "tp_rank" not in matchers, f"{where}: {name}{matchers}"
    assert seen >= STORAGE_METRICS | SCHEDULER_GAUGES, seen


def test_routers_get_their_own_job_and_targets_file(tmp_path):
    """targets/router.json, as the docs say: every host of group hicache_routers at its --prometheus-port, reached at
    its ansible_host (the router binds 0.0.0.0 by default), scraped by job hicache-router."""
    inv = tmp_path / "inv"
    (inv / "group_vars").mkdir(parents=True)
    hosts = {"all": {"children": {"hicache_servers": {"hosts": {"gpu-a": {"ansible_host": "10.0.0.1"}}},
                                  "hicache_routers": {"hosts": {"router-01": {"ansible_host": "10.0.0.9"},
                                                                "router-02": {"ansible_host": "10.0.0.10", "hicache_router_prometheus_port": 29100}}}}}}
    (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
    variables = yaml.safe_load((ROOT / "inventories/local/group_vars/all.yml").read_text()) | {"hicache_host": "0.0.0.0"}
    (inv / "group_vars/all.yml").write_text(yaml.safe_dump(variables))
    out = tmp_path / "out"
    proc = cli("monitoring", "-i", str(inv), "--out", str(out), check_rc=0)
    assert "3 target(s)" in proc.stdout, proc.stdout
    groups = json.loads((out / monitoring.ROUTER_TARGETS_FILE).read_text())
    assert groups == [{"targets": ["10.0.0.9:29000"], "labels": {"inventory": "inv", "inventory_host": "router-01"}},
                      {"targets": ["10.0.0.10:29100"], "labels": {"inventory": "inv", "inventory_host": "router-02"}}]
    jobs = {j["job_name"]: j for j in yaml.safe_load((out / monitoring.PROMETHEUS_FILE).read_text())["scrape_configs"]}
    assert jobs[monitoring.ROUTER_JOB]["file_sd_configs"] == [{"files": [monitoring.ROUTER_TARGETS_FILE]}]
    assert [g["targets"] for g in json.loads((out / monitoring.TARGETS_FILE).read_text())] == [["10.0.0.1:30000"]]
