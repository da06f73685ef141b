"""`hicachectl bench` against the SGLang stand-in, whose prefill model is known: the speedup it reports
must match that model. The stand-in prefills one prompt at a time, as one GPU would."""

from __future__ import annotations

import json
import statistics
import urllib.request

import pytest
from support import cli

from hicachectl.ops import bench, metrics

PREFILL_US, LOAD_US, PAGE, WORDS = 1000, 200, 64, 2000  # sleeps of 0.4-2 s: HTTP costs stay far below 10%


def model_seconds(cached: int) -> float:
    return ((WORDS - cached) * PREFILL_US + cached * LOAD_US) / 1e6


def expected_speedup(l3_cold: list[float] | None = None, l3_warm: list[float] | None = None) -> float:
    """The stand-in serves one prompt at a time, as one GPU: a prompt's time is the model's (every token prefilled cold;
    warm, the uncached tail prefilled and the cached pages copied to the GPU) plus SGLang's file backend's real work on
    the tier (cold: lookup and write-through; warm: lookup and read), measured per request by the stand-in. Prompts sent
    together queue, so the k-th waits for those before it: the mean TTFT is the mean of the running sums."""
    def mean_ttft(services):
        sums, total = [], 0.0
        for service in services:
            total += service
            sums.append(total)
        return statistics.fmean(sums)
    cached = WORDS // PAGE * PAGE
    l3_cold, l3_warm = l3_cold or [0.0], l3_warm or [0.0]
    return mean_ttft([model_seconds(0) + t for t in l3_cold]) / mean_ttft([model_seconds(cached) + t for t in l3_warm])


def measured_l3_seconds(port: int, levels=(1, 2, 4)) -> dict[int, tuple[list[float], list[float]]]:
    """Per level, the backend's seconds of each cold and each warm request, in the order the stand-in served them."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/standin/l3_seconds", timeout=10) as answer:
        l3 = json.loads(answer.read())
    assert len(l3["warm"]) == len(l3["cold"]) == sum(levels), l3  # every request went through SGLang's backend
    out, start = {}, 0
    for level in levels:
        out[level] = (l3["cold"][start:start + level], l3["warm"][start:start + level])
        start += level
    return out


@pytest.mark.slow  # the stand-in's L3 is SGLang's own file backend (CPU torch): a start takes 5-20 s here
def test_bench_reports_the_stand_ins_prefill_model_as_table_json_and_png(standin, tmp_path):
    port, _ = standin("--served-model-name", "bench", "--page-size", str(PAGE), "--hicache-storage-backend", "file",
                      "--enable-metrics", "--enable-cache-report",
                      env={"STANDIN_PREFILL_US_PER_TOKEN": str(PREFILL_US), "STANDIN_LOAD_US_PER_TOKEN": str(LOAD_US)})
    out = tmp_path / "result"
    run = cli("bench", "--url", f"http://127.0.0.1:{port}", "--concurrency", "1,2,4", "--input-len", str(WORDS), "--out", str(out))
    assert run.returncode == 0, run.stderr
    lines = run.stdout.splitlines()
    assert lines[0].split()[:2] == ["concurrency", "prompt"] and [line.split()[0] for line in lines[2:5]] == ["1", "2", "4"]
    data = json.loads((out / "bench.json").read_text())
    assert [row["concurrency"] for row in data["levels"]] == [1, 2, 4]
    l3 = measured_l3_seconds(port)
    assert all(t > 0 for _, warm in l3.values() for t in warm)  # the pages really came back through SGLang's backend
    for row in data["levels"]:
        expected = expected_speedup(*l3[row["concurrency"]])
        assert abs(row["speedup"] / expected - 1) < 0.10, (row, expected, l3[row["concurrency"]])
        assert row["prompt_tokens"] == WORDS and row["warm_storage_share"] > 0.98
        assert row["cold_mean_s"] >= WORDS * PREFILL_US / 1e6  # TTFT cannot beat the prefill it waits for
    four = data["requests"]["4"]
    assert len(four["cold"]) == 4 and all(r["cached_tokens"] == 0 for r in four["cold"])
    assert all(r["cached_tokens"] == WORDS // PAGE * PAGE for r in four["warm"])
    # one GPU: the fourth cold prompt waits for the three before it
    assert max(r["ttft"] for r in four["cold"]) > 3.5 * WORDS * PREFILL_US / 1e6
    png = (out / "bench.png").read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 10_000
    assert "warm after flush_cache" in run.stderr


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
    assert bench.Phase(phase.requests, storage_tokens=400).storage_share == 0.8
    assert metrics.total('a{tp_rank="0"} 3\na{tp_rank="1"} 3\n', "a") == 3
    # bench's written tokens (metrics.total, as verify's): the pipeline stages of one server report the same tokens
    assert metrics.total('a{tp_rank="0",pp_rank="0",pp_size="2"} 3\na{tp_rank="0",pp_rank="1",pp_size="2"} 3\n', "a") == 3
