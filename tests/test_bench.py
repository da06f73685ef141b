"""`hicachectl bench` against the SGLang stand-in, whose prefill model is known: the speedup it reports
must match that model. The stand-in prefills one prompt at a time, as one GPU would. Three phases per level
(recompute, from L3, from host memory after filler traffic), the L3/recompute ratio and the GB/s read from L3; a slow tier
(the stand-in's STANDIN_L3_READ_DELAY) makes L3 lose, which bench reports as a finding with SGLang's levers; and
bench never sends SGLang's L3 clear (the stand-in logs it on stderr if it arrives)."""

from __future__ import annotations

import dataclasses
import inspect
import json
import statistics
import sys
import urllib.error
import urllib.request

import pytest
from support import ROOT, cli

from hicachectl.ops import bench, metrics

sys.path.insert(0, str(ROOT / "tests/standin"))
import sglang_pages  # noqa: E402  the stand-in's model (its page bytes), no torch at import
import sglang_standin  # noqa: E402  the route and log line of SGLang's L3 clear

PREFILL_US, LOAD_US, PAGE, WORDS = 1000, 200, 64, 2000  # sleeps of 0.4-2 s: HTTP costs stay far below 10%
STANDIN_CONFIG = sglang_pages.CONFIG_JSON  # the stand-in's model as a config.json: 2048 bytes per token
STANDIN_BYTES_PER_TOKEN = 2 * 4 * 1 * 128 * 2


def standin_config(tmp_path) -> str:
    path = tmp_path / "config.json"
    path.write_text(json.dumps(STANDIN_CONFIG))
    return str(path)


def l3_clears(proc, port: int) -> int:
    """How many of SGLang's L3 clears the stand-in got before this call: one is sent here as the control (the stand-in
    logs every one on stderr, sglang_standin.L3_CLEAR_LOG), then it is stopped and its stderr read."""
    request = urllib.request.Request(f"http://127.0.0.1:{port}{sglang_standin.L3_CLEAR}", data=b"{}", method="POST")
    try:
        urllib.request.urlopen(request, timeout=10).close()
    except urllib.error.HTTPError as exc:
        assert exc.code == 400  # the stand-in refuses it, and logs it
    proc.terminate()
    _, stderr = proc.communicate(timeout=30)
    assert stderr.count(sglang_standin.L3_CLEAR_LOG) >= 1, stderr  # the control reached the log: the check can fail
    return stderr.count(sglang_standin.L3_CLEAR_LOG) - 1


def model_seconds(cached: int) -> float:
    return ((WORDS - cached) * PREFILL_US + cached * LOAD_US) / 1e6


def expected_speedup(served_cold: list[float], served_warm: list[float]) -> float:
    """The speedup as the server saw it: the mean TTFT of a level's recompute requests over that of its L3 requests,
    each timed by the stand-in from the request's arrival to its first token. What bench measured can differ only by
    the HTTP round trips on loopback, not by the load of a busy machine (the sleeps' overshoot, threads waiting for
    a core), which lands in both."""
    return statistics.fmean(served_cold) / statistics.fmean(served_warm)


def per_level(port: int, record: str, levels=(1, 2, 4)) -> dict[int, tuple[list[float], list[float], list[float]]]:
    """Per level, one of the stand-in's per-request records (its own endpoints, not SGLang's) of each recompute, L3 and
    repeat request, in the order the stand-in served them (it has no GPU or host cache: the repeat reads L3 again,
    its "warm" too)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/standin/{record}", timeout=10) as answer:
        seconds = json.loads(answer.read())
    assert len(seconds["cold"]) == sum(levels) and len(seconds["warm"]) == 2 * sum(levels), seconds  # every request recorded
    out, cold, warm = {}, 0, 0
    for level in levels:
        out[level] = (seconds["cold"][cold:cold + level], seconds["warm"][warm:warm + level], seconds["warm"][warm + level:warm + 2 * level])
        cold, warm = cold + level, warm + 2 * level
    return out


@pytest.mark.slow  # the stand-in's L3 is SGLang's own file backend (CPU torch): a start takes 5-20 s here
def test_bench_reports_three_phases_the_ratio_and_the_l3_rate_as_table_json_and_png_and_never_clears_l3(standin, tmp_path):
    port, proc = standin("--served-model-name", "bench", "--page-size", str(PAGE), "--hicache-storage-backend", "file",
                         "--enable-metrics", "--enable-cache-report",
                         env={"STANDIN_PREFILL_US_PER_TOKEN": str(PREFILL_US), "STANDIN_LOAD_US_PER_TOKEN": str(LOAD_US)})
    out = tmp_path / "result"
    run = cli("bench", "--url", f"http://127.0.0.1:{port}", "--concurrency", "1,2,4", "--input-len", str(WORDS), "--out", str(out),
              "--model-config", standin_config(tmp_path))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split()[:2] == ["concurrency", "prompt"] and [line.split()[0] for line in lines[2:5]] == ["1", "2", "4"]
    for header in ("recompute TTFT s", "from L3 TTFT s", "L3/recompute", "L3 read GB/s", "host memory TTFT s", "host phase served from"):
        assert header in lines[0], (header, lines[0])
    assert not any(line.startswith("finding:") for line in lines), run.stdout  # L3 wins here
    data = json.loads((out / "bench.json").read_text())
    assert [row["concurrency"] for row in data["levels"]] == [1, 2, 4] and data["findings"] == []
    assert data["l3_bytes_per_token"] == STANDIN_BYTES_PER_TOKEN, data["l3_bytes_basis"]
    l3 = per_level(port, "l3_seconds")  # SGLang's backend's seconds: every request went through it
    assert all(t > 0 for _, warm, _ in l3.values() for t in warm)  # the pages really came back through SGLang's backend
    served = per_level(port, "served_ttft")
    loaded = WORDS // PAGE * PAGE
    for row, line in zip(data["levels"], lines[2:5], strict=True):
        c = row["concurrency"]
        # the stand-in is its model: no request is served faster than its prefill and copy (the sleeps) and its L3 work
        assert all(t >= model_seconds(0) + l3_t for t, l3_t in zip(sorted(served[c][0]), sorted(l3[c][0]), strict=True)), (served[c], l3[c])
        assert min(served[c][1]) >= model_seconds(loaded), served[c]
        expected = expected_speedup(served[c][0], served[c][1])
        assert abs(row["speedup"] / expected - 1) < 0.10, (row, expected, served[c], l3[c])
        assert row["l3_recompute_ratio"] == pytest.approx(row["l3_mean_s"] / row["recompute_mean_s"], abs=2e-3)
        assert row["l3_recompute_ratio"] == pytest.approx(1 / row["speedup"], rel=0.02) and row["l3_loses"] is False
        assert row["prompt_tokens"] == WORDS and row["l3_storage_share"] > 0.98
        assert row["recompute_mean_s"] >= WORDS * PREFILL_US / 1e6  # TTFT cannot beat the prefill it waits for
        # every phase in the text row: recompute, L3, ratio, share, GB/s, repeat, its source
        assert f"{row['recompute_mean_s']:.2f} / " in line and f"{row['l3_mean_s']:.2f} / " in line and f"{row['repeat_mean_s']:.2f} / " in line
        assert f"{row['l3_recompute_ratio']:.2f}" in line and line.rstrip().endswith("storage 99% (repeat: no filler)"), line
        # bytes from L3: the tokens SGLang's prefetch moved (sglang:prefetched_tokens_total) x the page bytes per token
        assert row["l3_read_tokens"] == c * loaded and row["l3_read_bytes"] == c * loaded * STANDIN_BYTES_PER_TOKEN
        assert row["l3_read_gbps"] == pytest.approx(row["l3_read_bytes"] / row["l3_seconds"] / 1e9, rel=1e-3)
        assert row["l3_op_gbps"] is None  # the file backend times no read (HiCacheStorage.get_stats: None)
        # this stand-in has no GPU or host pool (no --max-total-tokens, so no max_total_num_tokens in /server_info): no
        # filler is sent, the third phase is read from L3 again, and bench says so, not "host"
        assert row["repeat_sources"] == {"device": 0.0, "host": 0.0, "storage": round(loaded / WORDS, 4), "basis": "metrics"}
        assert row["repeat_served_from"] == "storage 99%"
        assert (row["host_sources"], row["host_served_from"], row["host_mean_s"]) == (row["repeat_sources"], "storage 99%", row["repeat_mean_s"])
        assert row["host_filler_tokens"] == 0 and "no max_total_num_tokens: no filler sent" in row["host_notes"][0]
        assert f"host phase, concurrency {c}: 0 filler tokens sent; served from storage 99%" in run.stdout
        assert row["l3_sources"]["storage"] == round(loaded / WORDS, 4)
        # the names before issue #35 stay: cold = recompute, warm = l3
        assert (row["cold_mean_s"], row["warm_p90_s"], row["warm_storage_share"]) == (row["recompute_mean_s"], row["l3_p90_s"], row["l3_storage_share"])
    assert run.stdout.count("this phase is not a host-memory measurement") == 3
    four = data["requests"]["4"]
    assert len(four["recompute"]) == len(four["l3"]) == len(four["repeat"]) == 4 and four["cold"] == four["recompute"] and four["warm"] == four["l3"]
    assert four["host"] == four["repeat"]
    assert all(r["cached_tokens"] == 0 and r["cached_by_source"] is None for r in four["recompute"])
    assert all(r["cached_tokens"] == loaded for r in four["l3"])
    # the responses' own breakdown (sglext.cached_tokens_details), asked of the server
    assert all(r["cached_by_source"] == {"device": 0, "host": 0, "storage": loaded} for r in four["l3"] + four["repeat"])
    # one GPU: the fourth cold prompt waits for the three before it
    assert max(r["ttft"] for r in four["recompute"]) > 3.5 * WORDS * PREFILL_US / 1e6
    png = (out / "bench.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert "from L3 (warm after flush_cache" in run.stderr  # "warm after ...": what tests/fleet read
    assert l3_clears(proc, port) == 0  # bench reset the server three times (once per level) and never cleared L3


@pytest.mark.slow  # the stand-in's L3 is SGLang's own file backend (CPU torch): a start takes 5-20 s here
def test_bench_says_when_l3_loses_to_recompute_with_sglangs_levers(standin, tmp_path):
    """A slow tier (STANDIN_L3_READ_DELAY: 200 ms per page read) against a fast prefill: 31 pages from L3 take 6.2 s,
    recomputing the 2000 tokens 0.4 s. bench must say L3 loses, in the text and in --json, with the levers."""
    delay, prefill = 0.2, 200
    port, proc = standin("--served-model-name", "bench", "--page-size", str(PAGE), "--hicache-storage-backend", "file",
                         "--enable-metrics", "--hicache-storage-prefetch-policy", "wait_complete",
                         env={"STANDIN_PREFILL_US_PER_TOKEN": str(prefill), "STANDIN_LOAD_US_PER_TOKEN": "20",
                              "STANDIN_L3_READ_DELAY": str(delay)})
    args = ("bench", "--url", f"http://127.0.0.1:{port}", "--concurrency", "1", "--input-len", str(WORDS))
    run = cli(*args, "--out", str(tmp_path / "text"))
    assert run.returncode == 0, run.stderr  # measured: a finding is a result, not a failure
    lines = run.stdout.splitlines()
    assert "LOSES" in lines[2], lines[2]
    [finding] = [line for line in lines if line.startswith("finding:")]
    assert "L3 does not beat recompute at concurrency 1" in finding, finding
    text = run.stdout
    for lever in ("--hicache-storage-prefetch-policy [now: wait_complete]", "prefetch_threshold (--hicache-storage-backend-extra-config) [now: 256]",
                  "--hicache-storage-backend [now: file]",
                  "--page-size [now: 64]", "--hicache-io-backend [now: kernel]"):
        assert lever in text, (lever, text)
    assert "L3 read GB/s: no model config.json" in text  # no --model-config: bytes unknown, and said
    assert lines[-1].startswith("wrote ")
    data = json.loads(cli(*args, "--out", str(tmp_path / "json"), "--json", check_rc=0).stdout)
    [row] = data["levels"]
    assert row["l3_loses"] is True and row["l3_recompute_ratio"] > 1 and row["speedup"] < 1
    assert row["l3_mean_s"] >= (WORDS // PAGE) * delay  # the slow reads are in the L3 phase's TTFT
    assert row["recompute_mean_s"] < row["l3_mean_s"] and row["l3_storage_share"] > 0.98  # L3 served it, slowly
    [found] = data["findings"]
    assert found["finding"] == "l3-slower-than-recompute" and found["levels"] == [1]
    assert {lever["lever"]: lever["now"] for lever in found["levers"]} == {
        "--hicache-storage-prefetch-policy": "wait_complete", "prefetch_threshold (--hicache-storage-backend-extra-config)": 256,
        "--hicache-storage-backend": "file", "--page-size": 64, "--hicache-io-backend": "kernel"}
    assert all(lever["source"] for lever in found["levers"])
    assert l3_clears(proc, port) == 0



@pytest.mark.slow  # the stand-in's L3 is SGLang's own file backend (CPU torch): a start takes 5-20 s here
def test_bench_pushes_the_prompts_off_the_gpu_so_its_third_phase_is_served_from_host_memory(standin, tmp_path):
    """A stand-in with SGLang's --max-total-tokens models the GPU pool (6400 tokens) and the host pool (--hicache-ratio 4:
    25600) with SGLang's LRU and write-through (tests/standin KvTiers). bench sends more filler tokens than the GPU holds
    before the third phase, so SGLang counts that phase's cached tokens as host hits; without the filler
    (--no-host-phase) they are GPU hits; with a host pool too small to keep the prompts besides the filler (ratio 1.7:
    10,880 tokens against 10,000 of filler and 2,000 of prompts), they come from L3 again and bench says so and that
    this phase is not a host-memory measurement. Under write_through_selective (a page copied to host and L3 at its
    second hit; bench sends the prompts twice) and write_back (only what the GPU evicts is copied: at level 2, 5,600 of
    12,000 filler tokens, 4,000 more as the prompts come back, beside their 4,000: 2.2 x 6,400 holds them, where
    write_through would need 16,000), a smaller host pool keeps them: from host memory at every level, no note."""
    prefill, load = 200, 20
    env = {"STANDIN_PREFILL_US_PER_TOKEN": str(prefill), "STANDIN_LOAD_US_PER_TOKEN": str(load)}
    flags = ("--served-model-name", "bench", "--page-size", str(PAGE), "--hicache-storage-backend", "file", "--enable-metrics",
             "--max-total-tokens", "6400")
    port, proc = standin(*flags, "--hicache-ratio", "4", env=env)
    loaded = WORDS // PAGE * PAGE
    run = cli("bench", "--url", f"http://127.0.0.1:{port}", "--concurrency", "1,2", "--input-len", str(WORDS), "--out", str(tmp_path / "a"),
              "--json", check_rc=0)
    data = json.loads(run.stdout)
    for row in data["levels"]:
        c = row["concurrency"]
        assert row["host_served_from"] == "host 99%", row
        assert row["host_sources"] == {"device": 0.0, "host": round(loaded / WORDS, 4), "storage": 0.0, "basis": "metrics"}
        assert (row["host_gpu_pool_tokens"], row["host_pool_tokens"]) == (6400, 25600) and row["host_notes"] == []
        assert 6400 + c * WORDS <= row["host_filler_tokens"] < 6400 + c * WORDS + WORDS  # past the GPU pool, by less than a prompt
        assert row["host_mean_s"] < row["recompute_mean_s"] and row["host_mean_s"] >= (loaded * load + (WORDS - loaded) * prefill) / 1e6
    assert all(r["cached_by_source"] == {"device": 0, "host": loaded, "storage": 0} for r in data["requests"]["2"]["host"])
    text = cli("bench", "--url", f"http://127.0.0.1:{port}", "--concurrency", "1", "--input-len", str(WORDS), "--out", str(tmp_path / "b"),
               "--no-host-phase", check_rc=0).stdout
    assert "host phase, concurrency 1: 0 filler tokens sent; served from device 99%" in text, text
    assert "no filler sent (--no-host-phase)" in text and "not a host-memory measurement" in text
    assert l3_clears(proc, port) == 0
    small, small_proc = standin(*flags, "--hicache-ratio", "1.7", env=env)
    text = cli("bench", "--url", f"http://127.0.0.1:{small}", "--concurrency", "1", "--input-len", str(WORDS), "--out", str(tmp_path / "c"),
               check_rc=0).stdout
    assert "its host pool (10,880 tokens) cannot hold the filler it keeps (10,000) and the prompts (2,000)" in text, text
    assert "served from storage 99%" in text and "SGLang served 0% of the prompt from host memory" in text, text
    assert l3_clears(small_proc, small) == 0
    for policy, ratio in (("write_through_selective", "1.5"), ("write_back", "2.2")):
        other, other_proc = standin(*flags, "--hicache-ratio", ratio, "--hicache-write-policy", policy, env=env)
        data = json.loads(cli("bench", "--url", f"http://127.0.0.1:{other}", "--concurrency", "1,2", "--input-len", str(WORDS),
                              "--out", str(tmp_path / policy), "--json", check_rc=0).stdout)
        for row in data["levels"]:
            assert row["l3_storage_share"] > 0.98 and row["host_served_from"] == "host 99%" and row["host_notes"] == [], (policy, row)
        assert l3_clears(other_proc, other) == 0

def test_bench_never_names_sglangs_l3_clear():
    """The route is not in the bench's code at all (tests/unit/ops/test_no_l3_clear.py scans everything shipped)."""
    for module in (bench, sys.modules.get("hicachectl.cli.bench") or __import__("hicachectl.cli.bench", fromlist=["bench"])):
        source = inspect.getsource(module)
        assert "/clear" not in source and sglang_standin.L3_CLEAR not in source


def test_bench_refuses_a_server_it_cannot_reach_and_bad_usage():
    assert cli("bench", "--url", "http://127.0.0.1:9", "--concurrency", "1", "--input-len", "10").returncode == 1
    assert cli("bench", "--concurrency", "1").returncode == 2
    assert cli("bench", "--url", "http://x", "--concurrency", "0").returncode == 2


def test_bench_flushes_a_server_with_an_admin_key_only_with_that_key_and_never_prints_it(standin, tmp_path):
    """SGLang asks for the admin key at /flush_cache once the server has one (utils/auth.py, ADMIN_OPTIONAL): bench
    --url takes it from HICACHE_ADMIN_API_KEY (never a flag, which `ps` shows)."""
    key = "bench-admin-key-0123456789"
    port, _ = standin("--served-model-name", "bench", "--admin-api-key", key)
    args = ("bench", "--url", f"http://127.0.0.1:{port}", "--concurrency", "1", "--input-len", "10")
    without = cli(*args, "--out", str(tmp_path / "a"))
    assert without.returncode == 1 and "flush_cache answered 401" in without.stderr and "HICACHE_ADMIN_API_KEY" in without.stderr, without.stderr
    wrong = cli(*args, "--out", str(tmp_path / "b"), env={"HICACHE_ADMIN_API_KEY": "not-the-key-but-a-secret"})
    assert wrong.returncode == 1 and "refused the key" in wrong.stderr, wrong.stderr
    assert "not-the-key-but-a-secret" not in wrong.stdout + wrong.stderr
    right = cli(*args, "--out", str(tmp_path / "c"), env={"HICACHE_ADMIN_API_KEY": key})
    assert right.returncode == 0, right.stderr
    assert key not in right.stdout + right.stderr + (tmp_path / "c" / "bench.json").read_text()


def test_percentiles_and_storage_share():
    phase = bench.Phase([bench.Request(t, 100, 50) for t in (1.0, 2.0, 3.0, 4.0, 10.0)], storage_tokens=None)
    assert (phase.ttft("mean"), phase.ttft("p50")) == (4.0, 3.0)
    assert phase.ttft("p90") == pytest.approx(4 + 0.6 * 6)  # interpolated between the 4th and 5th of 5
    assert phase.storage_share == 0.5  # from the responses when metrics are off
    assert phase.source_shares() is None  # the responses gave no breakdown: the source is not known
    assert bench.Phase(phase.requests, storage_tokens=400).storage_share == 0.8
    assert metrics.total('a{tp_rank="0"} 3\na{tp_rank="1"} 3\n', "a") == 3
    # bench's written tokens (metrics.total, as verify's): the pipeline stages of one server report the same tokens
    assert metrics.total('a{tp_rank="0",pp_rank="0",pp_size="2"} 3\na{tp_rank="0",pp_rank="1",pp_size="2"} 3\n', "a") == 3


def _level(c: int, recompute: float, l3: float, repeat_sources=None) -> bench.Level:
    def phase(t, cached, by_source=None, sources=None):
        return bench.Phase([bench.Request(t, 1000, cached, by_source)] * c, storage_tokens=None, seconds=2 * t, sources=sources)
    return bench.Level(c, phase(recompute, 0), phase(l3, 960, {"device": 0, "host": 0, "storage": 960}),
                       phase(0.1, 960, None, repeat_sources), backed_up_tokens=None)


def test_the_host_phase_reads_sglangs_pools_and_says_when_the_host_pool_cannot_keep_the_prompts():
    info = {"max_total_num_tokens": 6400, "dp_size": 2, "hicache_ratio": 3.0}
    assert bench.gpu_pool_tokens(info) == 6400 and bench.gpu_pool_tokens({}) is None  # one scheduler's
    # the schedulers: DP replicas x attention-DP groups (0.5.23 resolves --dp-size N --enable-dp-attention to attn_dp_size N)
    assert bench.dp_replicas(info) == 2 and bench.dp_replicas({"dp_size": 1, "attn_dp_size": 4}) == 4 and bench.dp_replicas({}) == 1
    assert bench.host_pool_tokens(info, None) == 19200  # hicache_ratio x the GPU pool, without the gauge
    assert bench.host_pool_tokens({"max_total_num_tokens": 100}, None) == 200  # SGLang's ratio when unset: 2
    # SGLang's own gauge wins (its auto-sizing may lower the ratio): one scheduler's, each DP group logging its own at
    # its attention-TP rank 0 (tp_rank 0 and 4 here), all alike
    gauge = ('sglang:hicache_host_total_tokens{tp_rank="0",pp_rank="0",dp_rank="0"} 9000\n'
             'sglang:hicache_host_total_tokens{tp_rank="4",pp_rank="0",dp_rank="1"} 9000\n')
    assert bench.host_pool_tokens(info, gauge) == 9000
    # what the host pool keeps of the filler, by write policy
    # (write_back: what the filler pushed off the GPU, then what the 2,000 tokens of returning prompts push off)
    assert [bench.filler_in_host(p, 10000, 6400, 2000) for p in ("write_through", None, "write_back", "write_through_selective")] == [
        10000, 10000, 5600, 0]
    assert bench.filler_in_host("write_back", 3000, 6400, 4000) == 3000  # never more than was sent
    assert bench.host_pool_tokens({**info, "hicache_size": 40}, None) is None  # GB per rank: bytes per token unknown
    rows = bench.summary([dataclasses.replace(_level(1, 2.0, 0.5, {"device": 0.0, "host": 0.0, "storage": 990.0}),
                                                    eviction=bench.Eviction(8400, 6400, 7680, ["its host pool is small"]))])
    assert (rows[0]["host_filler_tokens"], rows[0]["host_gpu_pool_tokens"], rows[0]["host_pool_tokens"]) == (8400, 6400, 7680)
    text = "\n".join(bench.host_lines(rows))
    assert "8,400 filler tokens sent (GPU pool 6,400 tokens, host pool 7,680); served from storage 99%" in text
    assert "  its host pool is small" in text and "SGLang served 0% of the prompt from host memory" in text



def test_the_filler_fills_each_scheduler_pinned_to_it_in_rounds_trimmed_to_what_is_needed(monkeypatch):
    """A server of two attention-DP groups (each its own GPU pool of 6,400 tokens), a level of 3 prompts of 2,000
    tokens: each group may hold 2 of them, so each gets 6,400 + 4,000 tokens of filler, pinned to it (routed_dp_rank),
    3 at a time and the last round only as many as needed; no filler text repeats another level's or rank's."""
    sent = []

    def send_all(url, bodies, timeout, done):
        sent.append([json.loads(b) for b in bodies])
        return [bench.Request(0.1, 2000, 0) for _ in bodies]

    info = {"max_total_num_tokens": 6400, "dp_size": 1, "attn_dp_size": 2, "hicache_write_policy": "write_back", "hicache_ratio": 2.2}
    monkeypatch.setattr(bench, "server_info", lambda url: info)
    monkeypatch.setattr(bench, "read_metrics", lambda url: None)
    monkeypatch.setattr(bench, "send_all", send_all)
    eviction = bench.evict_gpu(bench.Target("http://s"), "m", "salt", 3, 2000, 60)
    assert [len(r) for r in sent] == [3, 3, 3, 3]  # per rank 10,400 tokens: a round of 3, then 3 (ceil(4,400 / 2,000))
    assert [{q["routed_dp_rank"] for q in r} for r in sent] == [{0}, {0}, {1}, {1}]
    texts = [q["messages"][0]["content"].split()[0] for r in sent for q in r]
    assert len(set(texts)) == 12 and all(t.startswith("salt-c3-filler-") for t in texts)
    assert (eviction.filler_tokens, eviction.gpu_tokens, eviction.host_tokens) == (24000, 12800, 28160)
    # write_back keeps in host only what the GPU evicts of the filler: 12,000 - 6,400, then 4,000 more as the prompts
    # come back, beside their own 4,000: 13,600 of 14,080
    assert eviction.notes == []
    info["hicache_write_policy"] = "write_through"  # every filler page copied: 12,000 + 4,000 > 14,080
    assert "cannot hold the filler it keeps (12,000) and the prompts (4,000)" in bench.evict_gpu(bench.Target("http://s"), "m", "s", 3, 2000, 60).notes[0]
    info["hicache_host_memory_mode"] = "buffer_only"  # host memory serves nothing: no filler sent, and said
    sent.clear()
    eviction = bench.evict_gpu(bench.Target("http://s"), "m", "s", 3, 2000, 60)
    assert sent == [] and eviction.filler_tokens == 0 and "buffer_only" in eviction.notes[0]

def test_a_finding_only_where_l3_is_not_faster_and_the_repeat_is_named_by_its_source():
    rows = bench.summary([_level(1, 2.0, 0.5, {"device": 990.0, "host": 0.0, "storage": 0.0}),
                          _level(2, 2.0, 2.0, {"device": 600.0 * 2, "host": 360.0 * 2, "storage": 0.0})], bytes_per_token=1000)
    assert [r["l3_loses"] for r in rows] == [False, True] and [r["l3_recompute_ratio"] for r in rows] == [0.25, 1.0]
    assert rows[0]["repeat_served_from"] == "device 99%" and rows[1]["repeat_served_from"] == "device 60%, host 36%"
    assert rows[0]["repeat_sources"]["basis"] == "metrics" and rows[0]["l3_sources"]["basis"] == "responses"
    # bytes: no prefetch metric, so the responses' storage tokens x bytes per token, over the phase's wall time
    assert rows[0]["l3_read_bytes"] == 960 * 1000 and rows[0]["l3_read_gbps"] == pytest.approx(960 * 1000 / 1.0 / 1e9, rel=1e-3)
    # the seconds beside the GB/s are those it was computed from, not rounded away from it (a phase of 0.1167 s)
    [row] = bench.summary([bench.Level(1, _level(1, 2.0, 0.5).recompute, bench.Phase(
        [bench.Request(0.5, 1000, 960, {"device": 0, "host": 0, "storage": 960})], storage_tokens=None, seconds=0.11674),
        None, backed_up_tokens=None)], bytes_per_token=1000)
    assert row["l3_read_gbps"] == pytest.approx(row["l3_read_bytes"] / row["l3_seconds"] / 1e9, rel=1e-3)
    [found] = bench.findings(rows, {"hicache_storage_prefetch_policy": "timeout", "page_size": 64})
    assert found["levels"] == [2] and "1.00x recompute's at 2" in found["message"]
    assert {lever["lever"].split()[0] for lever in found["levers"]} == {
        "--hicache-storage-prefetch-policy", "prefetch_threshold", "--hicache-storage-backend", "--page-size", "--hicache-io-backend"}
    text = "\n".join(bench.finding_lines([found]))
    assert text.startswith("finding: L3 does not beat recompute at concurrency 2") and "--page-size [now: 64]" in text
    assert bench.findings(rows[:1]) == []
    # the threshold the server uses: its extra config's, else SGLang's 256; unknown when the config is a file on its host
    def threshold(info):
        return {lever["setting"]: lever["now"] for lever in bench.findings(rows, info)[0]["levers"]}["hicache_storage_backend_extra_config"]
    assert threshold({"hicache_storage_backend_extra_config": '{"prefetch_threshold": 1024}'}) == 1024
    assert threshold({"page_size": 64}) == 256 and threshold({"hicache_storage_backend_extra_config": "@/etc/x.toml"}) is None
    # a loss where L3 served little is said to be missing pages, not a slow tier
    rows[1]["l3_storage_share"] = 0.1
    assert "only 10% of its prompt came from L3" in bench.findings(rows)[0]["message"]
    assert bench.served_from(None) == "unknown" and bench.served_from({"device": 0, "host": 0, "storage": 0}) == "prefilled"


def test_l3_bytes_per_token_from_the_models_config_and_the_servers_parallelism():
    llama = str(ROOT / "tests/model_configs/llama-3.1-8b-instruct.json")  # 32 layers, 8 KV heads of 128, bf16
    assert bench.l3_bytes_per_token(llama, {"tp_size": 1, "page_size": 64})[0] == 32 * 8 * 2 * 128 * 2
    assert bench.l3_bytes_per_token(llama, {"tp_size": 2, "page_size": 64})[0] == 32 * 8 * 2 * 128 * 2  # each rank its heads
    assert bench.l3_bytes_per_token(llama, {"tp_size": 1, "page_size": 64, "kv_cache_dtype": "fp8_e4m3"})[0] == 32 * 8 * 2 * 128
    per_token, basis = bench.l3_bytes_per_token(None, {})
    assert per_token is None and "--model-config" in basis


def test_the_tier_reads_are_the_backends_and_the_share_is_bench_over_raw():
    from hicachectl import rules

    def deployment(**variables):
        d, found = rules.check_host("h1", {"hicache_image": "lmsysorg/sglang:v0.5.23-cu129", **variables})
        assert d is not None and not rules.has_errors(found), [f.format() for f in found]
        return d

    llama = str(ROOT / "tests/model_configs/llama-3.1-8b-instruct.json")  # 32 layers x 8 KV heads of 128, bf16: 128 KiB per token
    base = {"hicache_model_path": "/models/m", "hicache_storage_backend": "file", "hicache_cache_dir": "/mnt/l3", "hicache_page_size": 64,
            "hicache_tp_size": 2}
    reads, how = bench.tier_reads(deployment(**base), llama)
    assert reads == {"read_bytes": 64 * 65536, "queue_depth": 2, "direct": False} and "plain reads" in how  # a rank's page, ranks at once
    reads, how = bench.tier_reads(deployment(**{**base, "hicache_storage_backend": "nixl"}), llama)
    assert reads == {"read_bytes": 64 * 65536 // 2, "queue_depth": 2 * 256, "direct": True}, how  # K or V; NIXL's queue per rank
    reads, _ = bench.tier_reads(deployment(**{**base, "hicache_storage_backend": "nixl",
                                              "hicache_extra_config": {"use_direct_io": False, "kernel_queue_size": 64}}), llama)
    assert reads == {"read_bytes": 64 * 65536 // 2, "queue_depth": 2 * 64, "direct": False}
    assert bench.tier_reads(deployment(**base), None)[0] is None
    rows = [{"concurrency": 1, "l3_read_gbps": 0.5}, {"concurrency": 4, "l3_read_gbps": 1.5}]
    share = bench.tier_share(rows, {"a": {"gbps": 2.0, "method": "fio", "read_bytes": 4096, "files": 1}, "b": {"gbps": 1.0}})
    assert share == {"tier_gbps": 3.0, "l3_read_gbps": 1.5, "concurrency": 4, "share": 0.5}
    lines = bench.tier_lines({"a": {"gbps": 2.0, "method": "fio libaio iodepth=256 direct=1", "read_bytes": 4096, "files": 8, "notes": []},
                              "b": {"why": "unreachable"}}, share)
    assert lines == ["L3 tier of a: 2 GB/s raw (fio libaio iodepth=256 direct=1, reads of 4,096 B, 8 files)",
                     "L3 tier of b: not measured: unreachable",
                     "SGLang's backend reached 1.5 GB/s from L3 (concurrency 4): 50.0% of the tier's 3 GB/s"]
    assert bench.tier_share(rows, {"b": {"why": "unreachable"}}) is None


def test_bench_tier_needs_an_inventory():
    run = cli("bench", "--url", "http://127.0.0.1:9", "--tier", "--concurrency", "1")
    assert run.returncode == 2 and "--tier needs --inventory" in run.stderr
