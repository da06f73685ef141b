"""Time-to-first-token in three phases per concurrency level (the seeds' cold and warm, and from host memory), and
whether L3 beats recomputing the prompt (issue #35).

For each concurrency level c, c unique prompts (a fresh salt: nothing of them is cached anywhere) are sent at once
and their TTFT measured from the stream. Output length is 1, as in the seeds (ISL~120k, OSL=1). Three phases:
- recompute: those prompts cold, every token prefilled (the seeds' "cold");
- l3: once /metrics shows their pages written to L3, the server is reset and the same prompts sent again, so the hits
  come from L3 (the seeds' "warm"). The reset is a restart, or POST /flush_cache. What /flush_cache empties, read in
  SGLang 0.5.23: Scheduler.flush_cache (managers/scheduler.py:5518-5547) calls tree_cache.reset(); with HiCache the
  tree is a UnifiedRadixCache (mem_cache/registry.py create_unified_radix_cache, init_hicache) whose reset
  (_reset_full, mem_cache/unified_radix_cache.py:416-453) drops the whole tree, device and host nodes, resets the cache
  controller and calls mem_pool_host.clear(): the device cache and the host pool go, the storage backend is not
  touched. Both resets therefore leave L3 alone and nothing else;
- host: the same prompts a third time, after filler traffic has pushed them off the GPU. SGLang 0.5.23 has no reset
  that empties the device cache and keeps the host pool (/flush_cache clears both, above; /release_memory_occupation
  with the kv_cache tag calls the same flush_cache, managers/scheduler_components/weight_updater.py:351-366), so bench
  evicts (evict_gpu): unique prompts of the level's length, more tokens than each scheduler's GPU pool holds
  (/server_info's max_total_num_tokens: managers/scheduler.py get_init_info) plus the prompts it may hold, each pinned
  to its scheduler where a server has several (DP; dp_replicas). The radix tree evicts its least recently used leaves
  first (mem_cache/evict_policy.py; unified_cache/unified_tree_core.py evict_device_leaf), so the prompts leave the
  GPU before any filler does, and a page with a host copy stays in the tree, host only (_demote): the L3 phase put
  them there (the prefetch lands in the host pool). The host pool keeps them if it also holds what it keeps of the
  filler (filler_in_host: write_through copies every page at its first insert, write_back only what the GPU evicts,
  write_through_selective only at a second hit, which a filler never has: unified_radix_cache.py 558-560,
  1024-1052; under write_through_selective the recompute phase's prompts are sent twice, second_hit, or nothing would
  reach host or L3), which bench checks against sglang:hicache_host_total_tokens (metrics_collector.py 776), else
  hicache_ratio x the GPU pool (mem_cache/pool_host/base.py 221-229). Where the phase's cached tokens came from is
  what SGLang says, never assumed: the scheduler's sglang:cached_tokens_total{cache_source=device|host|storage}
  (observability/metrics_collector.py 2118-2130), else the response's sglext.cached_tokens_details {device, host,
  storage}, which a chat request with return_cached_tokens_details gets (entrypoints/openai/protocol.py
  CachedTokensDetails; serving_chat.py; managers/scheduler_components/output_streamer.py get_cached_tokens_details;
  host = the tokens loaded back from the host pool, managers/schedule_batch.py split_cached_prefix_by_tier). A server
  whose /server_info has no max_total_num_tokens gets no filler: the phase is then a repeat of what it holds.

The L3 phase's read rate: SGLang exports the tokens its prefetch moved from L3 into host memory,
sglang:prefetched_tokens_total (StorageMetricsCollector, observability/metrics_collector.py:2212; logged by
unified_radix_cache.py:2463), not their bytes; bench multiplies them by the bytes an L3 page holds per token (from the
model's config.json, hicachectl/config/sizing.py, with the server's TP, PP, page size and KV dtype from /server_info)
and divides by the phase's wall time. Backends that time their reads (hf3fs, mooncake: get_stats) also export
sglang:prefetch_bandwidth, a histogram of per-op GB/s (metrics_collector.py:2325); file and nixl do not
(HiCacheStorage.get_stats returns None, mem_cache/hicache_storage.py:478).

When the L3 phase is not faster than recompute, `findings` says so with the server settings that decide it (LEVERS).

Through a router (`bench --router`) the prompts go to the router and the metrics are the sum of every
server's /metrics (the router has none of SGLang's); the reset restarts every server, each taken out of the
router and put back once healthy, so the router routes the warm prompts afresh: their L3 hits are what the
fleet serves from L3 as clients reach it (any server with a shared tier, only the writer with a host's own).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import http.client
import json
import statistics
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from typing import Any

from hicachectl.config import secrets, sizing
from hicachectl.config.deployment import Deployment
from hicachectl.formats import prompts
from hicachectl.ops import metrics
from hicachectl.ops.l3 import listable
from hicachectl.plans import l3_collector

# SGLang 0.5.23's names (observability/metrics_collector.py): the cache sources of sglang:cached_tokens_total
# (report_cache_source, 2118-2130), the StorageMetricsCollector's L3-to-host tokens (2212) and per-op read GB/s (2325).
SOURCES = ("device", "host", "storage")
PREFETCHED = "sglang:prefetched_tokens_total"
PREFETCH_BANDWIDTH = "sglang:prefetch_bandwidth"
PHASES = ("recompute", "l3", "host")
HOST_TOTAL = "sglang:hicache_host_total_tokens"  # the host pool's tokens (metrics_collector.py 776; metrics_reporter.py 1238)


class BenchError(RuntimeError):
    pass


@dataclasses.dataclass
class Target:
    base_url: str
    model: str | None = None  # None: the first of /v1/models
    reset: Callable[[], None] | None = None  # None: POST /flush_cache (L3 is kept)
    reset_label: str = "flush_cache"
    metrics_urls: list[str] | None = None  # the servers behind a router (their /metrics summed); None: base_url
    admin_key: str | None = dataclasses.field(default=None, repr=False)  # for /flush_cache, when the server has one
    model_config: str | None = None  # the model's config.json on this machine (hicache_model_config): bytes per token


@dataclasses.dataclass
class Request:
    ttft: float
    prompt_tokens: int
    cached_tokens: int
    # SGLang's sglext.cached_tokens_details of the response (device, host, storage), None when it sent none
    cached_by_source: dict[str, int] | None = None


@dataclasses.dataclass
class Phase:
    requests: list[Request]
    storage_tokens: float | None  # tokens loaded from L3 during the phase (metrics)
    seconds: float | None = None  # wall time: the first request sent to the last answer
    sources: dict[str, float] | None = None  # cached tokens per SOURCES from /metrics; None: the server exports none
    prefetched_tokens: float | None = None  # sglang:prefetched_tokens_total's growth: tokens read from L3 into host memory
    op_gbps: float | None = None  # mean of sglang:prefetch_bandwidth over the phase's reads (hf3fs, mooncake only)

    def ttft(self, stat: str) -> float:
        values = [r.ttft for r in self.requests]
        if stat == "mean":
            return statistics.fmean(values)
        if len(values) == 1:
            return values[0]
        return statistics.quantiles(values, n=100, method="inclusive")[{"p50": 49, "p90": 89}[stat]]

    @property
    def prompt_tokens(self) -> int:
        return sum(r.prompt_tokens for r in self.requests)

    @property
    def storage_share(self) -> float | None:
        """Share of the prompt tokens loaded from L3: from the metrics, else from the responses' cached tokens."""
        prompt = self.prompt_tokens
        if self.storage_tokens is not None and prompt:
            return min(self.storage_tokens / prompt, 1.0)
        return sum(r.cached_tokens for r in self.requests) / prompt if prompt else None

    def cached_from(self) -> tuple[dict[str, float], str] | None:
        """(cached tokens per source, where that was read): SGLang's metrics when it exports them, else the responses'
        cached_tokens_details (a response with no cached token has none: zero from every source); None when neither says."""
        if self.sources is not None:
            return dict(self.sources), "metrics"
        if self.requests and all(r.cached_by_source is not None or r.cached_tokens == 0 for r in self.requests):
            return {s: float(sum(int((r.cached_by_source or {}).get(s) or 0) for r in self.requests)) for s in SOURCES}, "responses"
        return None

    def source_shares(self) -> dict[str, Any] | None:
        """Share of the prompt tokens each source served, and the basis (metrics or responses)."""
        found, prompt = self.cached_from(), self.prompt_tokens
        if found is None or not prompt:
            return None
        tokens, basis = found
        return {**{s: round(min(tokens.get(s, 0.0) / prompt, 1.0), 4) for s in SOURCES}, "basis": basis}


def served_from(shares: dict[str, Any] | None) -> str:
    """Where a phase's prompt came from, as SGLang counted it: e.g. `device 98%`, `host 61%, device 37%`, `prefilled`."""
    if shares is None:
        return "unknown"
    parts = sorted(((shares[s], s) for s in SOURCES if shares.get(s, 0) >= 0.01), reverse=True)
    return ", ".join(f"{s} {v:.0%}" for v, s in parts) if parts else "prefilled"


@dataclasses.dataclass
class Eviction:
    """The filler sent before the host phase, over every server of the target."""
    filler_tokens: int  # prompt tokens sent (0: none)
    gpu_tokens: int | None  # the GPU pools it had to exceed (max_total_num_tokens x DP), summed; None: unknown
    host_tokens: int | None  # the host pools, summed; None: unknown
    notes: list[str] = dataclasses.field(default_factory=list)  # why the prompts may not be in host memory after it


@dataclasses.dataclass
class Level:
    concurrency: int
    recompute: Phase
    l3: Phase
    host: Phase | None  # the prompts again after evict_gpu (module docstring)
    backed_up_tokens: float | None
    eviction: Eviction | None = None

    @property
    def repeat(self) -> Phase | None:  # the name before the host phase was forced
        return self.host

    @property
    def cold(self) -> Phase:  # the name before issue #35
        return self.recompute

    @property
    def warm(self) -> Phase:  # the name before issue #35
        return self.l3

    @property
    def speedup(self) -> float:
        return self.recompute.ttft("mean") / self.l3.ttft("mean")

    @property
    def l3_ratio(self) -> float:
        """Mean TTFT from L3 over mean TTFT recomputed: below 1, L3 pays."""
        return self.l3.ttft("mean") / self.recompute.ttft("mean")


def _get(url: str, timeout: float = 30) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except (urllib.error.URLError, OSError) as exc:  # -1, and why nothing answered
        reason = getattr(exc, "reason", None) or exc
        return -1, (getattr(reason, "strerror", None) or str(reason)).lower()


def wait_healthy(base_url: str, timeout: float, sleep=time.sleep) -> None:
    deadline = time.monotonic() + timeout
    while _get(base_url + "/health", timeout=60)[0] != 200:
        if time.monotonic() > deadline:
            raise BenchError(f"{base_url}/health did not answer 200 within {timeout:.0f} s")
        sleep(1)


def server_model(base_url: str) -> str:
    status, body = _get(base_url + "/v1/models")
    if status == -1:
        raise BenchError(f"nothing answers at {base_url} ({body}): is the server up (`hicachectl status`)?")
    if status != 200:
        raise BenchError(f"{base_url}/v1/models answered {status}: is the server up (`hicachectl status`)?")
    return json.loads(body)["data"][0]["id"]


def server_info(base_url: str) -> dict[str, Any]:
    """GET /server_info: SGLang's server arguments under their own names ({} when it does not answer)."""
    status, body = _get(base_url + "/server_info")
    try:
        return json.loads(body) if status == 200 else {}
    except ValueError:
        return {}


def read_metrics(base_url: str) -> str | None:
    status, body = _get(base_url + "/metrics")
    return body if status == 200 else None


def target_metrics(target: Target) -> str | None:
    """The target's /metrics text; behind a router every server's, one after the other (metrics.total sums the series),
    None when one of them does not answer (a partial sum would understate the L3 hits)."""
    if not target.metrics_urls:
        return read_metrics(target.base_url)
    texts = [read_metrics(url) for url in target.metrics_urls]
    return None if any(t is None for t in texts) else "".join(texts)


def stream_ttft(base_url: str, body: bytes, timeout: float) -> Request:
    """Send one prepared request; TTFT is when the first generated token arrives in the stream."""
    url = urllib.parse.urlsplit(base_url)
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=timeout)
    try:
        start = time.perf_counter()
        conn.request("POST", "/v1/chat/completions", body=body, headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        if response.status != 200:
            raise BenchError(f"the server answered {response.status}: {response.read(500).decode(errors='replace')}")
        ttft, usage, details = None, {}, None
        for raw in response:
            line = raw.strip()
            if not line.startswith(b"data:") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[5:])
            if ttft is None and any((c.get("delta") or {}).get("content") is not None for c in chunk.get("choices") or []):
                ttft = time.perf_counter() - start
            usage = chunk.get("usage") or usage
            # SGLang's extension chunk (serving_chat.py: sglext at response level, choices empty) when asked for
            details = (chunk.get("sglext") or {}).get("cached_tokens_details") or details
        if ttft is None:
            raise BenchError("the stream ended without a token")
        by_source = {s: int(details.get(s) or 0) for s in SOURCES} if isinstance(details, dict) else None
        return Request(ttft, int(usage.get("prompt_tokens", 0)), int((usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0) or 0),
                       by_source)
    finally:
        conn.close()


def send_all(base_url: str, bodies: list[bytes], timeout: float, done: Callable[[], None]) -> list[Request]:
    """All requests at once (total prompts = concurrency), each on its own connection."""
    with concurrent.futures.ThreadPoolExecutor(max_workers=len(bodies)) as pool:
        futures = [pool.submit(stream_ttft, base_url, body, timeout) for body in bodies]
        for future in concurrent.futures.as_completed(futures):
            future.result()
            done()
        return [f.result() for f in futures]


def _histogram_mean(after: str | None, before: str | None, name: str) -> float | None:
    """The mean of a histogram's observations between two /metrics texts (its _sum and _count grew), None without any."""
    count = metrics.delta(after, before, lambda t: metrics.total(t, f"{name}_count"))
    total = metrics.delta(after, before, lambda t: metrics.total(t, f"{name}_sum"))
    return total / count if count and total is not None else None


def measure(target: Target, bodies: list[bytes], timeout: float, done: Callable[[], None]) -> Phase:
    """One phase: every prompt at once, with what /metrics says the server did meanwhile."""
    before = target_metrics(target)
    started = time.perf_counter()
    requests = send_all(target.base_url, bodies, timeout, done)
    seconds = time.perf_counter() - started
    after = target_metrics(target)
    sources = None
    if metrics.total(after, metrics.CACHED) is not None:  # a source's series appears at its first token (a Counter's labels)
        sources = {s: (metrics.total(after, metrics.CACHED, cache_source=s) or 0) - (metrics.total(before, metrics.CACHED, cache_source=s) or 0)
                   for s in SOURCES}
    return Phase(requests, metrics.delta(after, before, metrics.storage_hits), seconds, sources,
                 metrics.delta(after, before, lambda t: metrics.total(t, PREFETCHED)), _histogram_mean(after, before, PREFETCH_BANDWIDTH))


def wait_for_backup(read: Callable[[], str | None], before: float | None, expected: int, timeout: float, sleep=time.sleep) -> float | None:
    """Tokens written to L3 since `before`, once all `expected` are there or the count stops growing."""
    if before is None:
        return None
    deadline, last, still = time.monotonic() + timeout, -1.0, 0
    while True:
        written = (metrics.total(read(), metrics.BACKUPED) or 0) - before
        if written >= expected or time.monotonic() > deadline:
            return written
        still = still + 1 if written == last else 0
        if still >= 5 and written > 0:
            return written
        last = written
        sleep(1)


def flush_cache(target: Target) -> None:
    """POST /flush_cache: SGLang asks for the admin key there when the server has one (utils/auth.py, ADMIN_OPTIONAL)."""
    try:
        urllib.request.urlopen(urllib.request.Request(target.base_url + "/flush_cache", method="POST", headers=secrets.bearer(target.admin_key)),
                               timeout=60).close()
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 403):
            given = "refused the key in HICACHE_ADMIN_API_KEY" if target.admin_key else "asks for the server's admin API key"
            raise BenchError(f"{target.base_url}/flush_cache answered {exc.code}: the server {given}; set HICACHE_ADMIN_API_KEY "
                             "to the server's hicache_admin_api_key, or give --restart-command") from exc
        raise


def streamed_body(model: str, salt: str, words: int, extra: dict[str, Any]) -> bytes:
    """One streamed chat request of `words` words after `salt` (formats/prompts.py), with SGLang's extra fields."""
    return json.dumps({**prompts.chat_request(model, prompts.prompt(salt, words), stream=True), **extra}).encode()


def dp_replicas(info: dict[str, Any]) -> int:
    """The schedulers of a server, each with its own radix tree, GPU pool and host pool: DP replicas x attention-DP
    groups (SGLang 0.5.23 resolves `--dp-size N --enable-dp-attention` to attn_dp_size N, dp_size 1:
    arg_groups/fields/parallel.py 192-193; managers/runtime_context.py num_dp_ranks)."""
    return max(int(info.get("dp_size") or 1), 1) * max(int(info.get("attn_dp_size") or 1), 1)


def gpu_pool_tokens(info: dict[str, Any]) -> int | None:
    """One scheduler's GPU KV pool in tokens: /server_info's max_total_num_tokens, the first scheduler's
    (managers/scheduler.py get_init_info; managers/data_parallel_controller.py; utils/common.py build_server_info)."""
    tokens = info.get("max_total_num_tokens")
    return int(tokens) if isinstance(tokens, (int, float)) and tokens > 0 else None


def host_pool_tokens(info: dict[str, Any], metrics_text: str | None) -> int | None:
    """One scheduler's host pool in tokens: sglang:hicache_host_total_tokens (the pool SGLang allocated, after its
    auto-sizing, hicache_auto_size.py; each scheduler logs its own, all alike: the largest series), else
    hicache_ratio x the GPU pool (pool_host/base.py 221-229; SGLang's ratio is 2 when unset, hicache_hook.py); None
    when --hicache-size sets it (GB per rank: bytes per token unknown here)."""
    gauges = [value for name, _, value in metrics.parse(metrics_text or "") if name == HOST_TOTAL]
    if gauges and max(gauges) > 0:
        return int(max(gauges))
    gpu = gpu_pool_tokens(info)
    if gpu is None or info.get("hicache_size"):
        return None
    return int(gpu * float(info.get("hicache_ratio") or 2.0))


def filler_in_host(policy: str | None, filled: int, gpu: int, returning: int) -> int:
    """Tokens of a scheduler's filler its host pool holds by the time the `returning` tokens of prompts are back on
    the GPU (mem_cache/unified_radix_cache.py): write_through copies every page at its first insert (its threshold 1,
    558-560); write_back only the pages it evicts from the GPU (_evict_components, 1024-1052): those the filler pushed
    out, then those the returning prompts push out; write_through_selective only at a second hit, which a filler sent
    once never has."""
    if policy == "write_through_selective":
        return 0
    if policy == "write_back":
        return min(filled, max(filled - gpu, 0) + returning)
    return filled  # write_through, SGLang's default


def evict_gpu(target: Target, model: str, salt: str, concurrency: int, prompt_tokens: int, timeout: float) -> Eviction:
    """Push the level's prompts off every server's GPU (module docstring). Per server and per scheduler (DP): unique
    prompts as long as the level's (`prompt_tokens` each), the level's concurrency at a time, the last round only as
    many as needed, until their tokens exceed the GPU pool plus the prompts the scheduler holds; sent to the server
    itself (behind a router, to each server: the router would not spread them evenly, and may have sent every prompt
    to one server), each pinned to its scheduler (routed_dp_rank) where the server has several. Notes say why the
    prompts may not be in host memory afterwards."""
    servers = target.metrics_urls or [target.base_url]
    sent, gpu_total, host_total, notes = 0, 0, 0, []
    for n, url in enumerate(servers):
        info = server_info(url)
        gpu = gpu_pool_tokens(info)
        if gpu is None:
            notes.append(f"{url}/server_info has no max_total_num_tokens: no filler sent, so the phase repeats what the server holds")
            gpu_total = host_total = None
            continue
        if info.get("hicache_host_memory_mode") == "buffer_only":
            notes.append(f"{url}: hicache_host_memory_mode buffer_only: host memory only stages pages to and from L3 and serves none "
                         "(managers/schedule_batch.py), so no filler was sent")
            gpu_total = host_total = None
            continue
        if info.get("radix_eviction_policy") not in (None, "lru"):
            notes.append(f"{url}: radix_eviction_policy {info['radix_eviction_policy']} is not least-recently-used: the filler may "
                         "evict other pages than the prompts (mem_cache/evict_policy.py)")
        replicas, host = dp_replicas(info), host_pool_tokens(info, read_metrics(url))
        held = concurrency if target.metrics_urls else -(-concurrency // replicas)  # the prompts one scheduler may hold
        need = gpu + held * prompt_tokens
        name = server_model(url) if target.metrics_urls else model  # behind a router, each server's own name
        gpu_total = None if gpu_total is None else gpu_total + gpu * replicas
        host_total = None if host is None or host_total is None else host_total + host * replicas
        for rank in range(replicas):
            filled, i = 0, 0
            while filled < need:
                count = min(concurrency, -(-(need - filled) // prompt_tokens))
                pin = {"routed_dp_rank": rank} if replicas > 1 else {}
                bodies = [streamed_body(name, f"{salt}-c{concurrency}-filler-{n}-{rank}-{i + j}", prompt_tokens, pin) for j in range(count)]
                # a server that counts no prompt token still gets filled: each prompt counted at the level's length
                filled += sum(r.prompt_tokens or prompt_tokens for r in send_all(url, bodies, timeout, lambda: None))
                i += count
            sent += filled
            kept = filler_in_host(info.get("hicache_write_policy"), filled, gpu, held * prompt_tokens)
            if host is not None and rank == 0 and host < kept + held * prompt_tokens:
                verb = "may not hold" if target.metrics_urls else "cannot hold"  # behind a router: if it sent this server every prompt
                notes.append(f"{url}: its host pool ({host:,} tokens{' per DP rank' if replicas > 1 else ''}) {verb} the filler it keeps "
                             f"({kept:,}) and the prompts ({held * prompt_tokens:,}): they are evicted from host memory too "
                             "(raise --hicache-ratio, or bench fewer prompts at once)")
    return Eviction(sent, gpu_total, host_total, notes)


def second_hit(target: Target, bodies: list[bytes], timeout: float) -> None:
    """Under write_through_selective SGLang copies a page to host memory, and from there to L3, only at its second hit
    (unified_radix_cache.py 558-560, _finish_write_through_ack 1803-1818): the prompts are sent once more, not
    measured, so that the L3 and host phases have pages to find."""
    send_all(target.base_url, bodies, timeout, lambda: None)


def run_level(target: Target, concurrency: int, input_len: int, salt: str, *, timeout: float, done: Callable[[], None],
              host_phase: bool = True) -> Level:
    """The level's three phases (module docstring); host_phase=False: no filler, the third phase repeats the prompts."""
    model = target.model or server_model(target.base_url)
    info = server_info(target.metrics_urls[0] if target.metrics_urls else target.base_url)
    # The responses' cache sources: asked of a server directly; a router (smg) may not pass SGLang's extension fields
    # on, so behind one the sources come from the servers' /metrics alone. A server with several schedulers (DP) gets
    # each prompt pinned to one (routed_dp_rank, entrypoints/openai/protocol.py), the same in every phase: its round
    # robin would send a prompt to another scheduler each time; behind a router the router picks.
    ask = {} if target.metrics_urls else {"return_cached_tokens_details": True}
    replicas = 1 if target.metrics_urls else dp_replicas(info)
    bodies = [streamed_body(model, f"{salt}-c{concurrency}-{i}", input_len, {**ask, **({"routed_dp_rank": i % replicas} if replicas > 1 else {})})
              for i in range(concurrency)]
    page = int(info.get("page_size") or 1)
    start_metrics = target_metrics(target)
    recompute = measure(target, bodies, timeout, done)
    if info.get("hicache_write_policy") == "write_through_selective":
        second_hit(target, bodies, timeout)
    elif info.get("hicache_write_policy") == "write_back":
        # write_back copies a page to host, and from there to L3, only when the GPU evicts it (unified_radix_cache.py
        # _evict_components, _finish_write_through_ack): filler of its own pushes the prompts off the GPU first
        evict_gpu(target, model, f"{salt}-write-back", concurrency, max(1, round(recompute.prompt_tokens / concurrency)), timeout)
    expected = sum(r.prompt_tokens // page * page for r in recompute.requests)
    backed_up = wait_for_backup(lambda: target_metrics(target), metrics.total(start_metrics, metrics.BACKUPED), expected, timeout)
    if target.reset is None:
        flush_cache(target)
    else:
        target.reset()
    wait_healthy(target.base_url, timeout)
    l3 = measure(target, bodies, timeout, done)
    eviction = None
    if host_phase:
        eviction = evict_gpu(target, model, salt, concurrency, max(1, round(l3.prompt_tokens / concurrency)), timeout)
    host = measure(target, bodies, timeout, done)
    return Level(concurrency, recompute, l3, host, backed_up, eviction)


def l3_bytes_per_token(config: str | None, info: dict[str, Any]) -> tuple[float | None, str]:
    """(bytes read from L3 per token the prefetch moves, how that was found) for the server of /server_info `info`.

    An L3 page of a rank holds its layers' K and V for the page's tokens (sizing.size: page_bytes_per_rank, a window
    model's window included). Every TP rank runs its own prefetch (managers/cache_controller.py, one per scheduler
    process) and reads its own page (MHA keys carry the TP rank, hicache_storage.py:757-759): bytes per token =
    page bytes x TP x PP / page size. MLA pages hold no rank (one copy for all): counted once per stage, a lower bound
    where every TP rank reads the copy (only the file backend allows MLA host dedup: mla_host_dedup.py
    storage_supports_host_dedup)."""
    if not config:
        return None, "no model config.json (--model-config, or hicache_model_config in the inventory): bytes unknown"
    tp, pp, page = int(info.get("tp_size") or 1), int(info.get("pp_size") or 1), int(info.get("page_size") or 1)
    try:
        shape = sizing.model_shape(sizing.load_config(config))
        s = sizing.size(shape, sizing.Workload(tp_size=tp, pp_size=pp, page_size=page, kv_cache_dtype=info.get("kv_cache_dtype") or "auto"))
    except sizing.SizingError as exc:
        return None, f"bytes unknown: {exc}"
    readers = (1 if shape.attention == "MLA" else tp) * pp
    return s.page_bytes_per_rank * readers / page, f"config.json: {s.page_bytes_per_rank:,} B per page per rank x {readers} rank(s) / page {page}"


def _significant(value: float, digits: int = 4) -> float:
    """Rounded to `digits` significant figures: GB/s span 0.001 (a test's stand-in) to 100 (a fast tier)."""
    return float(f"{value:.{digits}g}")


def summary(levels: list[Level], bytes_per_token: float | None = None) -> list[dict[str, Any]]:
    """One row per level. The keys cold_* and warm_* (and warm_storage_share) are the recompute and l3 phases under
    their names before issue #35, and repeat_* the host phase's before it was forced, kept for the readers of bench.json
    that use them."""
    rows = []
    for level in levels:
        l3 = level.l3
        share = l3.storage_share
        read_tokens = l3.prefetched_tokens if l3.prefetched_tokens is not None else l3.storage_tokens
        if read_tokens is None:  # no metrics: the responses' storage tokens, else their cached tokens
            found = l3.cached_from()
            read_tokens = found[0]["storage"] if found else float(sum(r.cached_tokens for r in l3.requests))
        read_bytes = None if bytes_per_token is None else read_tokens * bytes_per_token
        phases = {"recompute": level.recompute, "l3": l3, "host": level.host}
        eviction = level.eviction
        row = {
            "concurrency": level.concurrency,
            **{f"{name}_{stat}_s": round(phase.ttft(stat), 3) for name, phase in phases.items() if phase for stat in ("mean", "p50", "p90")},
            "l3_recompute_ratio": round(level.l3_ratio, 3),
            "l3_loses": level.l3_ratio >= 1,
            "speedup": round(level.speedup, 2),
            "prompt_tokens": round(statistics.fmean(r.prompt_tokens for r in level.recompute.requests)),
            "l3_storage_share": None if share is None else round(share, 4),
            "l3_sources": l3.source_shares(),
            "l3_seconds": None if l3.seconds is None else round(l3.seconds, 6),  # the GB/s beside it is of these seconds
            "l3_read_tokens": read_tokens,
            "l3_read_bytes": None if read_bytes is None else round(read_bytes),
            "l3_read_gbps": None if read_bytes is None or not l3.seconds else _significant(read_bytes / l3.seconds / 1e9),
            "l3_op_gbps": None if l3.op_gbps is None else _significant(l3.op_gbps),
            "host_sources": level.host.source_shares() if level.host else None,
            "host_served_from": served_from(level.host.source_shares()) if level.host else None,
            "host_filler_tokens": eviction.filler_tokens if eviction else 0,
            "host_gpu_pool_tokens": eviction.gpu_tokens if eviction else None,
            "host_pool_tokens": eviction.host_tokens if eviction else None,
            "host_notes": list(eviction.notes) if eviction else ["no filler sent (--no-host-phase): the phase repeats what the server holds"],
            "backed_up_tokens": level.backed_up_tokens,
        }
        # the names before issue #35 (docs/bench-sample.json, tests/fleet): cold = recompute, warm = l3
        row.update({f"cold_{stat}_s": row[f"recompute_{stat}_s"] for stat in ("mean", "p50", "p90")})
        row.update({f"warm_{stat}_s": row[f"l3_{stat}_s"] for stat in ("mean", "p50", "p90")})
        row["warm_storage_share"] = row["l3_storage_share"]
        # the host phase's names before it was forced: a repeat without reset
        row.update({f"repeat_{stat}_s": row[f"host_{stat}_s"] for stat in ("mean", "p50", "p90") if f"host_{stat}_s" in row})
        row["repeat_sources"], row["repeat_served_from"] = row["host_sources"], row["host_served_from"]
        rows.append(row)
    return rows


# What decides whether reading a prompt's KV from L3 beats prefilling it, as SGLang 0.5.23 names it
# (python/sglang/srt/arg_groups/fields/memory.py and schedule.py for the flags; the extra config's keys are popped by
# mem_cache/hybrid_cache/hybrid_cache_controller.py parse_storage_backend_extra_config, 378-436). `setting` is the
# /server_info key whose value the finding shows.
LEVERS = (
    {"lever": "--hicache-storage-prefetch-policy", "setting": "hicache_storage_prefetch_policy",
     "what": "when the prefetch from L3 stops: best_effort (at once, with what has arrived), wait_complete (every page), "
             "timeout (default: after prefetch_timeout_base + prefetch_timeout_per_ki_token x tokens/1024 s, 1 s and 0.25 s "
             "by default, in the extra config); a prefill waiting on a slow tier is what makes L3 lose",
     "source": "arg_groups/fields/memory.py hicache_storage_prefetch_policy; mem_cache/unified_radix_cache.py _can_terminate_prefetch"},
    {"lever": "prefetch_threshold (--hicache-storage-backend-extra-config)", "setting": "hicache_storage_backend_extra_config",
     "what": "the fewest tokens a hit must have to be read from L3 (default 256, at least one page): raise it so short "
             "prefixes are recomputed rather than fetched",
     "source": "mem_cache/hybrid_cache/hybrid_cache_controller.py parse_storage_backend_extra_config (prefetch_threshold, 256)"},
    {"lever": "--hicache-storage-backend", "setting": "hicache_storage_backend",
     "what": "how pages are read: file reads each page's .bin file in turn, one at a time per rank, through the page cache "
             "(HiCacheFile.batch_get: open, readinto) into a staging page copied into the host pool; nixl hands a batch of "
             "pages to its plugin in one transfer straight into the host pool (POSIX opens them with O_DIRECT by default: "
             "use_direct_io in the extra config, or SGLANG_HICACHE_NIXL_USE_DIRECT_IO)",
     "source": "mem_cache/hicache_storage.py HiCacheFile.get/batch_get; managers/cache_controller.py _generic_page_get, "
               "_page_get_zero_copy (646-667); mem_cache/storage/nixl/nixl_utils.py get_use_direct_io"},
    {"lever": "--page-size", "setting": "page_size",
     "what": "tokens per page: a page is one L3 object (one file for file and nixl), so larger pages mean fewer, larger reads",
     "source": "arg_groups/fields/schedule.py page_size"},
    {"lever": "--hicache-io-backend", "setting": "hicache_io_backend",
     "what": "the copy of the loaded pages from host memory to the GPU: kernel (default) or direct; it follows the tier's "
             "read, so it counts when the tier is fast",
     "source": "arg_groups/fields/memory.py hicache_io_backend"},
)


def levers(info: dict[str, Any] | None) -> list[dict[str, Any]]:
    """LEVERS, each with the server's current value (`now`) from its /server_info `info` (bench's and verify's findings)."""
    return [{**lever, "now": _lever_now(lever, info or {})} for lever in LEVERS]


def _lever_now(lever: dict[str, Any], info: dict[str, Any]) -> Any:
    """The server's value of a lever from /server_info; the prefetch threshold from its extra config (SGLang's default
    256 when the config is JSON without it; None when the config is a file bench cannot read)."""
    value = info.get(lever["setting"])
    if lever["setting"] != "hicache_storage_backend_extra_config":
        return value
    if not info:
        return None
    if value is None:
        return 256
    try:
        return (json.loads(value) if isinstance(value, str) else dict(value)).get("prefetch_threshold", 256)
    except (ValueError, TypeError, AttributeError):
        return None  # "@/path/to/config.toml": on the server's host


L3_LOSES = "l3-slower-than-recompute"  # the finding's name, in bench's and verify's JSON


def findings(rows: list[dict[str, Any]], info: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """What the operator must know from the numbers: the levels where L3 is not faster than recompute, with LEVERS and
    the server's current value of each (from /server_info `info`)."""
    losing = [r for r in rows if r["l3_loses"]]
    if not losing:
        return []
    info = info or {}
    levels = [r["concurrency"] for r in losing]
    worst = max(losing, key=lambda r: r["l3_recompute_ratio"])
    message = (f"L3 does not beat recompute at concurrency {', '.join(map(str, levels))}: TTFT from L3 is "
               f"{worst['l3_recompute_ratio']:.2f}x recompute's at {worst['concurrency']} (mean {worst['l3_mean_s']:.2f} s "
               f"against {worst['recompute_mean_s']:.2f} s)")
    share = worst.get("l3_storage_share")
    if share is not None and share < 0.5:
        message += (f"; only {share:.0%} of its prompt came from L3, so the pages were not found or not loaded "
                    "(hicachectl verify --l3 says why)")
    elif worst.get("l3_read_gbps") is not None:
        message += f"; L3 delivered {worst['l3_read_gbps']:.3g} GB/s over the phase"
    return [{"finding": L3_LOSES, "levels": levels, "message": message, "levers": levers(info)}]


def finding_lines(found: list[dict[str, Any]], levers_once: bool = False) -> list[str]:
    """Each finding's message and its levers; `levers_once`: the levers after the last finding only (verify's hosts)."""
    lines = []
    for i, f in enumerate(found):
        lines.append(f"finding: {f['message']}.")
        if levers_once and i < len(found) - 1:
            continue
        lines.append("  levers (SGLang 0.5.23" + (f", values of {f['host']}" if levers_once and len(found) > 1 else "") + "):")
        for lever in f["levers"]:
            now = "" if lever["now"] is None else f" [now: {lever['now']}]"
            lines.append(f"  - {lever['lever']}{now}: {lever['what']}")
    return lines


def table_rows(rows: list[dict[str, Any]]) -> list[list[str]]:
    def share(v):
        return "-" if v is None else f"{v:.1%}"

    def ttft(r, phase):
        if f"{phase}_mean_s" not in r:
            return "-"
        return f"{r[f'{phase}_mean_s']:.2f} / {r[f'{phase}_p50_s']:.2f} / {r[f'{phase}_p90_s']:.2f}"
    return [[str(r["concurrency"]), str(r["prompt_tokens"]), ttft(r, "recompute"), ttft(r, "l3"),
             f"{r['l3_recompute_ratio']:.2f}" + (" LOSES" if r["l3_loses"] else ""), share(r["l3_storage_share"]),
             "-" if r["l3_read_gbps"] is None else f"{r['l3_read_gbps']:.3g}",
             ttft(r, "host"), (r["host_served_from"] or "-") + ("" if r["host_filler_tokens"] else " (repeat: no filler)")] for r in rows]


TABLE_HEADERS = ["concurrency", "prompt tokens", "recompute TTFT s mean/p50/p90", "from L3 TTFT s mean/p50/p90", "L3/recompute",
                 "tokens from L3", "L3 read GB/s", "host memory TTFT s mean/p50/p90", "host phase served from"]
HOST_NOTE = ("host memory: the same prompts after filler traffic larger than the GPU pool pushed them off the GPU (SGLang has "
             "no reset that empties the GPU cache and keeps host memory); 'served from' is where SGLang says the cached "
             "tokens came from (cache_source), not an assumption.")


def host_lines(rows: list[dict[str, Any]]) -> list[str]:
    """Per level, the filler sent and what may keep its host phase from host memory; a finding-like line where SGLang
    served less than half of the prompt from host memory."""
    lines = []
    for r in rows:
        pools = ""
        if r.get("host_gpu_pool_tokens") is not None:
            host = "unknown" if r.get("host_pool_tokens") is None else f"{r['host_pool_tokens']:,}"
            pools = f" (GPU pool {r['host_gpu_pool_tokens']:,} tokens, host pool {host})"
        lines.append(f"host phase, concurrency {r['concurrency']}: {r['host_filler_tokens']:,} filler tokens sent{pools}; "
                     f"served from {r.get('host_served_from') or 'unknown'}")
        lines += [f"  {note}" for note in r.get("host_notes") or []]
        share = (r.get("host_sources") or {}).get("host")
        if share is not None and share < 0.5:
            lines.append(f"  SGLang served {share:.0%} of the prompt from host memory: this phase is not a host-memory measurement")
    return lines


# `bench --tier`: the reads SGLang 0.5.23's backends make, for plugins/modules/hicache_tier_bench.py to repeat.
STORAGE_BATCH_SIZE = 128  # mem_cache/hicache_storage.py: the most pages one storage call moves
NIXL_KERNEL_QUEUE_SIZE = 256  # NIXL's POSIX plugin: DEF_KERNEL_QUEUE_SIZE (io_queue), clamped to 16-1024 (rules/nixl.py)
_TRUE = ("1", "true", "yes", "y", "on", "enable")


def tier_reads(d: Deployment, config: str | None) -> tuple[dict[str, Any] | None, str]:
    """({read_bytes, queue_depth, direct}, how they were found) for a server's tier, or (None, why it cannot be read).

    - file (HiCacheFile.get/batch_get, hicache_storage.py:846-880): one `.bin` per page and rank, read whole with plain
      reads, one key after the other per rank; the TP ranks read at once: reads of a page's bytes, queue depth TP.
    - nixl (hicache_nixl.py batch_get_v1 -> _batch_xfer; _get_key_list_from_meta): a file for K and one for V per page
      and rank (one for MLA), a batch of up to STORAGE_BATCH_SIZE pages per transfer, each rank its own NIXL agent
      keeping up to kernel_queue_size reads in flight: reads of half a page, queue depth TP x min(kernel_queue_size,
      files per batch); O_DIRECT unless use_direct_io (extra config) or SGLANG_HICACHE_NIXL_USE_DIRECT_IO says no
      (nixl_utils.py get_use_direct_io; environ.py: on by default)."""
    backend = d.storage_backend
    if not listable(d):
        return None, f"hicache_storage_backend {backend}: its pages are not files under hicache_cache_dir"
    if not config:
        return None, "a read is one page's bytes: give the model's config.json (--model-config, or hicache_model_config)"
    try:
        shape = sizing.model_shape(sizing.load_config(config))
        page = sizing.size(shape, sizing.workload_for(d)).page_bytes_per_rank
    except sizing.SizingError as exc:
        return None, str(exc)
    tp = d.tp_size or 1
    if backend == "file":
        return {"read_bytes": page, "queue_depth": tp, "direct": False}, f"file backend: whole pages of {page:,} B, plain reads, {tp} rank(s) at once"
    parts = 1 if shape.attention == "MLA" else 2
    extra = d.extra_config or {}
    posix = extra.get("plugin", {}).get("posix", {}) if isinstance(extra.get("plugin"), dict) else extra
    queue = min(max(int(posix.get("kernel_queue_size") or NIXL_KERNEL_QUEUE_SIZE), 16), 1024)
    if "use_direct_io" in extra:
        direct = str(extra["use_direct_io"]).lower() in _TRUE
    else:
        direct = str((d.container_env or {}).get("SGLANG_HICACHE_NIXL_USE_DIRECT_IO", "1")).lower() in _TRUE
    depth = tp * min(queue, parts * STORAGE_BATCH_SIZE)
    return ({"read_bytes": page // parts, "queue_depth": depth, "direct": direct},
            f"nixl backend: {'K or V of ' if parts == 2 else ''}a page, {page // parts:,} B per read, {'O_DIRECT' if direct else 'buffered'}, "
            f"{depth} in flight ({tp} rank(s) x min(kernel_queue_size {queue}, {parts * STORAGE_BATCH_SIZE} files per batch))")


def tier_plan(deployments: dict[str, Deployment], model_config: str | None, total: int, *,
              once_per_tier: bool = False) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """(what bench_tier.yml reads on each host: tier_reads and total_bytes, each host's entry of the report so far).
    A server whose tier cannot be read gets {"why": ...}. `once_per_tier` (--tier-only): each tier (one
    hicache_l3_share, or a server alone) read by its first server by name, the others {"skipped": why}, as is a server
    whose pages are not files on a tier: two readers of one tier would each report their share of its bandwidth."""
    plan, out, readers = {}, {}, {}
    for name, d in sorted(deployments.items()) if once_per_tier else deployments.items():
        reads, how = tier_reads(d, model_config or d.model_config)
        tier = l3_collector.tier_name(name, d)
        if once_per_tier and not listable(d):
            out[name] = {"skipped": how}
        elif once_per_tier and tier in readers:
            out[name] = {"skipped": f"its tier {tier} is read through {readers[tier]}"}
        elif reads is None:
            out[name] = {"why": how}
        else:
            readers[tier] = name
            plan[name] = {**reads, "total_bytes": total}
            out[name] = {"reads": how}
    return plan, out


def tier_share(rows: list[dict[str, Any]], tier: dict[str, dict[str, Any]]) -> dict[str, Any] | None:
    """What share of the tier's raw read bandwidth (the hosts measured, summed: read at once) SGLang's backend reached
    in the L3 phase (its best level)."""
    raw = [r["gbps"] for r in tier.values() if isinstance(r.get("gbps"), (int, float))]
    measured = [r for r in rows if r.get("l3_read_gbps") is not None]
    if not raw or not measured or sum(raw) <= 0:
        return None
    best = max(measured, key=lambda r: r["l3_read_gbps"])
    return {"tier_gbps": _significant(sum(raw)), "l3_read_gbps": best["l3_read_gbps"], "concurrency": best["concurrency"],
            "share": round(best["l3_read_gbps"] / sum(raw), 4)}


def tier_lines(tier: dict[str, dict[str, Any]], share: dict[str, Any] | None) -> list[str]:
    lines = []
    for host, r in tier.items():
        if "skipped" in r:
            lines.append(f"L3 tier of {host}: skipped: {r['skipped']}")
            continue
        if r.get("gbps") is None:
            lines.append(f"L3 tier of {host}: not measured: {r.get('why') or 'no result'}")
            continue
        notes = f"; {'; '.join(r['notes'])}" if r.get("notes") else ""
        lines.append(f"L3 tier of {host}: {r['gbps']:.3g} GB/s raw ({r['method']}, reads of {r['read_bytes']:,} B, {r['files']} files){notes}")
    if share:
        lines.append(f"SGLang's backend reached {share['l3_read_gbps']:.3g} GB/s from L3 (concurrency {share['concurrency']}): "
                     f"{share['share']:.1%} of the tier's {share['tier_gbps']:.3g} GB/s")
    return lines


# matplotlib (and numpy, which it needs) are the optional extra `bench` (pyproject.toml): only the chart needs them.
CHART_EXTRA = "pip install 'hicache-deploy[bench]'"


class ChartUnavailable(RuntimeError):
    """matplotlib cannot be imported: bench measures and reports all the same, without the PNG."""


def chart(rows: list[dict[str, Any]], path, title: str) -> None:
    """TTFT against concurrency, per phase (mean, with the p50-p90 range shaded), each L3 point labelled with its
    L3/recompute ratio. ChartUnavailable without matplotlib (the extra hicache-deploy[bench])."""
    try:
        import matplotlib
    except ImportError as exc:  # not installed (ModuleNotFoundError), or installed but broken (its numpy, its C parts)
        missing = isinstance(exc, ModuleNotFoundError) and (exc.name or "").split(".")[0] in ("matplotlib", "numpy")
        raise ChartUnavailable(f"the chart needs matplotlib, which {'is not installed' if missing else f'cannot be imported ({exc})'}: "
                               f"{CHART_EXTRA}") from exc

    matplotlib.use("Agg")
    from matplotlib import pyplot

    figure, axes = pyplot.subplots(figsize=(7, 4.2), dpi=120)
    x = [r["concurrency"] for r in rows]
    third = "host memory" if any(r["host_filler_tokens"] for r in rows) else "repeat, no filler"
    for phase, label, colour in (("recompute", "recompute", "#c0392b"), ("l3", "from L3", "#2471a3"), ("host", third, "#7d8c8d")):
        if not all(f"{phase}_mean_s" in r for r in rows):
            continue
        axes.plot(x, [r[f"{phase}_mean_s"] for r in rows], marker="o", color=colour, label=f"{label} (mean)")
        axes.fill_between(x, [r[f"{phase}_p50_s"] for r in rows], [r[f"{phase}_p90_s"] for r in rows], color=colour, alpha=0.15,
                          label=f"{label} p50-p90")
    for r in rows:
        axes.annotate(f"{r['l3_recompute_ratio']:.2f}", (r["concurrency"], r["l3_mean_s"]), textcoords="offset points", xytext=(0, -14),
                      ha="center", fontsize=8, color="#c0392b" if r["l3_loses"] else "black")
    axes.set_xscale("log", base=2)
    axes.set_xticks(x, [str(c) for c in x])
    axes.set_xlabel("concurrency (total prompts = concurrency)")
    axes.set_ylabel("time to first token (s)")
    axes.set_ylim(bottom=0)
    axes.set_title(title, fontsize=10)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    pyplot.close(figure)
