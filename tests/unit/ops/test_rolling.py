"""A server's restart behind the routers (hicachectl/ops/rolling.py): the plan the restart tasks apply, and the
drain judgement read from SGLang's /metrics; bench's metrics summed over the servers behind a router. Fast:
tests/fleet/test_fleet_router.py runs the sequence against the real sglang-router."""

from __future__ import annotations

import pytest

from hicachectl import rules
from hicachectl.ops import bench, metrics, rolling

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
                        {"r1": {}, "r2": {"hicache_router_host": "10.0.0.5", "hicache_router_port": 9000, "hicache_router_service_name": "smg"}},
                        ["r1", "r2"])
    # each with its unit: a router refusing the connection without it was never deployed (a first deploy), and is not
    # reported as one that does not run (#34)
    assert plan["routers"] == [{"host": "r1", "url": "http://127.0.0.1:30080", "unit": "/etc/systemd/system/sglang-router.service"},
                               {"host": "r2", "url": "http://10.0.0.5:9000", "unit": "/etc/systemd/system/smg.service"}]
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


# --- a downgrade is named, an image compared however it is spelt (issue #24, item 1) ---------------------------------

def test_an_older_sglang_than_the_one_running_is_a_downgrade_and_an_unknown_version_makes_no_claim():
    from hicachectl.ops import rolling

    d = deployment(hicache_image="lmsysorg/sglang:v0.5.21-cu129")
    running = {"image": "lmsysorg/sglang:v0.5.23-cu129", "sglang_version": "0.5.23"}
    assert rolling.downgrade(d, running) == ("the server runs SGLang 0.5.23 (image lmsysorg/sglang:v0.5.23-cu129) and the inventory pins "
                                             "the older 0.5.21 (hicache_image lmsysorg/sglang:v0.5.21-cu129): a downgrade")
    assert rolling.downgrade(deployment(hicache_image="lmsysorg/sglang:v0.5.23-cu130"), running) == ""  # same version, other build
    assert rolling.downgrade(deployment(hicache_image="lmsysorg/sglang:v0.5.23-cu129"), {"sglang_version": "0.5.21"}) == ""  # an upgrade
    assert rolling.downgrade(d, None) == "" and rolling.downgrade(d, {}) == ""  # nothing runs yet
    assert rolling.downgrade(d, {"sglang_version": "main"}) == ""  # no order to judge


def test_the_same_image_however_a_runtime_spells_it():
    from hicachectl.ops import rolling

    assert rolling.same_image("lmsysorg/sglang:v0.5.21", "docker.io/lmsysorg/sglang:v0.5.21")
    assert rolling.same_image("ubuntu:24.04", "docker.io/library/ubuntu:24.04")
    assert not rolling.same_image("lmsysorg/sglang:v0.5.21", "lmsysorg/sglang:v0.5.23")


def test_upgrade_refuses_an_image_the_inventory_does_not_pin_naming_host_variable_and_fix():
    from hicachectl.cli import change as cli_change

    fleet = {"gpu-01": deployment(hicache_image="lmsysorg/sglang:v0.5.21-cu129"), "gpu-02": deployment(hicache_image="lmsysorg/sglang:v0.5.23-cu129")}
    [refusal] = cli_change.image_refusals(fleet, "docker.io/lmsysorg/sglang:v0.5.23-cu129")
    assert (refusal.host, refusal.variable, refusal.rule, refusal.level) == ("gpu-01", "hicache_image", "upgrade-image", rules.ERROR)
    assert refusal.fix.startswith("set hicache_image: docker.io/lmsysorg/sglang:v0.5.23-cu129 in the inventory")
    assert cli_change.image_refusals(fleet, "lmsysorg/sglang:v0.5.21-cu129")[0].host == "gpu-02"


# --- one download per shared model directory (issue #24, item 7) -----------------------------------------------------

HUB = {"hicache_model_source": "hub", "hicache_model_repo": "Qwen/Qwen3-8B", "hicache_model_dir": "/mnt/models/qwen3"}


def test_hosts_sharing_a_model_directory_have_one_downloader_the_first_by_name():
    from hicachectl.ops import rolling

    fleet = {h: deployment(**HUB, hicache_model_share="models-nfs") for h in ("gpu-03", "gpu-01", "gpu-02")}
    fleet["gpu-04"] = deployment(**HUB)  # its own disk: downloads its own
    fleet["gpu-05"] = deployment(**{**HUB, "hicache_model_dir": "/mnt/models/other"}, hicache_model_share="models-nfs")
    plans = {h: rolling.model_download(h, fleet, fleet) for h in fleet}
    assert {h: p["downloader"] for h, p in plans.items()} == {"gpu-01": "gpu-01", "gpu-02": "gpu-01", "gpu-03": "gpu-01", "gpu-04": "gpu-04",
                                                              "gpu-05": "gpu-05"}
    assert [h for h, p in plans.items() if not p["waits"]] == ["gpu-01", "gpu-04", "gpu-05"]  # one download per directory
    assert plans["gpu-02"]["lock"] == "/mnt/models/qwen3/" + rolling.DOWNLOAD_LOCK and plans["gpu-04"]["lock"] is None
    assert plans["gpu-03"]["text"].startswith("gpu-01 downloads Qwen/Qwen3-8B into /mnt/models/qwen3 for the 3 host(s) gpu-[01:03] sharing it")
    # --limit: the run's hosts decide; a host outside it does not download for the others
    assert rolling.model_download("gpu-03", fleet, ["gpu-02", "gpu-03"])["downloader"] == "gpu-02"


def test_hosts_sharing_a_directory_for_different_models_are_refused():
    from hicachectl.ops import rolling

    fleet = {"gpu-01": deployment(**HUB, hicache_model_share="s"), "gpu-02": deployment(**{**HUB, "hicache_model_revision": "v2"}, hicache_model_share="s")}
    with pytest.raises(ValueError, match=r"gpu-01 and gpu-02 share /mnt/models/qwen3 \(hicache_model_share s\) but want other downloads"):
        rolling.model_download("gpu-01", fleet, fleet)
