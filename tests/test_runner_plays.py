"""Which play judges a host: the servers' last play for a server, the routers' play for a router (ansible-runner's
event stream, replayed without Ansible)."""

from __future__ import annotations

from hicachectl.runner import _Collector


def play(uuid: str, pattern: str) -> dict:
    return {"event": "playbook_on_play_start", "event_data": {"play_uuid": uuid, "play_pattern": pattern}}


def ok(host: str) -> dict:
    return {"event": "runner_on_ok", "event_data": {"host": host, "task": "t", "res": {}}}


def test_a_routers_play_at_the_end_leaves_the_servers_judged_by_their_own_last_play():
    collector = _Collector(None, routers=["router-1"])
    for name in ("gpu-1", "gpu-2", "router-1"):
        collector.host(name)
    for event in (play("validate", "all"), ok("gpu-1"), ok("gpu-2"), ok("router-1"),
                  play("pull", "all:!hicache_routers"), ok("gpu-1"), ok("gpu-2"),
                  play("deploy", "all:!hicache_routers"), ok("gpu-1"),  # a stopped rollout: gpu-2 never deployed
                  play("routers", "hicache_routers"), ok("router-1")):
        collector(event)
    assert {h: r.status for h, r in collector.hosts.items()} == {"gpu-1": "ok", "gpu-2": "not run", "router-1": "ok"}


def test_a_router_the_routers_play_never_reached_is_not_run():
    collector = _Collector(None, routers=["router-1"])
    for event in (play("validate", "all"), ok("gpu-1"), ok("router-1"), play("deploy", "all:!hicache_routers"), ok("gpu-1"),
                  play("routers", "hicache_routers")):
        collector(event)
    assert {h: r.status for h, r in collector.hosts.items()} == {"gpu-1": "ok", "router-1": "not run"}


def test_a_router_named_only_by_validate_before_a_stopped_rollout_is_not_run():
    collector = _Collector(None, routers=["router-1"])
    for event in (play("validate", "all"), ok("router-1"), ok("gpu-1"),  # validate's run-once tasks name the first host
                  play("deploy", "all:!hicache_routers"), {"event": "runner_on_failed", "event_data": {"host": "gpu-1", "task": "t", "res": {}}}):
        collector(event)
    assert collector.hosts["router-1"].status == "not run"


def test_a_failed_loop_item_is_named_in_the_reason():
    collector = _Collector(None)
    collector(play("deploy", "all"))
    collector({"event": "runner_item_on_failed", "event_data": {"host": "gpu-1", "task": "Remove it from each router",
                                                                "res": {"msg": "timed out", "_ansible_item_label": "router-2"}}})
    assert collector.hosts["gpu-1"].reasons == ["Remove it from each router (router-2): timed out"]
