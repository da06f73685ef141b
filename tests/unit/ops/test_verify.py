"""verify's conclusions from a server's answers (hicachectl/ops/verify.py). The answers here are written out
by hand in the shape Ansible's uri module registers them; the fleet tests get them from the stand-in."""

from __future__ import annotations

import dataclasses

import pytest
from helpers import deployment, server

from hicachectl.config.deployment import uses_uring
from hicachectl.ops import metrics, verify
from hicachectl.plans import launch


def answered(status=200, json=None, content=None):
    return {"status": status, "json": json, "content": content}


def metrics_text(backuped=0, storage=0, dropped=0, unfulfilled=0, below_threshold=0):
    return (f'sglang:storage_prefetch_unfulfilled_tokens_total{{reason="below_threshold",tp_rank="0"}} {below_threshold}\n'
            f'sglang:backuped_tokens_total{{storage_backend="file",tp_rank="0"}} {backuped}\n'
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


def pp_metrics_text(backuped=0, storage=0):
    """A PP 2 server's storage metrics (test_metrics.server: each stage reports the same page's tokens, its own layers)."""
    return server(metrics.BACKUPED, backuped, pp_size=2) + f'sglang:cached_tokens_total{{cache_source="storage"}} {storage}\n'


def test_storage_metrics_count_each_token_once_across_pipeline_stages(local):
    result = verify.judge(local, observations(local, fill_metrics=answered(content=pp_metrics_text(backuped=256)),
                                              reuse_metrics_before=answered(content=pp_metrics_text(backuped=256)),
                                              reuse_metrics=answered(content=pp_metrics_text(backuped=256, storage=256)),
                                              before_metrics=answered(content=pp_metrics_text()),
                                              metrics=answered(content=pp_metrics_text())), l3=True)
    write = next(c for c in result["checks"] if c["check"] == "L3 write")
    assert write["detail"].startswith("256 of 300")  # not 512: pp_rank 1 reports the same tokens for its layers


@pytest.mark.parametrize("policy,cause", [("write_back", "only when the host pool evicts it"), ("write_through_selective", "after 2 hits")])
def test_nothing_written_is_explained_by_the_write_policy(policy, cause):
    d = deployment("local", page_size=64, write_policy=policy)
    result = verify.judge(d, observations(d, fill_metrics=answered(content=metrics_text())), l3=True)
    assert cause in failed(result)["L3 write"]["cause"]
    assert "L3 hit after restart" not in {c["check"] for c in result["checks"]}  # no restart for nothing


def test_an_unset_write_policy_is_sglangs_write_through_so_nothing_written_is_not_blamed_on_it():
    """SGLang's default is write_through (0.5.23 arg_groups/fields/memory.py hicache_write_policy)."""
    d = deployment("local", page_size=64, write_policy=None)
    assert d.write_policy is None
    result = verify.judge(d, observations(d, fill_metrics=answered(content=metrics_text())), l3=True)
    cause = failed(result)["L3 write"]["cause"]
    assert cause.startswith("nothing reached L3 in time") and "write_back" not in cause and "selective" not in cause


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


# --- shared L3 (hicache_l3_share): the ring proof -------------------------------------------------------------


def test_the_ring_pairs_each_host_with_the_one_before_it_in_its_share():
    shares = {"gpu-3": "vast", "gpu-1": "vast", "gpu-2": "vast", "solo": None, "alone": "other", "nfs-b": "nfs", "nfs-a": "nfs"}
    assert verify.writers(shares) == {"gpu-1": "gpu-3", "gpu-2": "gpu-1", "gpu-3": "gpu-2", "solo": "solo", "alone": "alone",
                                      "nfs-a": "nfs-b", "nfs-b": "nfs-a"}
    # every host of a share writes for exactly one other and reads from exactly one other
    ring = verify.writers({f"h{i}": "s" for i in range(5)})
    assert sorted(ring.values()) == sorted(ring) and all(w != h for h, w in ring.items())


def shared_pair(**writer_changes):
    """Host gpu-2 of share `tier` and its writer gpu-1 (with `writer_changes`)."""
    base = {"page_size": 16, "write_policy": "write_through", "l3_share": "tier", "cache_dir": "/mnt/kvcache"}
    reader = dataclasses.replace(deployment("local", **base), inventory_host="gpu-2")
    writer = dataclasses.replace(deployment("local", **{**base, **writer_changes}), inventory_host="gpu-1")
    return writer, reader


def test_the_plan_sends_the_prompt_to_the_writer_and_reads_it_here():
    writer, reader = shared_pair(served_model_name="other-name", port=30001)
    plan = verify.plan(reader, "run-1", writer)
    assert plan["writer"] == "gpu-1" and plan["shared"] and plan["writer_url"] == "http://127.0.0.1:30001"
    assert plan["l3_fill"]["model"] == "other-name" and plan["l3_probe"]["model"] == reader.served_name
    assert plan["l3_fill"]["messages"] == plan["l3_probe"]["messages"]
    # new to every server: the reader's name and the run id are in the prompt
    assert verify.plan(dataclasses.replace(reader, inventory_host="gpu-3"), "run-1", writer)["l3_probe"]["messages"] != plan["l3_probe"]["messages"]
    assert "gpu-2" in plan["l3_probe"]["messages"][0]["content"] and "run-1" in plan["l3_probe"]["messages"][0]["content"]
    alone = verify.plan(reader, "run-1")
    assert alone["writer"] == "gpu-2" and not alone["shared"] and alone["writer_url"] == alone["base_url"]
    assert alone["l3_fill"] == alone["l3_probe"]


def test_the_writers_page_size_sets_the_write_threshold_and_the_prompt_spans_both():
    writer, reader = shared_pair(page_size=64)
    plan = verify.plan(reader, "s", writer)
    assert plan["l3_min_tokens"] == 64 and len(plan["l3_probe"]["messages"][0]["content"].split()) >= verify.L3_PAGES * 64


def shared_obs(writer, reader, hits=256, **changes):
    info = {"page_size": reader.page_size, "served_model_name": reader.served_name, "kv_cache_dtype": "auto", "tp_size": 1}
    writer_info = {**info, "page_size": writer.page_size, "served_model_name": writer.served_name}
    return observations(reader, info_before=answered(json=info), info_after=answered(json=info), writer_info=answered(json=writer_info),
                        reuse=chat(272, cached=hits), reuse_metrics=answered(content=metrics_text(backuped=256, storage=hits)), **changes)


def test_a_hit_on_pages_the_writer_wrote_passes_and_names_the_writer():
    writer, reader = shared_pair()
    result = verify.judge(reader, shared_obs(writer, reader), l3=True, writer=writer)
    assert result["ok"], result
    checks = {c["check"]: c for c in result["checks"]}
    assert checks["L3 write"]["detail"] == "256 of 300 prompt tokens written to L3 by gpu-1"
    assert checks["L3 hit across servers"]["detail"].endswith("written by gpu-1")


def test_a_few_hits_are_not_the_proof_they_may_be_pages_this_server_wrote_itself():
    writer, reader = shared_pair()
    result = verify.judge(reader, shared_obs(writer, reader, hits=32), l3=True, writer=writer)  # two pages: a chat template's
    check = failed(result)["L3 hit across servers"]
    assert "only 32 of 272 prompt tokens came from storage (the proof needs 240)" in check["cause"]
    assert verify.judge(reader, shared_obs(writer, reader, hits=240), l3=True, writer=writer)["ok"]
    alone = deployment("local", page_size=16)
    assert not verify.judge(alone, observations(alone, reuse=chat(300, cached=16)), l3=True)["ok"]


@pytest.mark.parametrize("change,phrase", [
    ({"page_size": 32}, "page size 32 vs 16"),
    ({"kv_cache_dtype": "fp8_e4m3"}, "KV dtype fp8_e4m3 vs auto"),
    ({"l3_namespace": "elsewhere"}, "namespace elsewhere vs "),
    ({"tp_size": 2}, "TP size 2 vs 1"),
])
def test_no_hit_names_what_differs_between_the_writer_and_this_host(change, phrase):
    writer, reader = shared_pair(**change)
    result = verify.judge(reader, shared_obs(writer, reader, hits=0), l3=True, writer=writer)
    cause = failed(result)["L3 hit across servers"]["cause"]
    assert cause.startswith("gpu-1 and gpu-2 differ: ") and phrase in cause, cause
    assert "not really shared" not in cause


def test_what_only_the_running_servers_show_is_named_too():
    """The inventories agree, but the writer's server runs another KV dtype (its start.sh was changed by hand)."""
    writer, reader = shared_pair()
    obs = shared_obs(writer, reader, hits=0)
    obs["writer_info"] = answered(json={**obs["writer_info"]["json"], "kv_cache_dtype": "fp8_e5m2"})
    cause = failed(verify.judge(reader, obs, l3=True, writer=writer))["L3 hit across servers"]["cause"]
    assert "KV dtype fp8_e5m2 vs auto" in cause


def test_no_hit_without_a_difference_means_the_tier_is_not_shared():
    writer, reader = shared_pair()
    cause = failed(verify.judge(reader, shared_obs(writer, reader, hits=0), l3=True, writer=writer))["L3 hit across servers"]["cause"]
    assert "the tier is not really shared" in cause and "/mnt/kvcache on gpu-2" in cause and "on gpu-1" in cause


def test_a_hit_on_pages_of_another_format_is_a_failure():
    """namespace off on both, KV dtypes differ: SGLang's file backend reads the other format's pages as its own."""
    writer, reader = shared_pair(kv_cache_dtype="fp8_e4m3", l3_namespace="off")
    reader = dataclasses.replace(reader, l3_namespace="off")
    check = failed(verify.judge(reader, shared_obs(writer, reader), l3=True, writer=writer))["L3 hit across servers"]
    assert "KV dtype fp8_e4m3 vs auto" in check["detail"] and "hicache_l3_namespace: auto" in check["cause"]


def test_the_writers_write_policy_and_failures_are_named_with_the_writer():
    writer, reader = shared_pair(write_policy="write_back")
    obs = shared_obs(writer, reader, fill_metrics=answered(content=metrics_text()))
    obs["writer_info"] = answered(json={"hicache_write_policy": "write_back"})
    write = failed(verify.judge(reader, obs, l3=True, writer=writer))["L3 write"]
    assert "write_back on gpu-1" in write["cause"] and "by gpu-1" in write["detail"]
    down = failed(verify.judge(reader, shared_obs(writer, reader, fill={"status": -1}), l3=True, writer=writer))["L3 write"]
    assert down["detail"] == "the long prompt was answered -1 by gpu-1" and "on gpu-1" in down["cause"]


def test_a_host_that_is_its_own_writer_keeps_the_single_server_proof(local):
    result = verify.judge(local, observations(local), l3=True, writer=local)
    assert result["ok"] and "L3 hit after restart" in {c["check"] for c in result["checks"]}
    assert "by " not in next(c for c in result["checks"] if c["check"] == "L3 write")["detail"]


def test_the_running_kv_dtype_and_tp_size_are_compared_with_the_inventory():
    d = deployment("local", page_size=16, kv_cache_dtype="fp8_e4m3", tp_size=2)
    drift = verify.server_drift(d, {"page_size": 16, "kv_cache_dtype": "auto", "tp_size": 1})
    assert drift == ["KV dtype auto (inventory: fp8_e4m3)", "TP size 1 (inventory: 2)"]


def test_unfulfilled_prefetch_names_sglangs_default_policy_when_unset():
    # SGLang 0.5.23's --hicache-storage-prefetch-policy defaults to timeout, not best_effort
    d = deployment("local", page_size=64)
    assert d.prefetch_policy is None
    result = verify.judge(d, observations(d, reuse=chat(300, 0),
                                          reuse_metrics=answered(content=metrics_text(backuped=256, unfulfilled=256))), l3=True)
    assert "prefetch policy timeout" in failed(result)["L3 hit after restart"]["cause"]


@pytest.mark.parametrize("extra,page,threshold", [({}, 16, 256), ({"prefetch_threshold": 64}, 16, 64), ({"prefetch_threshold": 64}, 128, 128)])
def test_a_prompt_below_the_prefetch_threshold_is_not_loaded_from_l3(extra, page, threshold):
    # unified_radix_cache.py: a prefix shorter than prefetch_threshold (256, at least a page) is not prefetched at all
    d = deployment("local", page_size=page, extra_config={"max_size": "1T", **extra})
    short = threshold - 1
    result = verify.judge(d, observations(d, fill=chat(short), fill_metrics=answered(content=metrics_text(backuped=page)),
                                          reuse=chat(short, 0), reuse_metrics=answered(content=metrics_text(backuped=page))), l3=True)
    assert f"shorter than SGLang's prefetch threshold ({threshold} tokens" in failed(result)["L3 hit after restart"]["cause"]
    assert verify.prefetch_threshold(d) == threshold


# --- GET /hicache/storage-backend: a runtime detach --------------------------------------------------------------
# SGLang's answers (python/sglang/srt/entrypoints/http_server.py, 0.5.23 lines 1183-1199 and 2260-2271, 0.5.21 lines
# 1146-1161): the tokenizer's four fields, null once DELETE /hicache/storage-backend detached the backend
# (managers/tokenizer_control_mixin.py detach_hicache_storage); 400 with this error without --admin-api-key; 401
# {"error": "Unauthorized"} without the bearer token (utils/auth.py); 404 before sgl-project/sglang#15892.
NO_ADMIN_KEY = {"error": "This endpoint requires admin API key, but this server was started without one (admin-api-key). "
                         "Restart with --admin-api-key to enable."}


def attached(backend="file", write="write_through", prefetch="timeout"):
    return answered(json={"hicache_storage_backend": backend, "hicache_storage_backend_extra_config": None,
                          "hicache_storage_prefetch_policy": prefetch, "hicache_write_policy": write})


def backend_check(d, result):
    return next((c for c in result["checks"] if c["check"] == verify.L3_BACKEND), None)


def test_a_backend_detached_at_runtime_fails_naming_it(local):
    result = verify.judge(local, observations(local, storage_backend=attached(None)), l3=False)
    check = backend_check(local, result)
    assert not result["ok"] and check["status"] == "fail"
    assert check["detail"] == "no storage backend attached: file was detached at runtime (GET /hicache/storage-backend)"
    assert "`hicachectl restart`" in check["cause"]
    assert verify.detached(check)


def test_the_inventorys_backend_attached_passes(local):
    result = verify.judge(local, observations(local, storage_backend=attached("file")), l3=True)
    assert result["ok"] and backend_check(local, result) == {"check": "L3 backend", "status": "pass",
                                                             "detail": "file attached (GET /hicache/storage-backend)", "cause": ""}


def test_another_backend_or_policy_attached_at_runtime_fails(local):
    other = backend_check(local, verify.judge(local, observations(local, storage_backend=attached("nixl")), l3=False))
    assert other["status"] == "fail" and other["detail"].startswith("nixl attached at runtime, the inventory says file")
    policy = backend_check(local, verify.judge(local, observations(local, storage_backend=attached("file", write="write_back")), l3=False))
    assert policy["status"] == "fail" and "write policy write_back (inventory: write_through)" in policy["detail"]


def test_another_backend_config_attached_at_runtime_fails_and_the_started_one_passes_in_any_spelling():
    d = deployment("local", extra_config={"max_size": "10G", "nested": {"a": 1}})
    def check(extra):
        body = {**attached("file")["json"], "hicache_storage_backend_extra_config": extra}
        return backend_check(d, verify.judge(d, observations(d, storage_backend=answered(json=body)), l3=False))
    assert check(launch.extra_config_arg(d))["status"] == "pass"
    assert check('{"nested": {"a": 1},   "max_size": "10G"}')["status"] == "pass"  # a re-attach of the same config
    changed = check('{"max_size": "1G"}')
    assert changed["status"] == "fail" and "another backend config than the inventory's" in changed["detail"]
    assert "1G" not in changed["detail"]  # the config may hold secrets: it is never quoted
    assert check(None)["status"] == "fail"
    in_file = deployment("local", extra_config={"max_size": "10G"}, extra_config_file="extra_config.json")
    body = {**attached("file")["json"], "hicache_storage_backend_extra_config": launch.extra_config_arg(in_file)}
    assert launch.extra_config_arg(in_file).startswith("@")
    assert backend_check(in_file, verify.judge(in_file, observations(in_file, storage_backend=answered(json=body)), l3=False))["status"] == "pass"


def test_the_io_uring_fallbacks_config_is_the_inventorys():
    d = deployment("vast")
    assert uses_uring(d)
    body = {"hicache_storage_backend": "nixl", "hicache_storage_backend_extra_config": launch.extra_config_arg(launch.uring_fallback(d)),
            "hicache_storage_prefetch_policy": d.prefetch_policy, "hicache_write_policy": d.write_policy}
    assert backend_check(d, verify.judge(d, observations(d, storage_backend=answered(json=body)), l3=False))["status"] == "pass"


def test_a_server_without_the_route_is_not_checked_never_passed(local):
    result = verify.judge(local, observations(local, storage_backend=answered(404, json={"detail": "Not Found"})), l3=False)
    check = backend_check(local, result)
    assert result["ok"] and check["status"] == "not checked" and "sglang#15892" in check["detail"]
    unasked = backend_check(local, verify.judge(local, observations(local), l3=False))  # a playbook that does not ask it
    assert unasked["status"] == "not checked" and unasked["detail"] == "GET /hicache/storage-backend was not asked"


def test_without_an_admin_key_sglang_refuses_the_detach_too_so_the_started_backend_is_attached(local):
    info = answered(json={"hicache_storage_backend": "file", "page_size": 64, "served_model_name": local.served_name})
    result = verify.judge(local, observations(local, info=info, storage_backend=answered(400, json=NO_ADMIN_KEY)), l3=False)
    check = backend_check(local, result)
    assert check["status"] == "pass" and check["detail"].startswith("file attached since the start: the server runs without --admin-api-key")
    unknown = backend_check(local, verify.judge(local, observations(local, storage_backend=answered(400, json=NO_ADMIN_KEY)), l3=False))
    assert unknown["status"] == "not checked"  # /server_info did not say which backend it started with


def test_a_server_that_wants_its_admin_key_is_not_checked(local):
    check = backend_check(local, verify.judge(local, observations(local, storage_backend=answered(401, json={"error": "Unauthorized"})), l3=False))
    assert check["status"] == "not checked" and "set hicache_admin_api_key" in check["detail"]


def test_no_backend_in_the_inventory_and_none_attached_is_no_check():
    d = deployment("local", storage_backend=None)
    assert backend_check(d, verify.judge(d, observations(d, storage_backend=attached(None)), l3=False)) is None
    assert backend_check(d, verify.judge(d, observations(d, storage_backend=answered(404)), l3=False)) is None
    late = backend_check(d, verify.judge(d, observations(d, storage_backend=attached("file")), l3=False))
    assert late["status"] == "fail" and late["detail"] == "file attached at runtime; the inventory sets no hicache_storage_backend"


def test_the_plan_asks_it_with_the_admin_key_the_inventory_gives():
    d = deployment("local", port=30001, admin_api_key="s3cret-admin-key-16")
    assert verify.plan(d, "salt")["storage_backend"] == {"url": "http://127.0.0.1:30001/hicache/storage-backend",
                                                           "headers": {"Authorization": "Bearer s3cret-admin-key-16"}}
    assert verify.plan(deployment("local"), "salt")["storage_backend"]["headers"] == {}


def test_nothing_written_after_a_detach_says_so(local):
    result = verify.judge(local, observations(local, storage_backend=attached(None), fill_metrics=answered(content=metrics_text())), l3=True)
    assert "was detached at runtime" in failed(result)["L3 write"]["cause"]


def test_a_policy_left_unset_is_compared_with_sglangs_default():
    """The inventory sets no policy: the server runs SGLang's defaults (write_through, timeout), so a policy set at
    runtime to something else is drift too, not only when the inventory names one."""
    d = deployment("local", write_policy=None, prefetch_policy=None)
    assert backend_check(d, verify.judge(d, observations(d, storage_backend=attached("file")), l3=False))["status"] == "pass"
    for changed, said in ((attached("file", write="write_back"), "write policy write_back (inventory: write_through)"),
                          (attached("file", prefetch="best_effort"), "prefetch policy best_effort (inventory: timeout)")):
        check = backend_check(d, verify.judge(d, observations(d, storage_backend=changed), l3=False))
        assert check["status"] == "fail" and said in check["detail"], check


def test_the_proof_prompt_is_longer_than_either_servers_prefetch_threshold():
    """SGLang loads no prefix shorter than its prefetch threshold from L3: the proof's prompt must outgrow it on the
    reader and on the writer, or the proof fails whatever the tier does."""
    reader = deployment("local", extra_config={"prefetch_threshold": 3000})
    words = len(verify.plan(reader, "salt")["l3_probe"]["messages"][0]["content"].split())
    assert words >= 3000 + (reader.page_size or 1)
    writer = deployment("local", extra_config={"prefetch_threshold": 5000})
    shared = verify.plan(deployment("local"), "salt", writer)
    assert len(shared["l3_probe"]["messages"][0]["content"].split()) >= 5000


def test_a_hit_below_the_prefetch_threshold_is_named_not_called_slow(local):
    """SGLang loads no hit shorter than its prefetch threshold and counts it unfulfilled with reason below_threshold:
    that is pages gone from the tier, not a read too slow for the prefetch policy."""
    result = verify.judge(local, observations(local, reuse=chat(300, cached=0),
                                              reuse_metrics=answered(content=metrics_text(backuped=256, below_threshold=128))), l3=True)
    cause = failed(result)["L3 hit after restart"]["cause"]
    assert "only 128 of the prompt's 300 tokens were found in L3, fewer than SGLang's prefetch threshold (256 tokens)" in cause
    assert "not prefetched in time" not in cause


def test_servers_of_one_tier_serving_other_models_prove_the_sharing_among_themselves():
    """A shared tier with two models (a budgeted tier's usual case): each model's servers form their own ring; a server
    alone with its model is its own writer. One model's servers that differ in anything else stay in one ring."""
    from types import SimpleNamespace as D

    rings = {h: verify.ring_key(d) for h, d in {
        "a1": D(l3_share="t", model_repo=None, model_path="/models/a"),
        "a2": D(l3_share="t", model_repo=None, model_path="/models/a", page_size=32),
        "b1": D(l3_share="t", model_repo=None, model_path="/models/b"),
        "r1": D(l3_share="t", model_repo="org/a", model_path="/models/a"),
        "solo": D(l3_share=None, model_repo=None, model_path="/models/a")}.items()}
    assert rings["solo"] is None and rings["a1"] == rings["a2"] != rings["b1"]
    assert verify.writers(rings) == {"a1": "a2", "a2": "a1", "b1": "b1", "r1": "r1", "solo": "solo"}


def unit(active="active", sub="running", rc=0):
    return {"rc": rc, "stdout": f"ActiveState={active}\nSubState={sub}\nNRestarts=0\n"}


def test_a_running_unit_passes(local):
    result = verify.judge(local, observations(local, unit=unit()), l3=False)
    assert result["ok"] and next(c for c in result["checks"] if c["check"] == "unit")["status"] == "pass", result


@pytest.mark.parametrize("active, sub", [("inactive", "dead"), ("activating", "auto-restart"), ("failed", "failed")])
def test_answers_on_the_port_while_the_unit_is_not_running_are_not_the_servers(local, active, sub):
    """A server started by hand (or another process) answers /health, chat and metrics while the unit is stopped or
    restarting in a loop (Address already in use): verify fails on the unit, naming it."""
    result = verify.judge(local, observations(local, unit=unit(active, sub)), l3=False)
    assert not result["ok"]
    check = failed(result)["unit"]
    assert f"is {active} ({sub})" in check["detail"] and "something else answers" in check["detail"], check


def test_a_host_systemd_does_not_run_leaves_the_unit_not_checked(local):
    result = verify.judge(local, observations(local, unit=unit(rc=1)), l3=False)
    assert result["ok"] and next(c for c in result["checks"] if c["check"] == "unit")["status"] == "not checked", result


def test_a_stopped_unit_with_nothing_on_its_port_is_still_one_failure(local):
    result = verify.judge(local, observations(local, unit=unit("inactive", "dead"), health={"status": -1, "url": "http://h:30000/health"}),
                          l3=False)
    assert list(failed(result)) == ["/health"] and "is inactive (dead)" in failed(result)["/health"]["detail"], result


@pytest.mark.parametrize("read, status, phrase", [
    ({"path": "/mnt/kv/ns", "exists": True, "isdir": True, "writeable": True}, "pass", "there and writable"),
    ({"path": "/mnt/kv/ns", "exists": False}, "fail", "is missing"),
    ({"path": "/mnt/kv/ns", "exists": True, "isdir": True, "writeable": False}, "fail", "not writable"),
])
def test_the_servers_l3_directory_is_there_and_writable(local, read, status, phrase):
    result = verify.judge(local, observations(local, l3_dir=read), l3=False)
    check = next(c for c in result["checks"] if c["check"] == "L3 directory")
    assert check["status"] == status and phrase in check["detail"] and result["ok"] == (status == "pass"), result


def test_the_plan_names_the_l3_directory_the_server_writes(local):
    from hicachectl.config import namespace

    assert verify.plan(local, "salt")["l3_dir"] == namespace.server_dir(local, local.cache_dir)


def test_no_server_is_still_one_failure_with_its_l3_directory_gone(local):
    obs = observations(local, health={"status": -1, "url": "http://h:30000/health"}, l3_dir={"path": "/mnt/kv/ns", "exists": False})
    assert list(failed(verify.judge(local, obs, l3=False))) == ["/health"]


def timed(answer, seconds):
    return {**answer, "seconds": seconds}


def test_l3_that_answers_sooner_than_recompute_says_both_times_and_finds_nothing(local):
    result = verify.judge(local, observations(local, recompute=timed(chat(300), 0.8), reuse=timed(chat(300, cached=256), 0.2)), l3=True)
    hit = next(c for c in result["checks"] if c["check"] == "L3 hit after restart")
    assert hit["status"] == "pass" and hit["detail"].endswith("in 0.20 s against 0.80 s to compute a prompt as long")
    assert result["findings"] == []


@pytest.mark.parametrize("loaded", [0.8, 2.4])  # as slow as recompute is not a win either (bench: ratio >= 1 loses)
def test_l3_slower_than_recompute_is_a_finding_with_benchs_levers_and_the_servers_values(local, loaded):
    info = {"page_size": 64, "served_model_name": local.served_name, "hicache_storage_prefetch_policy": "wait_complete",
            "hicache_storage_backend": "file", "hicache_storage_backend_extra_config": '{"prefetch_threshold": 128}'}
    result = verify.judge(local, observations(local, recompute=timed(chat(300), 0.8), reuse=timed(chat(300, cached=256), loaded),
                                              info_after=answered(json=info)), l3=True)
    assert result["ok"]  # the pages came back: the proof holds; whether they pay is a finding beside it
    (found,) = result["findings"]
    assert found["finding"] == "l3-slower-than-recompute" and found["host"] == local.inventory_host
    assert found["seconds"] == {"recompute": 0.8, "l3": loaded}
    assert f"in {loaded:.2f} s after the restart, against 0.80 s to compute a new prompt as long on the same server" in found["message"]
    assert "a short prompt favours recompute" in found["message"]
    now = {lever["lever"]: lever["now"] for lever in found["levers"]}
    assert now["--hicache-storage-prefetch-policy"] == "wait_complete" and now["--hicache-storage-backend"] == "file"
    assert now["prefetch_threshold (--hicache-storage-backend-extra-config)"] == 128 and "--page-size" in now


def test_l3_timing_is_judged_only_on_a_proof_that_held_and_on_answers_that_were_timed(local):
    no_hit = observations(local, recompute=timed(chat(300), 0.1), reuse=timed(chat(300, cached=0), 5.0),
                          reuse_metrics=answered(content=metrics_text(backuped=256, storage=0)))
    result = verify.judge(local, no_hit, l3=True)
    assert not result["ok"] and result["findings"] == []  # a failed proof is its own cause, not a slow tier
    untimed = verify.judge(local, observations(local, reuse=timed(chat(300, cached=256), 5.0)), l3=True)
    assert untimed["ok"] and untimed["findings"] == [] and "to compute" not in untimed["checks"][-1]["detail"]
    failed = observations(local, recompute=timed(answered(status=-1), 0.01), reuse=timed(chat(300, cached=256), 5.0))
    assert verify.judge(local, failed, l3=True)["findings"] == []
    assert verify.judge(local, observations(local, recompute=timed(chat(300), 0.1), reuse=timed(chat(300, cached=256), 5.0)), l3=False)["findings"] == []


def test_the_recompute_is_this_servers_own_not_the_writers_first_answer():
    """Across servers the writer may be another GPU, and its answer was not its first after a restart: the proof's answer
    from L3 is timed against a prompt as long computed by the same server, after the same restart."""
    writer, reader = shared_pair()
    obs = shared_obs(writer, reader, fill=timed(chat(300), 0.1), recompute=timed(chat(272), 1.5))
    obs["reuse"] = timed(obs["reuse"], 0.9)  # slower than the writer computed it, faster than this server does
    result = verify.judge(reader, obs, l3=True, writer=writer)
    assert result["ok"] and result["findings"] == []
    assert result["checks"][-1]["detail"].startswith("256 of 272 prompt tokens cached") and "against 1.50 s" in result["checks"][-1]["detail"]


def test_the_recompute_prompt_is_as_long_as_the_proofs_and_new_to_every_server(local):
    planned = verify.plan(local, "run-1")
    proof, recompute = planned["l3_probe"]["messages"][0]["content"], planned["recompute_probe"]["messages"][0]["content"]
    assert len(recompute.split()) == len(proof.split()) and recompute != proof
    assert recompute.split()[0] != proof.split()[0] and verify.plan(local, "run-2")["recompute_probe"] != planned["recompute_probe"]
