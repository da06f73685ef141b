"""metrics.total counts each token once across the ranks that repeat it and sums the ranks that hold other tokens.

The samples carry the label sets SGLang gives its storage metrics: python/sglang/srt/mem_cache/unified_cache/
storage_attachment.py, _resolve_metrics_collector (sglang 0.5.23 lines 330-338; the same keys in 0.5.21 lines 280-288):
{storage_backend, tp_rank, dp_rank, pp_rank, pp_size, attn_cp_rank, attn_cp_size}, in that order, as prometheus_client
prints them; the reasons of sglang:storage_prefetch_unfulfilled_tokens_total come from observability/metrics_collector.py
(StorageMetricsCollector, 0.5.23 lines 2232-2262) and the tokenizer's cached_tokens_total labels from its
tokenizer_metric_labels (model_name, engine_type) plus cache_source (lines 1804-1819, 1934-1938)."""

from __future__ import annotations

import pytest
from helpers import server, storage

from hicachectl.ops import metrics


@pytest.mark.parametrize("tp,pp,cp", [(1, 1, 1), (2, 1, 1), (1, 2, 1), (2, 2, 1), (1, 1, 2), (4, 2, 2)])
def test_the_ranks_of_one_model_replica_count_a_token_once(tp, pp, cp):
    """TP, PP and attention-CP ranks hold shards of the same pages and agree on every prefetch (cache_controller.py
    _create_sync_groups, unified_radix_cache.py 2443 "All PP/TP ranks will get the same min_completed_tokens")."""
    text = server(metrics.BACKUPED, 256, tp_size=tp, pp_size=pp, cp_size=cp)
    assert len(metrics.parse(text)) == tp * pp * cp
    assert metrics.total(text, metrics.BACKUPED) == 256


def test_pipeline_stages_do_not_double_the_tokens_written():
    """Issue 23: under PP 2, tp_rank 0 of each stage reports the page's tokens; rank 0 of TP alone read 512."""
    text = storage(metrics.BACKUPED, 256, pp=0, pp_size=2) + storage(metrics.BACKUPED, 256, pp=1, pp_size=2)
    assert metrics.total(text, metrics.BACKUPED) == 256


def test_dp_attention_ranks_hold_other_requests_and_are_summed():
    """With DP attention dp_rank is the attention-DP rank (cache_controller.py _generate_storage_config 757-760): each
    has its own scheduler and radix tree, so its tokens are others'."""
    text = server(metrics.BACKUPED, 0, tp_size=2, pp_size=2, dp_size=2, per_dp=[100, 30])
    assert metrics.total(text, metrics.BACKUPED) == 130


def test_reasons_and_backends_are_summed_and_a_label_selects():
    text = (storage(metrics.PREFETCH_UNFULFILLED, 5, reason="deadline") + storage(metrics.PREFETCH_UNFULFILLED, 5, tp=1, reason="deadline")
            + storage(metrics.PREFETCH_UNFULFILLED, 7, reason="host_capacity") + storage(metrics.PREFETCH_UNFULFILLED, 7, pp=1, pp_size=2, reason="host_capacity")
            + storage(metrics.BACKUPED, 10, backend="file") + storage(metrics.BACKUPED, 4, backend="nixl"))  # re-attached to another backend
    assert metrics.total(text, metrics.PREFETCH_UNFULFILLED) == 12
    assert metrics.total(text, metrics.PREFETCH_UNFULFILLED, reason="deadline") == 5
    assert metrics.total(text, metrics.BACKUPED) == 14


def test_series_without_rank_labels_are_summed_and_an_absent_metric_is_none():
    tokenizer = ('sglang:cached_tokens_total{model_name="m",engine_type="unified",cache_source="storage"} 40\n'
                 'sglang:cached_tokens_total{model_name="m",engine_type="unified",cache_source="device"} 8\n')
    assert metrics.total(tokenizer, metrics.CACHED) == 48
    assert metrics.storage_hits(tokenizer) == 40
    assert metrics.total('sglang:backuped_tokens_total{storage_backend="file"} 3\n', metrics.BACKUPED) == 3  # before the rank labels
    assert metrics.total(tokenizer, metrics.BACKUPED) is None and metrics.total("", metrics.BACKUPED) is None


def test_the_promql_matchers_say_the_same_as_the_python():
    assert metrics.STORAGE_ONCE == 'tp_rank=~"0|",pp_rank=~"0|",attn_cp_rank=~"0|"'
    assert metrics.SCHEDULER_ONCE == 'pp_rank=~"0|"'
    for rank in metrics.REPLICA_RANKS:
        assert not metrics.counted_once({rank: "1"}) and metrics.counted_once({rank: "0"}) and metrics.counted_once({})
    assert metrics.counted_once({"dp_rank": "3", "tp_rank": "0"})
