"""Prometheus text from SGLang's /metrics: sums of the series verify and bench read (reference §7)."""

from __future__ import annotations

import re
from collections.abc import Callable

BACKUPED = "sglang:backuped_tokens_total"
STORAGE_HITS = "sglang:storage_prefetch_hit_tokens_total"
CACHED = "sglang:cached_tokens_total"
BACKUP_DROPPED = "sglang:hicache_backup_dropped_tokens_total"
PREFETCH_UNFULFILLED = "sglang:storage_prefetch_unfulfilled_tokens_total"

# Which ranks of one server count the same tokens (read once: rank 0) and which count different ones (summed).
# SGLang's StorageMetricsCollector labels (python/sglang/srt/mem_cache/unified_cache/storage_attachment.py
# _resolve_metrics_collector, 0.5.23 lines 330-338, the same in 0.5.21): storage_backend, tp_rank, dp_rank, pp_rank,
# pp_size, attn_cp_rank, attn_cp_size, plus --extra-metric-labels. Every process of a server logs its own series:
# - tp_rank, pp_rank, attn_cp_rank: the same tokens. The ranks of one tensor-, pipeline- and attention-context-parallel
#   group hold shards (heads, layers, slices of a page) of the same pages and agree on every prefetch
#   (managers/cache_controller.py _create_sync_groups: the attn_cp, attn_tp and pp groups; mem_cache/unified_radix_cache.py
#   2443: "All PP/TP ranks will get the same min_completed_tokens"), and each counts the page's tokens: summing them
#   counts a token TP x PP x CP times. MLA servers write from one rank only (hicache_storage.py is_storage_writer): rank 0.
# - dp_rank: different tokens. With DP attention it is the attention-DP rank (cache_controller.py _generate_storage_config,
#   757-760), each with its own scheduler and radix tree serving other requests: summed. Without DP attention every DP
#   replica reports dp_rank 0, and prometheus_client's multiprocess collector already adds up identical series.
# - storage_backend, reason, extra labels: different tokens, summed.
# The scheduler's gauges (sglang:num_running_reqs, ...) carry tp_rank and pp_rank too, but only attention-TP rank 0 of
# each attention-CP group logs them (observability/metrics_collector.py 1361, is_stats_logging_rank) while every
# pipeline stage schedules the same requests (managers/scheduler_pp_mixin.py event_loop_pp, "Each stage runs in the same
# order"): they are read at pp_rank 0 (SCHEDULER_ONCE) and summed over tp_rank (with DP attention each DP group's rank 0).
REPLICA_RANKS = ("tp_rank", "pp_rank", "attn_cp_rank")
# The same in PromQL: a series without the label (an older SGLang) matches too.
STORAGE_ONCE = ",".join(f'{label}=~"0|"' for label in REPLICA_RANKS)
SCHEDULER_ONCE = 'pp_rank=~"0|"'

_SAMPLE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)')
_LABEL = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def parse(text: str) -> list[tuple[str, dict[str, str], float]]:
    samples = []
    for line in text.splitlines():
        match = _SAMPLE.match(line)
        if match is None or line.startswith("#"):
            continue
        try:
            value = float(match["value"])
        except ValueError:
            continue
        samples.append((match["name"], dict(_LABEL.findall(match["labels"] or "")), value))
    return samples


def counted_once(labels: dict[str, str]) -> bool:
    """Whether a series is the one that counts its tokens: rank 0 of every rank that repeats the same tokens
    (REPLICA_RANKS; a label that is absent is rank 0)."""
    return all(labels.get(rank, "0") == "0" for rank in REPLICA_RANKS)


def total(text: str | None, name: str, **labels: str) -> float | None:
    """Sum of a metric's series that carry `labels`, each token counted once; None when the metric is absent.

    The ranks that repeat the same tokens (TP, PP and attention-CP ranks: REPLICA_RANKS) are read at rank 0; the
    others (DP ranks, backends, reasons) are summed.
    """
    if not text:
        return None
    found = [(lab, value) for metric, lab, value in parse(text)
             if metric == name and all(lab.get(k) == v for k, v in labels.items())]
    if not found:
        return None
    return sum(value for lab, value in found if counted_once(lab))


def delta(after: str | None, before: str | None, read: Callable[[str | None], float | None]) -> float | None:
    """How much `read` grew between two /metrics texts; None when the later one lacks the metric."""
    a, b = read(after), read(before)
    return None if a is None else a - (b or 0)


def storage_hits(text: str | None) -> float | None:
    """Tokens served from L3: the scheduler's storage-sourced cached tokens, else the prefetch hits."""
    value = total(text, CACHED, cache_source="storage")
    return value if value is not None else total(text, STORAGE_HITS)
