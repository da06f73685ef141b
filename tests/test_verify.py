"""verify's conclusions from a server's answers (hicachectl/verify.py). The answers here are written out
by hand in the shape Ansible's uri module registers them; the fleet tests get them from the stand-in."""

from __future__ import annotations

import pytest
from helpers import deployment

from hicachectl import verify


def answered(status=200, json=None, content=None):
    return {"status": status, "json": json, "content": content}


def metrics_text(backuped=0, storage=0, dropped=0, unfulfilled=0):
    return (f'sglang:backuped_tokens_total{{storage_backend="file",tp_rank="0"}} {backuped}\n'
            f'sglang:backuped_tokens_total{{storage_backend="file",tp_rank="1"}} {backuped}\n'
            f'sglang:cached_tokens_total{{cache_source="storage"}} {storage}\n'
            f'sglang:hicache_backup_dropped_tokens_total{{tp_rank="0"}} {dropped}\n'
            f'sglang:storage_prefetch_unfulfilled_tokens_total{{reason="timeout",tp_rank="0"}} {unfulfilled}\n')


def chat(prompt_tokens=300, cached=0):
    return answered(json={"usage": {"prompt_tokens": prompt_tokens, "prompt_tokens_details": {"cached_tokens": cached}}})


def observations(d, **changes):
    info = {"page_size": d.page_size, "served_model_name": d.served_name}
    obs = {
        "host_failures": [], "health": answered(), "models": answered(json={"data": [{"id": d.served_name}]}),
        "chat": chat(32), "metrics": answered(content=metrics_text()), "restart_skipped": "",
        "before_metrics": answered(content=metrics_text()), "fill": chat(300),
        "fill_metrics": answered(content=metrics_text(backuped=256)), "restart_failed": "",
        "info_before": answered(json=info), "info_after": answered(json=info),
        "reuse_metrics_before": answered(content=metrics_text(backuped=256)), "reuse": chat(300, cached=256),
        "reuse_metrics": answered(content=metrics_text(backuped=256, storage=256)),
    }
    obs.update(changes)
    return obs


@pytest.fixture
def local():
    return deployment("local", page_size=64, write_policy="write_through")


def failed(result):
    return {c["check"]: c for c in result["checks"] if c["status"] == "fail"}


def test_a_server_that_keeps_its_pages_passes(local):
    result = verify.judge(local, observations(local), l3=True)
    assert result["ok"], result
    hit = next(c for c in result["checks"] if c["check"] == "L3 hit after restart")
    assert hit["detail"] == "256 of 300 prompt tokens cached, 256 loaded from storage"


def test_storage_metrics_count_each_token_once_across_tp_ranks(local):
    write = next(c for c in verify.judge(local, observations(local), l3=True)["checks"] if c["check"] == "L3 write")
    assert write["detail"].startswith("256 of 300")  # not 512: tp_rank 1 repeats rank 0's count


@pytest.mark.parametrize("policy,cause", [("write_back", "only when the host pool evicts it"), ("write_through_selective", "after 2 hits")])
def test_nothing_written_is_explained_by_the_write_policy(policy, cause):
    d = deployment("local", page_size=64, write_policy=policy)
    result = verify.judge(d, observations(d, fill_metrics=answered(content=metrics_text())), l3=True)
    assert cause in failed(result)["L3 write"]["cause"]
    assert "L3 hit after restart" not in {c["check"] for c in result["checks"]}  # no restart for nothing


def test_keys_that_changed_over_the_restart_are_named(local):
    after = answered(json={"page_size": 128, "served_model_name": local.served_name})
    result = verify.judge(local, observations(local, info_after=after, reuse=chat(300, 0),
                                              reuse_metrics=answered(content=metrics_text(backuped=512))), l3=True)
    cause = failed(result)["L3 hit after restart"]["cause"]
    assert "page size 64 -> 128" in cause and "the keys differ" in cause


def test_dropped_backups_point_at_the_host_pool(local):
    result = verify.judge(local, observations(local, reuse=chat(300, 0),
                                              reuse_metrics=answered(content=metrics_text(backuped=256, dropped=192))), l3=True)
    assert "raise hicache_size_gb" in failed(result)["L3 hit after restart"]["cause"]


def test_unfulfilled_prefetch_names_the_policy():
    d = deployment("local", page_size=64, prefetch_policy="timeout")
    result = verify.judge(d, observations(d, reuse=chat(300, 0),
                                          reuse_metrics=answered(content=metrics_text(backuped=256, unfulfilled=256))), l3=True)
    assert "prefetch policy timeout" in failed(result)["L3 hit after restart"]["cause"]


def test_reporting_switched_off_is_named_with_the_variable(local):
    result = verify.judge(local, observations(local, chat=answered(json={"usage": {"prompt_tokens": 32}}),
                                              metrics=answered(status=404, content="")), l3=False)
    assert "hicache_enable_cache_report" in failed(result)["cache report"]["cause"]
    assert "hicache_enable_metrics" in failed(result)["/metrics"]["cause"]


def test_no_server_is_one_failure_not_five(local):
    result = verify.judge(local, observations(local, health={"status": -1, "url": "http://127.0.0.1:30000/health"}), l3=True)
    assert list(failed(result)) == ["/health"] and not result["ok"]


def test_host_check_failures_and_a_proof_that_could_not_run(local):
    obs = observations(local, host_failures=[{"item": "L3 mount", "detail": "/mnt/x: vers is 4.1, wanted 3"}],
                       restart_skipped="systemd does not run this host")
    result = verify.judge(local, obs, l3=True)
    assert failed(result)["L3 mount"]["detail"] == "/mnt/x: vers is 4.1, wanted 3"
    persistence = next(c for c in result["checks"] if c["check"] == "L3 persistence")
    assert persistence["status"] == "fail" and persistence["detail"].startswith("not proven: ") and not result["ok"]


def test_the_proof_prompt_spans_several_pages(local):
    plan = verify.plan(local, "salt")
    words = plan["l3_probe"]["messages"][0]["content"].split()
    assert len(words) >= verify.L3_PAGES * 64 and plan["l3_min_tokens"] == 64
    assert plan["base_url"] == "http://127.0.0.1:30000"
    assert verify.plan(local, "other")["l3_probe"] != plan["l3_probe"]


def test_what_the_server_runs_counts_over_what_the_inventory_says(local):
    """start.sh changed on the host: the server writes back, though the inventory says write_through."""
    running = answered(json={"page_size": 64, "served_model_name": local.served_name, "hicache_write_policy": "write_back"})
    result = verify.judge(local, observations(local, info=running, info_before=running,
                                              fill_metrics=answered(content=metrics_text())), l3=True)
    assert failed(result)["server config"]["detail"] == "the server runs write policy write_back (inventory: write_through)"
    assert "only when the host pool evicts it" in failed(result)["L3 write"]["cause"]
    same = answered(json={"page_size": 64, "hicache_write_policy": "write_through", "hicache_storage_backend": "file"})
    assert "server config" not in failed(verify.judge(local, observations(local, info=same), l3=False))
