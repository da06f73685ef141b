"""A server's restart behind the routers (hicachectl/rolling.py): the plan the restart tasks apply, and the
drain judgement read from SGLang's /metrics; bench's metrics summed over the servers behind a router. Fast:
tests/fleet/test_fleet_router.py runs the sequence against the real sglang-router."""

from __future__ import annotations

import pytest

from hicachectl import bench, metrics, rolling, rules

SERVER = {"hicache_model_path": "/models/m", "hicache_served_model_name": "m", "hicache_image": "lmsysorg/sglang:v0.5.23-cu129"}


def deployment(**extra):
    d, findings = rules.check_host("gpu-01", {**SERVER, **extra})
    assert not rules.has_errors(findings), [f.format() for f in findings]
    return d


def gauges(*lines):
    return "# HELP sglang:num_running_reqs x\n" + "".join(line + "\n" for line in lines)


def test_in_flight_sums_running_and_queued_over_every_rank():
    text = gauges('sglang:num_running_reqs{tp_rank="0"} 2', 'sglang:num_running_reqs{tp_rank="4"} 1',
                  'sglang:num_queue_reqs{tp_rank="0"} 3', "sglang:num_requests_total 99")
    assert rolling.in_flight(text) == 6  # metrics.total would count rank 0 only
    assert metrics.total(text, "sglang:num_running_reqs") == 2


@pytest.mark.parametrize("text", [None, "", "sglang:num_requests_total 3\n"])
def test_in_flight_is_unknown_without_the_gauges(text):
    assert rolling.in_flight(text) is None


def test_in_flight_zero_is_zero_not_unknown():
    assert rolling.in_flight(gauges("sglang:num_running_reqs 0", "sglang:num_queue_reqs 0")) == 0


def test_plan_names_each_router_at_its_own_address_and_the_worker_url():
    d = deployment(hicache_port=8000, hicache_router_drain_timeout=42)
    plan = rolling.plan(d, "gpu-01", {"ansible_host": "10.0.0.11", "hicache_port": 8000},
                        {"r1": {}, "r2": {"hicache_router_host": "10.0.0.5", "hicache_router_port": 9000}}, ["r1", "r2"])
    assert plan["routers"] == [{"host": "r1", "url": "http://127.0.0.1:30080"}, {"host": "r2", "url": "http://10.0.0.5:9000"}]
    assert plan["worker_url"] == "http://10.0.0.11:8000"
    assert plan["metrics_url"] == "http://127.0.0.1:8000/metrics"
    assert plan["drain_timeout"] == 42 and plan["cannot_drain"] == ""


def test_plan_without_routers_has_nothing_to_drain():
    plan = rolling.plan(deployment(hicache_enable_metrics=False), "gpu-01", {}, {}, [])
    assert plan["routers"] == [] and plan["worker_url"] is None and plan["cannot_drain"] == ""


def test_a_server_without_metrics_cannot_be_drained_and_says_why():
    plan = rolling.plan(deployment(hicache_enable_metrics=False), "gpu-01", {}, {"r1": {}}, ["r1"])
    assert "gpu-01" in plan["cannot_drain"] and "hicache_enable_metrics" in plan["cannot_drain"]


def test_plan_refuses_a_router_with_invalid_variables():
    with pytest.raises(ValueError, match="router r1"):
        rolling.plan(deployment(), "gpu-01", {}, {"r1": {"hicache_router_port": 0}}, ["r1"])


def test_bench_sums_the_metrics_of_every_server_behind_a_router(monkeypatch):
    texts = {"http://a/metrics": 'sglang:backuped_tokens_total{tp_rank="0"} 10\n',
             "http://b/metrics": 'sglang:backuped_tokens_total{tp_rank="0"} 5\n'}
    monkeypatch.setattr(bench, "_get", lambda url, timeout=30: (200, texts[url]) if url in texts else (404, ""))
    target = bench.Target("http://router", metrics_urls=["http://a", "http://b"])
    assert metrics.total(bench.target_metrics(target), metrics.BACKUPED) == 15
    # one server not answering: no partial sum that would understate the hits
    assert bench.target_metrics(bench.Target("http://router", metrics_urls=["http://a", "http://c"])) is None
