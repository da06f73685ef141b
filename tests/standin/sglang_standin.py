#!/usr/bin/env python3
"""A stand-in for an SGLang HiCache server, for tests on machines without a GPU. It is not SGLang.

It takes SGLang's command line (start.sh execs it in place of `python3 -m sglang.launch_server`),
answers SGLang's endpoints with SGLang's field and metric names (reference §7-§8), and models what
the tests need to observe:
- model loading: /health answers 503 for STANDIN_LOAD_SECONDS, then 200;
- prefill: time = uncached prompt tokens x STANDIN_PREFILL_US_PER_TOKEN (the recompute), plus cached tokens x
  STANDIN_LOAD_US_PER_TOKEN (both microseconds; the copy to the GPU), plus the time SGLang's backend took to read the
  pages from L3 (measured), one prompt at a time (concurrent ones queue);
- a slow tier, for tests of whether L3 pays (issue #35): STANDIN_L3_READ_DELAY seconds are added to the L3 read of
  every page a request loads (default 0), inside the timed backend work, so a test can make a prompt from L3 slower
  than the same prompt recomputed;
- an L3 prefix cache written and read by SGLang's own HiCacheFile / HiCacheNixl (sglang_pages.py beside this file:
  the pinned SGLang wheel, CPU torch, NIXL's POSIX plugin), configured from the env and the extra config as SGLang
  is: SGLang's file names and directories, keys that hold the served name, page size and TP rank and size (not the
  KV dtype, sglang#33268), pages that survive restarts and that servers on one directory share. Until the backends
  are open /health answers 503 (a server loading); a backend that cannot be opened ends the server, as in SGLang.
  A warm request's time includes the time the backends took to read its pages from the tier (measured). SGLang's
  prefetch threshold holds (max(prefetch_threshold, page size), 256 tokens by default): a prompt of fewer full-page
  tokens is not looked up in L3, and a hit of fewer is not loaded (counted unfulfilled, reason below_threshold);
  every prompt counts as new to the GPU and host tiers unless SGLang's --max-total-tokens is given: then the stand-in
  models the GPU pool of that many tokens and the host pool (--hicache-ratio, --hicache-size) with SGLang's LRU
  eviction and write policies (KvTiers), a hit counts from each by source, and /flush_cache empties both;
- /server_info: the server arguments the tests compare (served_model_name, page_size, kv_cache_dtype,
  tp_size, pp_size, revision, hicache_storage_backend, hicache_write_policy, and the L3 read settings bench names:
  hicache_storage_prefetch_policy, hicache_storage_backend_extra_config, hicache_io_backend, hicache_mem_layout),
  under SGLang's names;
- a chat request with return_cached_tokens_details gets SGLang's sglext.cached_tokens_details (device, host, storage,
  storage_backend; entrypoints/openai/serving_chat.py, output_streamer.py get_cached_tokens_details): every hit here
  is from storage unless KvTiers models the GPU and host pools;
- the runtime L3 backend API as SGLang 0.5.21-0.5.23 serves it (entrypoints/http_server.py, utils/auth.py): GET
  /hicache/storage-backend answers what is attached, DELETE detaches it (then no page is read or written; the metrics
  stay, as SGLang keeps its storage collector), both refused with SGLang's 400 without --admin-api-key and 401 without
  its bearer token. Stand-in only: STANDIN_NO_STORAGE_BACKEND_API=1 answers them 404, as SGLang before sglang#15892;
- storage metrics with SGLang's labels (mem_cache/unified_cache/storage_attachment.py): one series per TP and PP rank,
  each counting the same tokens, as every rank of a real server does.
With write_back a page reaches L3 only when the modelled GPU pool (KvTiers) evicts it, as SGLang copies it to host
then, so without --max-total-tokens never; with write_through_selective at its second request. Tokens are whitespace-separated words. Faults for tests:
STANDIN_NEVER_HEALTHY=1 (a bad image that hangs), STANDIN_EXIT_AT_START=1 (one that dies at start), STANDIN_URING_BROKEN=1 (the NIXL POSIX plugin cannot create its io_uring backend when asked for it).
HTTP and timing are the standard library's; the L3 pages need SGLang's environment (tests/infra/sglang_env.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections import OrderedDict
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

L3_CLEAR = "/hicache/storage-backend/clear"
L3_CLEAR_LOG = "L3 CLEAR REQUESTED"


def merge_config(argv):
    """SGLang's --config (utils/server_args_config_parser.py merge_config_with_args): the file's options, as flags,
    go before the command line, which wins. SGLang reads YAML; the stand-in reads the JSON subset (PyYAML need not be
    on a test host), which is what hicache-deploy writes."""
    if "--config" not in argv:
        return list(argv)
    at = argv.index("--config")
    with open(argv[at + 1]) as handle:
        config = json.load(handle)
    words = []
    for key, value in config.items():
        if value is True:
            words.append(f"--{key}")
        elif value not in (False, None):
            words += [f"--{key}", json.dumps(value) if isinstance(value, dict) else str(value)]
    return words + list(argv[:at]) + list(argv[at + 2:])


def parse_args(argv):
    argv = merge_config(argv)
    launch_command = " ".join(argv)  # SGLang 0.5.23 (sampling/watermarking/core.py redact_watermark_command_line): one string
    parser = argparse.ArgumentParser(prog="sglang-standin", allow_abbrev=False)
    parser.add_argument("--model-path", required=True)
    parser.add_argument("--served-model-name")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=30000)
    parser.add_argument("--page-size", type=int, default=1)
    parser.add_argument("--kv-cache-dtype", default="auto")  # SGLang's default: the model's dtype
    parser.add_argument("--tp-size", type=int, default=1)
    parser.add_argument("--pp-size", type=int, default=1)
    parser.add_argument("--revision")
    parser.add_argument("--hicache-storage-backend")
    parser.add_argument("--hicache-write-policy", default="write_through")
    parser.add_argument("--hicache-storage-backend-extra-config")
    parser.add_argument("--hicache-mem-layout", default="page_first")
    parser.add_argument("--hicache-storage-prefetch-policy", default="timeout")  # SGLang 0.5.23's default
    parser.add_argument("--hicache-io-backend", default="kernel")  # SGLang 0.5.23's default (arg_groups/fields/memory.py)
    parser.add_argument("--admin-api-key")
    # SGLang's GPU pool size and host pool (arg_groups/fields/schedule.py max_total_tokens; memory.py hicache_ratio,
    # hicache_size): with --max-total-tokens the stand-in models both pools (KvTiers)
    parser.add_argument("--max-total-tokens", type=int)
    parser.add_argument("--hicache-ratio", type=float, default=2.0)  # SGLang's value when unset (hicache_hook.py 119-122)
    parser.add_argument("--hicache-size", type=int, default=0)  # GB per rank; overrides the ratio
    parser.add_argument("--enable-metrics", action="store_true")
    parser.add_argument("--enable-cache-report", action="store_true")
    args, _ = parser.parse_known_args(argv)  # every other SGLang flag is accepted and ignored
    args.served_model_name = args.served_model_name or args.model_path
    args.launch_command = launch_command
    return args


def storage_dir(args):
    if args.hicache_storage_backend == "file":
        return os.environ.get("SGLANG_HICACHE_FILE_BACKEND_STORAGE_DIR", "/tmp/hicache")
    if args.hicache_storage_backend == "nixl":
        return os.environ.get("SGLANG_HICACHE_NIXL_BACKEND_STORAGE_DIR", "/tmp/hicache_storage").split(",")[0]
    return None


def extra_config(args):
    raw = args.hicache_storage_backend_extra_config
    if not raw:
        return {}
    if raw.startswith("@"):
        with open(raw[1:]) as handle:
            return json.load(handle) if raw.endswith(".json") else {}
    return json.loads(raw)


class KvTiers:
    """SGLang's GPU KV pool and HiCache host pool, as far as bench's host-memory phase needs them (issue #35). Modelled
    only when the command line gives SGLang's --max-total-tokens (the GPU pool; /server_info's max_total_num_tokens);
    without it every prompt is new to both, as before. Read in SGLang 0.5.23 (python/sglang/srt/):
    - a prompt's cached prefix is its leading pages on the GPU, then the next ones found in the host pool, loaded back
      (mem_cache/unified_radix_cache.py load_back); those count as "host" (managers/schedule_batch.py
      split_cached_prefix_by_tier), the rest of a hit read from L3 as "storage";
    - the pages a request uses go on the GPU as the most recent; when the pool is full the least recently used leaves
      go first (mem_cache/evict_policy.py lru; unified_cache/unified_tree_core.py evict_device_leaf): a page with a
      host copy stays in the tree, host only (_demote); one without is dropped (write_through) or copied first
      (write_back: unified_radix_cache.py _evict_components);
    - a page is copied to host once its hits, counted at insert, reach the write-through threshold: 1 under
      write_through, 2 under write_through_selective (unified_radix_cache.py 558-560), never at insert under
      write_back; pages read from L3 land in the host pool (the prefetch);
    - the host pool holds hicache_ratio x the GPU pool, or --hicache-size GB per rank (mem_cache/pool_host/base.py
      221-229); when it is full its least recently used host-only page goes (evict_host; unified_cache/components/full.py
      drive_host_eviction), and a page it cannot make room for is not copied;
    - /flush_cache empties both (unified_radix_cache.py _reset_full), as a restart does.
    A list of pages per pool, not a tree: a request's pages are touched last one first, so its tail leaves first, as a
    tree's leaves do."""

    def __init__(self, args, bytes_per_token: int):
        self.page = args.page_size
        self.policy = args.hicache_write_policy
        self.device_pages = args.max_total_tokens // self.page
        host_tokens = args.hicache_size * 10**9 // bytes_per_token if args.hicache_size else int(args.max_total_tokens * args.hicache_ratio)
        self.host_pages = host_tokens // self.page
        self.device, self.host, self.hits = OrderedDict(), OrderedDict(), {}

    @property
    def host_tokens(self) -> int:
        return self.host_pages * self.page

    def match(self, keys: list[str]) -> tuple[int, int]:
        """(pages on the GPU, pages after those in the host pool) at the head of `keys`."""
        on_device = 0
        while on_device < len(keys) and keys[on_device] in self.device:
            on_device += 1
        in_host = on_device
        while in_host < len(keys) and keys[in_host] in self.host:
            in_host += 1
        return on_device, in_host - on_device

    def use(self, keys: list[str], from_l3: list[str]) -> list[str]:
        """A request's pages: those read from L3 land in the host pool (the prefetch); the GPU makes room for the
        request, least recently used first (write_back copies what it evicts to host); then, as the request is inserted,
        each page's hit is counted and the page copied to host at the policy's threshold. Returns the pages write_back
        copied to host, which SGLang then writes to L3 (_finish_write_through_ack)."""
        written_back = []
        for key in from_l3:
            self._to_host(key)
        for key in reversed(keys):  # the head most recent: a tail leaves first, as a tree's leaves do
            self.device[key] = None
            self.device.move_to_end(key)
        while len(self.device) > self.device_pages:
            evicted, _ = self.device.popitem(last=False)
            if self.policy == "write_back" and evicted not in self.host:
                self._to_host(evicted)
                written_back += [evicted] if evicted in self.host else []
            if evicted not in self.host:
                self.hits.pop(evicted, None)  # dropped from the tree (write_through without a copy)
        threshold = {"write_through": 1, "write_through_selective": 2}.get(self.policy)
        for key in keys:
            if key in self.host:  # a host page's last access (the host pool evicts by it, as the tree does)
                self.host.move_to_end(key)
            self.hits[key] = self.hits.get(key, 0) + 1
            if threshold and self.hits[key] >= threshold:
                self._to_host(key)
        return written_back

    def _to_host(self, key: str) -> None:
        if key in self.host:
            self.host.move_to_end(key)
            return
        if len(self.host) >= self.host_pages:
            host_only = next((k for k in self.host if k not in self.device), None)
            if host_only is None:
                return  # no room: not copied
            del self.host[host_only]
            self.hits.pop(host_only, None)
        self.host[key] = None

    def flush(self) -> None:
        self.device.clear()
        self.host.clear()
        self.hits.clear()


class Server:
    def __init__(self, args):
        self.args = args
        self.l3 = storage_dir(args)
        self.pages = None  # sglang_pages.PageStore once SGLang's backends are open
        self.started = time.monotonic()
        self.load_seconds = float(os.environ.get("STANDIN_LOAD_SECONDS", "0"))
        self.never_healthy = os.environ.get("STANDIN_NEVER_HEALTHY") == "1"
        self.prefill_us = float(os.environ.get("STANDIN_PREFILL_US_PER_TOKEN", "20"))
        self.load_us = float(os.environ.get("STANDIN_LOAD_US_PER_TOKEN", "2"))
        self.l3_read_delay = float(os.environ.get("STANDIN_L3_READ_DELAY", "0"))  # seconds per page read from L3 (a slow tier)
        self.attached = args.hicache_storage_backend  # GET /hicache/storage-backend's; None once detached
        self.no_backend_api = os.environ.get("STANDIN_NO_STORAGE_BACKEND_API") == "1"
        self.lock = threading.Lock()
        self.gpu = threading.Lock()
        self.metrics = {"prompt_tokens_total": 0, "storage_hit": 0, "prefetch_hit": 0, "backuped": 0, "requests": 0, "device_hit": 0, "host_hit": 0}
        self.inserts = {}  # page key -> requests that inserted it (write_through_selective's hits)
        self.tiers = None  # KvTiers with --max-total-tokens: the GPU and host pools
        if args.max_total_tokens:
            import sglang_pages  # its model's bytes per token and SGLang's page keys; no torch at import
            model = sglang_pages.MODEL
            self.tiers = KvTiers(args, 2 * model["layer_num"] * model["head_num"] * model["head_dim"] * 2)
        self.l3_seconds = {"cold": [], "warm": []}  # per request: SGLang's backend's lookup, read and write-through
        # per request, as served: from its arrival to its first token (queue, L3 work, prefill and the sleeps' overshoot)
        self.served_ttft = {"cold": [], "warm": []}
        # Also SGLang's (python/sglang/srt/observability/metrics_collector.py, 0.5.20-0.5.23): the scheduler's
        # running/queued gauges and the tokenizer's TTFT histogram, with SGLang's default TTFT buckets.
        self.running = self.queued = 0
        self.ttft_counts = {}  # is_streaming -> [count per bucket], then the sum and count
        self.ttft_sum = {}
        if self.l3:
            threading.Thread(target=self.open_pages, daemon=True).start()

    def open_pages(self):
        try:
            import sglang_pages
            self.pages = sglang_pages.PageStore(self.args.hicache_storage_backend, self.args.served_model_name, self.args.page_size,
                                                self.args.tp_size, self.args.pp_size, self.args.hicache_mem_layout,
                                                self.args.hicache_storage_backend_extra_config)
        except Exception as exc:  # SGLang does not start without its storage backend
            print(f"sglang-standin: cannot open the {self.args.hicache_storage_backend} storage backend: {exc!r}", file=sys.stderr, flush=True)
            os._exit(1)

    @property
    def ready(self):
        return (not self.never_healthy and time.monotonic() - self.started >= self.load_seconds
                and (self.l3 is None or self.pages is not None))

    def prefill(self, prompt):
        """One prompt on the one GPU: concurrent prompts queue. Its L3 work is SGLang's backend's real work, timed and
        served in turn like the prefill: the lookup and the read of a hit's pages, the write-through of the rest."""
        tokens = prompt.split()
        with self.lock:
            self.queued += 1
        with self.gpu:
            with self.lock:
                self.queued -= 1
                self.running += 1
            started = time.perf_counter()
            keys, hit_pages, found, on_device, in_host = [], 0, 0, 0, 0
            pages = self.pages if self.attached else None  # detached at runtime: no L3 read or write
            if pages or self.tiers:
                import sglang_pages
                keys = sglang_pages.page_keys(sglang_pages.token_ids(tokens), self.args.page_size)
            if self.tiers:
                on_device, in_host = self.tiers.match(keys)
            local = on_device + in_host  # pages the GPU or the host pool has (none without KvTiers)
            if pages:
                # SGLang 0.5.23's threshold (managers/cache_controller.py: max(prefetch_threshold, page_size)) and its
                # two uses (mem_cache/unified_radix_cache.py): a prefix of fewer page-aligned new tokens is not looked
                # up in L3 at all, and a hit of fewer tokens is not loaded ("below_threshold"). New: the full pages
                # after those the GPU or the host pool has.
                threshold = max(pages.prefetch_threshold, self.args.page_size)
                if (len(keys) - local) * self.args.page_size >= threshold:
                    found = pages.hits(keys[local:])
                if found * self.args.page_size >= threshold:  # read from the tier by SGLang's backend
                    hit_pages, _ = pages.load(keys[local:local + found])
                    time.sleep(self.l3_read_delay * hit_pages)  # STANDIN_L3_READ_DELAY: a slower tier, per page read
            cached = hit_pages * self.args.page_size
            written = 0
            policy = self.args.hicache_write_policy
            if pages and policy == "write_through_selective":
                # SGLang copies a page to host at its second hit, and to L3 once that copy is done
                # (mem_cache/unified_radix_cache.py 558-560, _finish_write_through_ack)
                second = [k for k in keys[:local] + keys[local + hit_pages:] if self.inserts.get(k, 0) == 1]
                written = pages.store(second) * self.args.page_size
            elif pages and policy != "write_back":  # write-through of the pages not yet in L3
                written = pages.store(keys[local + hit_pages:]) * self.args.page_size
            for key in keys:  # the inserts each page had in this tree (a restart or /flush_cache starts it anew)
                self.inserts[key] = self.inserts.get(key, 0) + 1
            if self.tiers:
                written_back = self.tiers.use(keys, keys[local:local + hit_pages])
                if pages and policy == "write_back":  # the pages the GPU evicted, copied to host, then to L3
                    written += pages.store(written_back) * self.args.page_size
            l3_seconds = time.perf_counter() - started
            # the GPU's own pages cost nothing; the host pool's and L3's are copied to the GPU
            from_host, from_device = in_host * self.args.page_size, on_device * self.args.page_size
            loaded = cached + from_host
            time.sleep(((len(tokens) - loaded - from_device) * self.prefill_us + loaded * self.load_us) / 1e6)
            with self.lock:
                self.running -= 1
        with self.lock:
            self.metrics["prompt_tokens_total"] += len(tokens)
            self.metrics["storage_hit"] += cached
            self.metrics["device_hit"] += from_device
            self.metrics["host_hit"] += from_host
            self.metrics["prefetch_hit"] += found * self.args.page_size  # found in L3, loaded or not
            self.metrics["backuped"] += written
            self.metrics["requests"] += 1
            if pages:
                self.l3_seconds["warm" if cached else "cold"].append(l3_seconds)
        return len(tokens), {"device": from_device, "host": from_host, "storage": cached}

    def observe_ttft(self, seconds, streaming):
        """SGLang's sglang:time_to_first_token_seconds (labels model_name, engine_type, is_streaming)."""
        key = "true" if streaming else "false"
        with self.lock:
            counts = self.ttft_counts.setdefault(key, [0] * len(TTFT_BUCKETS))
            for i, bound in enumerate(TTFT_BUCKETS):
                if seconds <= bound:
                    counts[i] += 1
            self.ttft_sum[key] = self.ttft_sum.get(key, 0.0) + seconds

    def storage_labels(self):
        """SGLang's StorageMetricsCollector labels, in its order, for each TP and PP rank (every rank logs the same tokens)."""
        args, backend = self.args, self.args.hicache_storage_backend or "none"
        return [f'storage_backend="{backend}",tp_rank="{tp}",dp_rank="0",pp_rank="{pp}",pp_size="{args.pp_size}",'
                f'attn_cp_rank="0",attn_cp_size="1"' for pp in range(args.pp_size) for tp in range(args.tp_size)]

    def metrics_text(self):
        m = self.metrics
        lines = [
            f'sglang:prompt_tokens_total{{model_name="{self.args.served_model_name}"}} {m["prompt_tokens_total"]}\n',
            f'sglang:cached_tokens_total{{cache_source="storage"}} {m["storage_hit"]}\n',
            *([f'sglang:cached_tokens_total{{cache_source="device"}} {m["device_hit"]}\n',
               f'sglang:cached_tokens_total{{cache_source="host"}} {m["host_hit"]}\n'] if self.tiers else []),
            f'sglang:num_requests_total {m["requests"]}\n',
        ]
        for storage in self.storage_labels():
            lines += [f"sglang:storage_prefetch_hit_tokens_total{{{storage}}} {m['prefetch_hit']}\n",
                      f"sglang:backuped_tokens_total{{{storage}}} {m['backuped']}\n"]
        # the scheduler's gauges: attention-TP rank 0 of every pipeline stage (observability/metrics_collector.py is_stats_logging_rank)
        for pp in range(self.args.pp_size):
            sched = f'model_name="{self.args.served_model_name}",engine_type="unified",tp_rank="0",pp_rank="{pp}",moe_ep_rank="0"'
            lines += [f"sglang:num_running_reqs{{{sched}}} {self.running}\n", f"sglang:num_queue_reqs{{{sched}}} {self.queued}\n"]
            if self.tiers:  # the host pool's gauges (metrics_collector.py 770-780; metrics_reporter.py _log_hicache_stats)
                lines += [f"sglang:hicache_host_total_tokens{{{sched}}} {self.tiers.host_tokens}\n",
                          f"sglang:hicache_host_used_tokens{{{sched}}} {len(self.tiers.host) * self.tiers.page}\n"]
        for streaming, counts in sorted(self.ttft_counts.items()):
            labels = f'model_name="{self.args.served_model_name}",engine_type="unified",is_streaming="{streaming}"'
            lines += [f'sglang:time_to_first_token_seconds_bucket{{{labels},le="{float(b)}"}} {c}\n' for b, c in zip(TTFT_BUCKETS, counts, strict=True)]
            lines += [f'sglang:time_to_first_token_seconds_bucket{{{labels},le="+Inf"}} {counts[-1]}\n',
                      f"sglang:time_to_first_token_seconds_sum{{{labels}}} {self.ttft_sum[streaming]}\n",
                      f"sglang:time_to_first_token_seconds_count{{{labels}}} {counts[-1]}\n"]
        if self.l3:  # SGLang's StorageMetricsCollector exists only with a storage backend
            for storage in self.storage_labels():
                # tokens read back from L3 (here: every hit at or above the threshold is read in full, nothing times out)
                lines.append(f"sglang:prefetched_tokens_total{{{storage}}} {m['storage_hit']}\n")
                # SGLang creates every reason's series at 0 when the collector starts; a hit below the threshold is
                # unfulfilled for that reason (unified_radix_cache.py _finish_storage_prefetch): found, not loaded
                below = m["prefetch_hit"] - m["storage_hit"]
                lines += [f'sglang:storage_prefetch_unfulfilled_tokens_total{{{storage},reason="{reason}"}} '
                          f'{below if reason == "below_threshold" else 0}\n' for reason in UNFULFILLED_REASONS]
        return "".join(lines)

    def admin_refusal(self, authorization):
        """SGLang's answer to an admin endpoint it refuses, or None: 400 without --admin-api-key (http_server.py
        _admin_api_key_missing_response), 401 without `Bearer <admin key>` (utils/auth.py, ADMIN_OPTIONAL)."""
        if not self.args.admin_api_key:
            return 400, {"error": "This endpoint requires admin API key, but this server was started without one (admin-api-key). "
                                  "Restart with --admin-api-key to enable."}
        return self.optional_admin_refusal(authorization)

    def optional_admin_refusal(self, authorization):
        """SGLang's ADMIN_OPTIONAL rule alone (utils/auth.py, e.g. /flush_cache): open without keys, 401 without
        `Bearer <admin key>` when the server has one."""
        if self.args.admin_api_key and authorization != f"Bearer {self.args.admin_api_key}":
            return 401, {"error": "Unauthorized"}
        return None

    def storage_backend(self):
        """GET /hicache/storage-backend: the tokenizer's view of the L3 backend (null fields once detached)."""
        args = self.args
        return {"hicache_storage_backend": self.attached,
                "hicache_storage_backend_extra_config": args.hicache_storage_backend_extra_config if self.attached else None,
                "hicache_storage_prefetch_policy": args.hicache_storage_prefetch_policy, "hicache_write_policy": args.hicache_write_policy}


# SGLang's default TTFT buckets and the prefetch reasons it pre-creates (0.5.23; 0.5.21 lacks deadline).
TTFT_BUCKETS = [0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400]
UNFULFILLED_REASONS = ("below_threshold", "host_capacity", "device_capacity", "device_covered", "storage_transfer", "deadline",
                       "anchor_lost", "aux_window_trim", "device_overlap", "cache_admission_shortfall", "dropped")


def handler_for(server):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):
            pass

        def send(self, code, body, content_type="application/json"):
            data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path in ("/health", "/health_generate", "/ready"):
                return self.send(200, {"status": "ok"}) if server.ready else self.send(503, {"status": "loading"})
            if self.path in ("/server_info", "/get_server_info"):
                args = server.args
                return self.send(200, {"model_path": args.model_path, "served_model_name": args.served_model_name, "revision": args.revision,
                                       "page_size": args.page_size, "kv_cache_dtype": args.kv_cache_dtype, "tp_size": args.tp_size,
                                       "pp_size": args.pp_size, "hicache_storage_backend": args.hicache_storage_backend,
                                       "hicache_write_policy": args.hicache_write_policy, "version": "standin",
                                       "hicache_storage_prefetch_policy": args.hicache_storage_prefetch_policy,
                                       "hicache_storage_backend_extra_config": args.hicache_storage_backend_extra_config,
                                       "hicache_io_backend": args.hicache_io_backend, "hicache_mem_layout": args.hicache_mem_layout,
                                       # as SGLang 0.5.23 answers them: its ServerArgs' keys, and the argv after --config's merge
                                       "api_key": None, "admin_api_key": args.admin_api_key, "launch_command": args.launch_command,
                                       "hicache_ratio": args.hicache_ratio, "hicache_size": args.hicache_size,
                                       # the first scheduler's GPU pool (managers/scheduler.py get_init_info), only when modelled
                                       **({"max_total_num_tokens": args.max_total_tokens} if server.tiers else {})})
            if self.path == "/v1/models":
                return self.send(200, {"object": "list", "data": [{"id": server.args.served_model_name, "object": "model"}]})
            if self.path == "/metrics" and server.args.enable_metrics:
                return self.send(200, server.metrics_text(), "text/plain; version=0.0.4")
            if self.path == "/standin/l3_seconds":  # the stand-in's own, not SGLang's: what its tests compare bench with
                return self.send(200, server.l3_seconds)
            if self.path == "/standin/served_ttft":  # the stand-in's own: each request's TTFT as the server saw it
                return self.send(200, server.served_ttft)
            if self.path == "/hicache/storage-backend" and not server.no_backend_api:
                refused = server.admin_refusal(self.headers.get("Authorization"))
                return self.send(*refused) if refused else self.send(200, server.storage_backend())
            self.send(404, {"error": "not found"})

        def do_DELETE(self):
            if self.path != "/hicache/storage-backend" or server.no_backend_api:
                return self.send(404, {"error": "not found"})
            refused = server.admin_refusal(self.headers.get("Authorization"))
            if refused:
                return self.send(*refused)
            with server.lock:  # SGLang detaches only when no request runs or waits
                busy = server.running or server.queued
                if not busy:
                    server.attached = None
            if busy:
                return self.send(400, "Failed to detach HiCache storage backend.\nThere are running or queued requests.\n", "text/plain")
            self.send(200, "HiCache storage backend detached.\n", "text/plain")

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", "0"))) or b"{}")
            if self.path == "/flush_cache":
                refused = server.optional_admin_refusal(self.headers.get("Authorization"))
                if refused:
                    return self.send(*refused)
                with server.gpu:  # the GPU cache and the host pool, not L3 (unified_radix_cache.py _reset_full)
                    server.inserts.clear()
                    if server.tiers:
                        server.tiers.flush()
                return self.send(200, "Cache flushed.\n", "text/plain")
            if self.path == L3_CLEAR:
                # SGLang's L3 clear (entrypoints/http_server.py clear_hicache_storage_backend): on a shared tier NIXL's
                # deletes every deployment's files (sglang#32693). The toolkit never sends it; the stand-in says so
                # loudly in its journal, which the fleet tests read, and clears nothing.
                print(f"sglang-standin: {L3_CLEAR_LOG}", file=sys.stderr, flush=True)
                return self.send(400, "the stand-in does not clear L3\n", "text/plain")
            if self.path != "/v1/chat/completions":
                return self.send(404, {"error": "not found"})
            if not server.ready:
                return self.send(503, {"error": "loading"})
            if body.get("model") not in (None, server.args.served_model_name):
                return self.send(404, {"error": f"model {body.get('model')} not found"})
            prompt = " ".join(m.get("content", "") for m in body.get("messages", []) if isinstance(m.get("content"), str))
            arrived = time.monotonic()
            prompt_tokens, by_source = server.prefill(prompt)
            cached = sum(by_source.values())
            ttft = time.monotonic() - arrived
            server.observe_ttft(ttft, bool(body.get("stream")))
            with server.lock:
                server.served_ttft["warm" if cached else "cold"].append(ttft)
            usage = {"prompt_tokens": prompt_tokens, "completion_tokens": 1, "total_tokens": prompt_tokens + 1}
            if server.args.enable_cache_report:
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            # SGLang's breakdown (output_streamer.py get_cached_tokens_details): none without a cached token; device
            # and host are 0 unless --max-total-tokens models those pools (KvTiers)
            details = None
            if body.get("return_cached_tokens_details") and cached:
                details = {**by_source, "storage_backend": server.attached}
            if body.get("stream"):
                return self.stream(usage, details)
            self.send(200, {"id": "standin", "object": "chat.completion", "model": server.args.served_model_name,
                            "choices": [{"index": 0, "message": {"role": "assistant", "content": "ok"}, "finish_reason": "length"}],
                            "usage": usage, **({"sglext": {"cached_tokens_details": details}} if details else {})})

        def stream(self, usage, details=None):
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Transfer-Encoding", "chunked")
            self.end_headers()
            chunks = [{"choices": [{"index": 0, "delta": {"role": "assistant", "content": "ok"}}]}]
            if details:  # SGLang's sglext chunk: response level, no choices (serving_chat.py), before the usage chunk
                chunks.append({"choices": [], "sglext": {"cached_tokens_details": details}})
            chunks.append({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}], "usage": usage})
            for chunk in chunks:
                line = f"data: {json.dumps(chunk)}\n\n".encode()
                self.wfile.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
            done = b"data: [DONE]\n\n"
            self.wfile.write(f"{len(done):x}\r\n".encode() + done + b"\r\n0\r\n\r\n")

    return Handler


def main(argv):
    args = parse_args(argv)
    config = extra_config(args)
    if os.environ.get("STANDIN_URING_BROKEN") == "1" and args.hicache_storage_backend == "nixl" and str(config.get("use_uring")).lower() in ("true", "1"):
        print("nixl: failed to create backend POSIX: io_uring_queue_init failed: EBADF (Bad file descriptor)", file=sys.stderr, flush=True)
        return 1
    if os.environ.get("STANDIN_EXIT_AT_START") == "1":  # a broken image: the server dies before it listens
        print("sglang-standin: exiting at start, as STANDIN_EXIT_AT_START asks", file=sys.stderr, flush=True)
        return 1
    server = Server(args)
    print(f"sglang-standin: serving {args.served_model_name} on {args.host}:{args.port}, L3 {server.l3}", flush=True)
    http = ThreadingHTTPServer((args.host, args.port), handler_for(server), bind_and_activate=False)
    http.request_queue_size = 2048  # uvicorn's backlog; the default 5 resets a burst of 64 connections
    http.server_bind()
    http.server_activate()
    # SIGTERM and SIGINT end the server, as SGLang's do (uvicorn's handlers; entrypoints/http_server.py wires them itself
    # where its server installs none). Without a handler a container's PID 1 ignores SIGTERM, so `docker stop -t 60`
    # waited its whole 60 s and then killed the stand-in, where SGLang stops. At once here, as the default
    # action did outside a container: the role drains requests before a stop, not the signal.
    def stop(signum, frame):
        print(f"sglang-standin: stopping on {signal.Signals(signum).name}", flush=True)
        os._exit(0)

    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    http.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
